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
from types import MappingProxyType
from typing import TypeAlias

from pydantic import BaseModel, ConfigDict

from trimtab._permissions import APPROVED_FOR_SESSION
from trimtab._window import Projection, estimate_tokens, head
from trimtab.events import (
    AbortEvent,
    AssistantMessageEvent,
    AssistantTurnEndEvent,
    AssistantTurnStartEvent,
    AssistantUsageEvent,
    Event,
    ExternalToolCompletedEvent,
    ExternalToolRequestedData,
    ExternalToolRequestedEvent,
    Message,
    PermissionCompletedEvent,
    PermissionRequestedData,
    PermissionRequestedEvent,
    SessionCompactionCompleteEvent,
    SessionConfigData,
    SessionContextClearedEvent,
    SessionErrorEvent,
    SessionMode,
    SessionModeChangedEvent,
    SessionModelChangeEvent,
    SessionResumeEvent,
    SessionStartEvent,
    SessionTitleChangedEvent,
    SessionTruncatedEvent,
    ToolExecutionCompleteEvent,
    ToolExecutionStartData,
    ToolExecutionStartEvent,
    ToolOutcome,
    UserMessageEvent,
)
from trimtab.providers import Usage

__all__ = ["Batch", "SessionState", "StateSnapshot", "Wait", "state_of"]

Wait: TypeAlias = PermissionRequestedData | ExternalToolRequestedData
"""What an unfinished call waits for from outside its run: a permission decision, or the
result of a call a client runs."""

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

    def ends_run(self) -> bool | None:
        """Whether the run ends with this turn: the model answered without calls, a terminal
        call succeeded (T1, T3) or a call was rejected (O2), and no clear committed (C8).
        None when the model never answered: an error or an abort follows and ends the run."""
        if self.calls is None:
            return None
        if self.cleared:
            return False
        if not self.calls or "rejected" in self.outcomes.values():
            return True
        return any(self.outcomes.get(call_id) == "success" for call_id in self.terminal)


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
    tokens: tuple[int, int] | None
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
    tokens: tuple[int, int] | None = field(default=None, repr=False)
    """Input and output tokens summed over every `assistant.usage`; None before the first."""
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

    def apply(self, event: Event) -> bool:
        """Advance the state by one persisted event; True when the event ended a run."""
        self.event_count += 1
        self.last_id = event.id
        match event:
            case SessionStartEvent():
                self.config = _shared(event.data.config)
            case SessionResumeEvent() if event.data.config is not None:
                self.config = _shared(event.data.config)
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
                self.run_id = self.batch = self.pending_seed = None
            case AssistantUsageEvent():
                used_in, used_out = self.tokens or (0, 0)
                self.tokens = (
                    used_in + (event.data.input_tokens or 0),
                    used_out + (event.data.output_tokens or 0),
                )
            case PermissionCompletedEvent() if event.data.result.kind == APPROVED_FOR_SESSION:
                start = self.unfinished_calls.get(event.data.tool_call_id or "")
                if start is not None:
                    self.approved_tools |= {start.tool_name}
            case _:
                pass
        if self.unfinished_calls:
            self._track_waits(event)
        return self._track_run(event)

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
            case UserMessageEvent() if event.data.source == "context_cleared":
                self.seed_recorded = True
            case UserMessageEvent() if event.data.source != "hook":  # (a note: D13)
                self.run_id = event.data.message_id or event.id
            case AssistantTurnStartEvent():
                self.turns += 1
                self.open_turn, self.batch = event.data.turn_id, Batch()
            case AssistantMessageEvent():
                self.pending_seed = None
                if batch is not None:
                    requests = event.data.tool_requests or ()
                    batch.calls = {r.tool_call_id: r.name for r in requests}
            case ToolExecutionStartEvent():
                call_id = event.data.tool_call_id
                self.unfinished_calls = {**self.unfinished_calls, call_id: event.data}
                if batch is not None and event.data.is_terminal:
                    batch.terminal = [*batch.terminal, call_id]
            case ToolExecutionCompleteEvent():
                self._call_ended(event.data.tool_call_id)
                if batch is not None:
                    batch.outcomes[event.data.tool_call_id] = event.data.outcome
            case SessionContextClearedEvent() if batch is not None:
                batch.cleared = True
            case AssistantTurnEndEvent():
                self.open_turn, self.batch = None, None
                if batch is not None and batch.ends_run():
                    return self._end_run()
            case SessionErrorEvent() if event.data.logged:
                pass  # a note written with `Session.log`, not the end of a run
            case SessionErrorEvent() | AbortEvent():
                return self._end_run()
            case _:
                pass
        return False

    def _call_ended(self, call_id: str) -> None:
        if call_id in self.unfinished_calls:
            calls = {k: v for k, v in self.unfinished_calls.items() if k != call_id}
            self.unfinished_calls = calls or _NO_CALLS
        if call_id in self.waiting:
            waits = {k: w for k, w in self.waiting.items() if k != call_id}
            self.waiting = waits or _NO_WAITS

    def _end_run(self) -> bool:
        ended = self.run_id is not None
        self.run_id = self.batch = self.pending_seed = None
        return ended

    def _rebase(self, base: tuple[Message, ...]) -> None:
        self.base, self.projection = base, Projection()
        self.base_tokens = estimate_tokens(base)

    @property
    def usage(self) -> Usage:
        """Tokens used by every model call of the session (spec C9: survives clears)."""
        if self.tokens is None:
            return Usage()
        return Usage(input_tokens=self.tokens[0], output_tokens=self.tokens[1])

    def window(self) -> list[Message]:
        """The messages of the next model call: system, developer, the start context (D13),
        then the conversation."""
        return [*self._fixed(), *self.base, *self.projection.messages()]

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
            tokens=self.tokens,
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
            tokens=snapshot.tokens,
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
