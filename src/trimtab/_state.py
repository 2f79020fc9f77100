"""`SessionState`: everything a session knows, rebuilt from its log one event at a time (P1).

Resume is replay, so nothing here may depend on anything but the events applied: the window
(through its `Projection`), the configuration, usage, the approvals given for the session,
and where the log stands in its current run: the calls a crash left unfinished, a turn left
open, a committed clear whose seed has not run, and whether a run is in progress at all.
A runtime that only follows a session (spec R1) learns from this when the owner's run ended,
even where the owner's ephemeral `session.idle` cannot reach it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import TypeAlias

from pydantic import BaseModel, ConfigDict
from pydantic.dataclasses import dataclass as pydantic_dataclass

from trimtab import _calibration
from trimtab._permissions import APPROVED_FOR_SESSION
from trimtab._window import Projection, estimate_tokens, head
from trimtab.events import (
    AbortEvent,
    AssistantMessageEvent,
    AssistantTurnEndEvent,
    AssistantTurnStartEvent,
    AssistantUsageData,
    AssistantUsageEvent,
    Budget,
    Event,
    ExternalToolCompletedEvent,
    ExternalToolRequestedData,
    ExternalToolRequestedEvent,
    Message,
    OutputSpec,
    PermissionCompletedEvent,
    PermissionRequestedData,
    PermissionRequestedEvent,
    SessionCompactionCompleteEvent,
    SessionConfigData,
    SessionContextClearedEvent,
    SessionErrorEvent,
    SessionLimitsChangedEvent,
    SessionMode,
    SessionModeChangedEvent,
    SessionModelChangeEvent,
    SessionPrunedEvent,
    SessionResumeEvent,
    SessionStartEvent,
    SessionTitleChangedEvent,
    SessionTruncatedEvent,
    SessionWarningEvent,
    Spending,
    ToolExecutionCompleteEvent,
    ToolExecutionStartData,
    ToolExecutionStartEvent,
    ToolOutcome,
    UserMessageEvent,
)
from trimtab.providers import Usage

__all__ = [
    "RUN_BUDGET",
    "SESSION_BUDGET",
    "Batch",
    "CurrentRun",
    "SessionState",
    "StateSnapshot",
    "Wait",
    "state_of",
]

RUN_BUDGET = "run_budget"
SESSION_BUDGET = "session_budget"
"""The `warning_type` of the one `session.warning` a budget's `warn_at` brings (spec U4)."""

_SAME_RUN = frozenset({"agent_stop", "output"})
"""Sources of user messages that go on with the run in progress, under its message id."""

Wait: TypeAlias = PermissionRequestedData | ExternalToolRequestedData
"""What an unfinished call waits for from outside its run: a permission decision, or the
result of a call a client runs."""

_ASIDE = frozenset({"hook", "immediate"})
"""Sources of user messages that go on with the run in progress, which keeps its message id:
a hook's note (D13), a steering message (X6)."""

_NOTHING: frozenset[str] = frozenset()
_NO_CALLS: Mapping[str, ToolExecutionStartData] = MappingProxyType({})
_NO_WAITS: Mapping[str, Wait] = MappingProxyType({})
"""Shared empties: most sessions have no approvals and no unfinished calls."""


class Batch(BaseModel):
    """The open turn's tool calls and how they ended so far: what decides, once the turn
    ends, whether its run goes on."""

    model_config = ConfigDict(defer_build=True)

    calls: dict[str, str] | None = None
    """Call id -> tool name, once the turn's `assistant.message` is logged (None before)."""
    outcomes: dict[str, ToolOutcome] = {}
    terminal: list[str] = []
    """The calls of terminal tools (their `tool.execution_start` says so)."""
    cleared: bool = False
    """A clear committed in this turn: the seeded run follows (spec C8)."""
    expects_output: bool = False
    """The run must end with a typed result (spec OUT1)."""
    answered: bool = False
    """The reply is the run's result (native structured output, OUT6)."""

    def ends_run(self) -> bool | None:
        """Whether the run ends with this turn: the model answered without calls (with the
        result, when the run must give one: OUT3), a terminal call succeeded (T1, T3) or a
        call was rejected (O2), and no clear committed (C8). None when the model never
        answered: an error or an abort follows and ends the run."""
        if self.calls is None:
            return None
        if self.cleared:
            return False
        if not self.calls:
            return self.answered or not self.expects_output
        if "rejected" in self.outcomes.values():
            return True
        return any(self.outcomes.get(call_id) == "success" for call_id in self.terminal)


@pydantic_dataclass(slots=True, config=ConfigDict(defer_build=True))
class CurrentRun:
    """The run in progress as its budget and its typed result see it (spec U2, OUT3)."""

    started: datetime
    """When its message was logged: its wall time counts from there."""
    output: OutputSpec | None = None
    budget: Budget | None = None
    spent: Spending = field(default_factory=Spending)
    invalid_outputs: int = 0
    """Invalid results so far: output calls with invalid arguments, replies without one."""
    output_error: str | None = None
    """Why the latest output call's result was invalid."""
    warned: bool = False
    """Its budget's `warn_at` was crossed (the one warning is logged)."""


class StateSnapshot(BaseModel):
    """A `SessionState` as a store keeps it (`Store.save_snapshot`), so that opening a session costs
    O(window + events since), not O(log). Every field is a field of the state."""

    model_config = ConfigDict(defer_build=True)

    event_count: int
    last_id: str | None
    config: SessionConfigData
    epoch: int
    turns: int
    conversation: list[Message]
    spent: Spending
    epoch_spent: Spending
    runs_seconds: float
    budget_warned: bool
    run: CurrentRun | None
    unfinished_calls: list[ToolExecutionStartData]
    open_turn: str | None
    run_id: str | None = None
    batch: Batch | None = None
    pending_seed: str | None
    seed_recorded: bool
    approved_tools: list[str] = []
    name: str | None = None
    name_auto: bool = False
    mode: SessionMode = "interactive"
    ratios: dict[str, tuple[float, float]] = {}


@dataclass(slots=True)
class SessionState:
    """What a session needs in memory, rebuilt from its log (resume is replay, spec P1)."""

    config: SessionConfigData = field(default_factory=SessionConfigData)
    event_count: int = 0
    last_id: str | None = None
    epoch: int = 0
    turns: int = 0
    base: tuple[Message, ...] = ()
    """The conversation the window starts from (set by compaction and truncation)."""
    base_tokens: int = field(default=0, repr=False, compare=False)
    """`estimate_tokens(base)` (see `window_tokens`)."""
    projection: Projection = field(default_factory=Projection, repr=False, compare=False)
    """The conversation since the base."""
    spent: Spending = field(default_factory=Spending, repr=False)
    """Every `assistant.usage` summed (spec U2; a clear keeps it, C9)."""
    epoch_spent: Spending = field(default_factory=Spending, repr=False)
    """The same since the latest clear."""
    runs_seconds: float = 0.0
    """The wall time of the runs that ended (spec U3: a session's `wall_seconds`)."""
    budget_warned: bool = False
    """The session budget's `warn_at` was crossed since the budget was last set (U4)."""
    run: CurrentRun | None = None
    """The run in progress's spending and typed result; None between runs."""
    unfinished_calls: Mapping[str, ToolExecutionStartData] = field(
        default_factory=lambda: _NO_CALLS
    )
    """Tool calls started but never completed (a crash mid-call), by call id; replaced on
    change, so that the empty one is shared."""
    waiting: Mapping[str, Wait] = field(default_factory=lambda: _NO_WAITS)
    """Unfinished calls whose announced question (a `permission.requested`, an
    `external_tool.requested`) has no answer logged yet, by call id: a run parked on an
    engine waits on these (spec EN5). Never held in a snapshot, which is only kept when no
    call is unfinished."""
    open_turn: str | None = None
    """The id of a turn started and not ended (a crash mid-turn)."""
    run_id: str | None = None
    """The message id of the run in progress (its `send`); None between runs. A run ends
    with the turn that ends it (`Batch.ends_run`), a `session.error` or an `abort`."""
    batch: Batch | None = None
    """The open turn's calls and outcomes."""
    pending_seed: str | None = None
    """A committed clear's prompt that no seeded run has answered yet (spec C10)."""
    seed_recorded: bool = False
    """Whether that seed's `user.message` is already in the log."""
    approved_tools: frozenset[str] = _NOTHING
    """Tools approved for the rest of the session (`approve-for-session`)."""
    name: str | None = None
    """The session's friendly name, as last set (`session.title_changed`)."""
    name_auto: bool = False
    """Whether that name came from a summary (`set_auto_name`), not from the user."""
    mode: SessionMode = "interactive"
    """The agent's mode, as last set (`session.mode_changed`)."""
    ratios: _calibration.Ratios = _calibration.NONE
    """What each model counts per token of the window's estimate (spec X1)."""

    def apply(self, event: Event) -> bool:
        """Advance the state by one persisted event; True when the event ended a run."""
        if isinstance(event, SessionPrunedEvent):
            return self._pruned(event)
        self.event_count += 1
        self.last_id = event.id
        match event:
            case SessionStartEvent():
                self.config = _shared(event.data.config)
            case SessionResumeEvent() if event.data.config is not None:
                self.budget_warned &= event.data.config.budget == self.config.budget
                self.config = _shared(event.data.config)
            case SessionModelChangeEvent() | SessionTitleChangedEvent() | SessionModeChangedEvent():
                self._setting(event)
            case UserMessageEvent() | AssistantMessageEvent() | ToolExecutionCompleteEvent():
                self.projection.add(event)
            case SessionContextClearedEvent():
                self.epoch += 1
                self._rebase(())
                self.pending_seed, self.seed_recorded = event.data.initial_message, False
            case SessionCompactionCompleteEvent() if event.data.success:
                self._rebase(tuple(event.data.base))
            case SessionTruncatedEvent():
                self._rebase(tuple(event.data.base))
                # Runs only between runs: what it finds in progress is a run a crash left,
                # which the rewound window no longer holds. It is over (it had no idle).
                self.run_id = self.batch = self.pending_seed = self.run = None
            case AssistantUsageEvent():
                self._calibrate(event)
            case SessionWarningEvent() if event.data.warning_type == "context_length":
                self._calibrate(event)
            case PermissionCompletedEvent() if event.data.result.kind == APPROVED_FOR_SESSION:
                start = self.unfinished_calls.get(event.data.tool_call_id or "")
                if start is not None:
                    self.approved_tools |= {start.tool_name}
            case _:
                pass
        self._account(event)
        if self.unfinished_calls:
            self._track_waits(event)
        return self._track_run(event)

    def _setting(
        self, event: SessionModelChangeEvent | SessionTitleChangedEvent | SessionModeChangedEvent
    ) -> None:
        """A setting the host changed: the model (K1), the name (K2), the mode (K7)."""
        match event:
            case SessionModelChangeEvent():
                change = {
                    "model": event.data.new_model,
                    "reasoning_effort": event.data.reasoning_effort,
                }
                self.config = _shared(self.config.model_copy(update=change))
            case SessionTitleChangedEvent():
                self.name, self.name_auto = event.data.title, bool(event.data.auto)
            case SessionModeChangedEvent():
                self.mode = event.data.new_mode

    def _account(self, event: Event) -> None:
        """Follow what the session spends and may spend (spec U2-U4)."""
        match event:
            case AssistantUsageEvent():
                self.spent = self.spent.plus(event.data)
                self.epoch_spent = self.epoch_spent.plus(event.data)
                if self.run is not None:
                    self.run.spent = self.run.spent.plus(event.data)
            case SessionContextClearedEvent():
                self.epoch_spent = Spending()
            case SessionLimitsChangedEvent():
                update = {"budget": event.data.budget}
                self.config = _shared(self.config.model_copy(update=update))
                self.budget_warned = False
            case SessionWarningEvent() if event.data.warning_type == SESSION_BUDGET:
                self.budget_warned = True
            case SessionWarningEvent() if event.data.warning_type == RUN_BUDGET:
                if self.run is not None:
                    self.run.warned = True
            case _:
                pass

    def _track_waits(self, event: Event) -> None:
        """Follow the questions the unfinished calls wait on (`waiting`)."""
        match event:
            case PermissionRequestedEvent():
                call_id = event.data.permission_request.tool_call_id
                if call_id is not None and call_id in self.unfinished_calls:
                    self.waiting = {**self.waiting, call_id: event.data}
            case ExternalToolRequestedEvent() if event.data.tool_call_id in self.unfinished_calls:
                self.waiting = {**self.waiting, event.data.tool_call_id: event.data}
            case PermissionCompletedEvent() | ExternalToolCompletedEvent():
                answered = event.data.request_id
                if any(wait.request_id == answered for wait in self.waiting.values()):
                    waits = {k: w for k, w in self.waiting.items() if w.request_id != answered}
                    self.waiting = waits or _NO_WAITS
            case _:
                pass

    def _track_run(self, event: Event) -> bool:
        """Follow the run in progress (spec E1, P3); True when `event` ended it."""
        batch = self.batch
        match event:
            case UserMessageEvent():
                self._message(event)
            case AssistantTurnStartEvent():
                self.turns += 1
                expects = self.run is not None and self.run.output is not None
                self.open_turn, self.batch = event.data.turn_id, Batch(expects_output=expects)
            case AssistantMessageEvent():
                self.pending_seed = None
                self._answered(event)
                if batch is not None:
                    requests = event.data.tool_requests or ()
                    batch.calls = {r.tool_call_id: r.name for r in requests}
                    batch.answered = event.data.output is not None
            case ToolExecutionStartEvent():
                call_id = event.data.tool_call_id
                self.unfinished_calls = {**self.unfinished_calls, call_id: event.data}
                if batch is not None and event.data.is_terminal:
                    batch.terminal = [*batch.terminal, call_id]
            case ToolExecutionCompleteEvent():
                self._call_ended(event.data.tool_call_id)
                self._output_call(event)
                if batch is not None:
                    batch.outcomes[event.data.tool_call_id] = event.data.outcome
            case SessionContextClearedEvent() if batch is not None:
                batch.cleared = True
            case AssistantTurnEndEvent():
                self.open_turn, self.batch = None, None
                if batch is not None and batch.ends_run():
                    return self._end_run(event.timestamp)
            case SessionErrorEvent() if event.data.logged:
                pass  # a note written with `Session.log`, not the end of a run
            case SessionErrorEvent() | AbortEvent():
                return self._end_run(event.timestamp)
            case _:
                pass
        return False

    def _pruned(self, event: SessionPrunedEvent) -> bool:
        """The state the events a prune removed folded to (spec X8), at the marker's place;
        True when that ended the run this state had in progress (a reader behind the cut)."""
        running = self.run_id
        restored = SessionState.restore(StateSnapshot.model_validate(event.data.state))
        for name in SessionState.__dataclass_fields__:
            setattr(self, name, getattr(restored, name))
        self.event_count, self.last_id = event.data.position, event.id
        return running is not None and self.run_id != running

    def _message(self, event: UserMessageEvent) -> None:
        """A user message: an input starts its run; a clear's seed is recorded, and starts a
        run when the host cleared between runs (X4); a hook's note (D13) and a steering
        message (X6) go on with the run in progress."""
        source = event.data.source
        if source == "context_cleared":
            self.seed_recorded = True
            if self.run_id is None:
                self._run_message(event)
        elif source not in _ASIDE:
            self._run_message(event)

    def _calibrate(self, event: AssistantUsageEvent | SessionWarningEvent) -> None:
        """Fold a model call's size, or a refusal as too long, into the model's ratio (X1)."""
        data = event.data
        if isinstance(data, AssistantUsageData):
            self.ratios = _calibration.observed(
                self.ratios, data.model, data.estimated_tokens, data.input_tokens
            )
        else:
            self.ratios = _calibration.overflowed(
                self.ratios, data.model or "", data.estimated_tokens, data.token_limit
            )

    def _run_message(self, event: UserMessageEvent) -> None:
        """A message that starts a run, or goes on with the run in progress (an `agentStop`
        hook's, D10; a result's retry, OUT3)."""
        data = event.data
        if self.run is None or data.source not in _SAME_RUN:
            self.run = CurrentRun(started=event.timestamp, output=data.output, budget=data.budget)
        self.run_id = data.message_id or event.id

    def _answered(self, event: AssistantMessageEvent) -> None:
        """A reply of a run that must give a typed result with neither a call nor the result
        is an invalid result (spec OUT3)."""
        run = self.run
        if run is not None and run.output is not None:
            if not event.data.tool_requests and event.data.output is None:
                run.invalid_outputs += 1
                run.output_error = None

    def _output_call(self, event: ToolExecutionCompleteEvent) -> None:
        """A call of the run's output tool whose arguments are not a valid result (OUT3)."""
        run, data = self.run, event.data
        if run is None or run.output is None or data.outcome != "invalid_arguments":
            return
        if data.tool_name == run.output.tool_name:
            run.invalid_outputs += 1
            run.output_error = data.error.message if data.error is not None else None

    def _call_ended(self, call_id: str) -> None:
        if call_id in self.unfinished_calls:
            calls = {k: v for k, v in self.unfinished_calls.items() if k != call_id}
            self.unfinished_calls = calls or _NO_CALLS
        if call_id in self.waiting:
            waits = {k: w for k, w in self.waiting.items() if k != call_id}
            self.waiting = waits or _NO_WAITS

    def _end_run(self, at: datetime) -> bool:
        ended = self.run_id is not None
        if self.run is not None:
            self.runs_seconds += max(0.0, (at - self.run.started).total_seconds())
        self.run_id = self.batch = self.pending_seed = self.run = None
        return ended

    def seconds(self, now: datetime) -> tuple[float, float]:
        """The wall time of the run in progress (0 between runs) and of all runs (U3)."""
        run = self.run
        current = max(0.0, (now - run.started).total_seconds()) if run is not None else 0.0
        return current, self.runs_seconds + current

    def _rebase(self, base: tuple[Message, ...]) -> None:
        self.base, self.projection = base, Projection()
        self.base_tokens = estimate_tokens(base)

    @property
    def usage(self) -> Usage:
        """Tokens used by every model call of the session (spec C9: survives clears)."""
        spent = self.spent
        if not spent.model_calls:
            return Usage()
        return Usage(
            input_tokens=spent.input_tokens,
            output_tokens=spent.output_tokens,
            cache_read_tokens=spent.cache_read_tokens or None,
        )

    def window(self) -> list[Message]:
        """The messages of the next model call: system, developer, the start context (D13),
        then the conversation."""
        return [*self._fixed(), *self.base, *self.projection.messages()]

    def token_ratio(self, model: str) -> float:
        """What `model` counts per token of the window's estimate (spec X1)."""
        return _calibration.ratio(self.ratios, model)

    def window_tokens(self) -> int:
        """`estimate_tokens(self.window())`, without a pass over the conversation: every
        model call asks for it (compaction's threshold, `session.usage_info`)."""
        return estimate_tokens(self._fixed()) + self.base_tokens + self.projection.tokens()

    def _fixed(self) -> tuple[Message, ...]:
        """The window's messages that come from the configuration, not the conversation."""
        config = self.config
        return (
            *head(config.system_message, tuple(config.developer_messages)),
            *_start(config.start_context),
        )

    def conversation(self) -> list[Message]:
        """The window without its system and developer messages."""
        return [*self.base, *self.projection.messages()]

    def messages_cleared(self) -> int:
        """What a clear staged now reports (spec C5): the conversation's messages, the
        assistant message that asked for the clearing call included."""
        return len(self.base) + self.projection.count()

    def snapshot(self) -> StateSnapshot:
        """This state as data; its conversation becomes the base of the one restored."""
        return StateSnapshot(
            event_count=self.event_count,
            last_id=self.last_id,
            config=self.config,
            epoch=self.epoch,
            turns=self.turns,
            conversation=self.conversation(),
            spent=self.spent,
            epoch_spent=self.epoch_spent,
            runs_seconds=self.runs_seconds,
            budget_warned=self.budget_warned,
            run=self.run,
            unfinished_calls=list(self.unfinished_calls.values()),
            open_turn=self.open_turn,
            run_id=self.run_id,
            batch=self.batch,
            pending_seed=self.pending_seed,
            seed_recorded=self.seed_recorded,
            approved_tools=sorted(self.approved_tools),
            name=self.name,
            name_auto=self.name_auto,
            mode=self.mode,
            ratios=_calibration.as_mapping(self.ratios),
        )

    @classmethod
    def restore(cls, snapshot: StateSnapshot) -> SessionState:
        """The state a snapshot describes; apply the events after it to bring it up to date."""
        base = tuple(snapshot.conversation)
        return cls(
            config=_shared(snapshot.config),
            event_count=snapshot.event_count,
            last_id=snapshot.last_id,
            epoch=snapshot.epoch,
            turns=snapshot.turns,
            base=base,
            base_tokens=estimate_tokens(base),
            spent=snapshot.spent,
            epoch_spent=snapshot.epoch_spent,
            runs_seconds=snapshot.runs_seconds,
            budget_warned=snapshot.budget_warned,
            run=snapshot.run,
            unfinished_calls={c.tool_call_id: c for c in snapshot.unfinished_calls} or _NO_CALLS,
            open_turn=snapshot.open_turn,
            run_id=snapshot.run_id,
            batch=snapshot.batch,
            pending_seed=snapshot.pending_seed,
            seed_recorded=snapshot.seed_recorded,
            approved_tools=frozenset(snapshot.approved_tools) or _NOTHING,
            name=snapshot.name,
            name_auto=snapshot.name_auto,
            mode=snapshot.mode,
            ratios=_calibration.from_mapping(snapshot.ratios),
        )


_configs: weakref.WeakValueDictionary[str, SessionConfigData] = weakref.WeakValueDictionary()


def _shared(config: SessionConfigData) -> SessionConfigData:
    """An equal configuration already in memory, if any, else `config`.

    Configurations are immutable and most sessions of one process share theirs (same model,
    prompt and tools): one copy serves them all.
    """
    key = config.model_dump_json()
    shared = _configs.get(key)
    if shared is None:
        _configs[key] = shared = config
    return shared


def state_of(events: Iterable[Event]) -> SessionState:
    """The state of a whole log (or of its first events): its replay."""
    state = SessionState()
    for event in events:
        state.apply(event)
    return state


def _start(context: str | None) -> tuple[Message, ...]:
    """The `sessionStart` hook's context as the window holds it (spec D13)."""
    return (Message(role="user", content=context),) if context else ()
