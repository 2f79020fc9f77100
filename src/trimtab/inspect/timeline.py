"""`Timeline`: a session's log as a person reads it, folded one event at a time.

Runs, the model calls (turns) of each run with their tool calls, and the operations that
changed the context (clear, compaction, truncation) or the session (start, fork, resume, error,
abort). Also the figures the session page charts: token usage per model call, and the context
segments (epochs) that the window page shows as columns. Folding is incremental, so that a
session followed by the inspector costs only its new events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal, TypeAlias

from trimtab.events import (
    AbortEvent,
    AssistantMessageEvent,
    AssistantTurnEndEvent,
    AssistantTurnStartEvent,
    AssistantUsageData,
    AssistantUsageEvent,
    Event,
    ExternalToolRequestedEvent,
    PermissionCompletedEvent,
    PermissionRequestedEvent,
    SessionCompactionCompleteEvent,
    SessionContextClearedEvent,
    SessionErrorEvent,
    SessionPrunedEvent,
    SessionResumeEvent,
    SessionStartEvent,
    SessionTruncatedEvent,
    SessionWarningEvent,
    Spending,
    ToolExecutionCompleteEvent,
    ToolExecutionStartEvent,
    UserMessageEvent,
)
from trimtab.inspect.digest import Digest

__all__ = [
    "Call",
    "Entry",
    "Op",
    "OpName",
    "Run",
    "Segment",
    "Timeline",
    "Turn",
    "UsagePoint",
    "describe",
]

OpName: TypeAlias = Literal[
    "start", "resume", "clear", "compaction", "compaction_failed", "truncation", "withdrawal",
    "error", "abort", "warning", "pruned",
]  # fmt: skip
"""`withdrawal`: a truncation that withdraws an aborted run from the window (spec L7)."""


@dataclass(slots=True)
class Call:
    """One tool call: what the model asked for and how it went."""

    kind: ClassVar[str] = "call"
    call_id: str
    name: str
    arguments: Any
    seq: int
    """The number of the first event that mentions the call."""
    started: datetime | None = None
    completed: datetime | None = None
    outcome: str | None = None
    output: str | None = None
    """The result the model got back, or the error."""
    permission: str | None = None
    """The permission decision (`approved`, `denied-...`); None when none was asked for."""
    external: bool = False
    """Run by a client of `trimtab serve` rather than in the runtime."""

    @property
    def duration_ms(self) -> float | None:
        """From `tool.execution_start` to `tool.execution_complete`."""
        if self.started is None or self.completed is None:
            return None
        return (self.completed - self.started).total_seconds() * 1000


@dataclass(slots=True)
class Op:
    """An operation on the context or the session."""

    kind: ClassVar[str] = "op"
    name: OpName
    seq: int
    time: datetime
    epoch: int
    title: str
    text: str | None = None
    """The seed of a clear, the summary of a compaction, an error's message."""
    link: str | None = None
    """The session a fork was copied from."""


@dataclass(slots=True)
class Turn:
    """One model call and the batch of tool calls it asked for."""

    kind: ClassVar[str] = "turn"
    number: int
    """1 for the session's first model call."""
    seq: int
    turn_id: str
    epoch: int
    started: datetime
    model: str | None
    ended: datetime | None = None
    content: str = ""
    reasoning: str | None = None
    usage: AssistantUsageData | None = None
    calls: list[Call] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    """Context operations committed during the turn (a clear from a tool)."""


@dataclass(slots=True)
class Run:
    """A message that starts a run, or the seeded run after a clear."""

    kind: ClassVar[str] = "run"
    number: int
    seq: int
    time: datetime
    epoch: int
    prompt: str
    seeded: bool
    spent: Spending = field(default_factory=Spending)
    """What its model calls spent (spec U2)."""


Entry: TypeAlias = Run | Turn | Op | Call

_GOES_ON = frozenset({"hook", "agent_stop", "output"})
"""Messages of the run in progress (a hook's, a typed result's retry): it spends on."""
"""What the timeline lists: a `Call` only when it happened outside any turn."""


@dataclass(slots=True)
class Segment:
    """A stretch of the session between two context operations: one column of the window
    page. A clear starts a new epoch; a compaction or truncation a new segment of the same."""

    index: int
    epoch: int
    opened_by: str
    seq: int
    first_call: int | None = None
    last_call: int | None = None
    closed_by: Op | None = None
    spent: Spending = field(default_factory=Spending)
    """What its model calls spent: what a clear or a compaction saved shows between two."""


@dataclass(frozen=True, slots=True)
class UsagePoint:
    """Tokens of one model call (a compaction's summary call has no turn: `call` is None)."""

    input_tokens: int
    output_tokens: int
    call: int | None


class Timeline:
    """The fold of a session's log; `add` the events in order."""

    def __init__(self) -> None:
        self.digest = Digest()
        self.entries: list[Entry] = []
        self.turns: list[Turn] = []
        self.segments: list[Segment] = [Segment(0, 0, "session start", 1)]
        self.usage: list[UsagePoint] = []
        self.markers: list[tuple[int, OpName]] = []
        """Context operations on the usage chart: (usage points before it, operation)."""
        self._turn: Turn | None = None
        self._calls: dict[str, Call] = {}
        """The open turn's calls by id (emptied when it ends: ids are unique per turn)."""
        self._runs = 0
        self._run: Run | None = None
        """The run whose model calls the next usage counts for."""

    def add(self, event: Event) -> None:
        """Fold the next persisted event."""
        withdrawals = self.digest.withdrawals
        self.digest.apply(event)
        withdrawn = self.digest.withdrawals > withdrawals
        seq, epoch = self.digest.event_count, event.context_epoch
        match event:
            case UserMessageEvent():
                seeded = event.data.source == "context_cleared"
                self._runs += not seeded
                prompt = event.data.content
                run = Run(self._runs, seq, event.timestamp, epoch, prompt, seeded)
                self._entry(run)
                if event.data.source not in _GOES_ON:
                    self._run = run
            case AssistantTurnStartEvent():
                # Numbered as the digest counts model calls: every page says the same.
                turn = Turn(self.digest.model_calls, seq, event.data.turn_id, epoch,
                            event.timestamp, event.data.model)  # fmt: skip
                self._turn = turn
                self.turns.append(turn)
                self.entries.append(turn)
                segment = self.segments[-1]
                segment.first_call = segment.first_call or turn.number
                segment.last_call = turn.number
            case AssistantMessageEvent() if self._turn is not None:
                self._turn.content = event.data.content
                self._turn.reasoning = event.data.reasoning_text
                for request in event.data.tool_requests or ():
                    self._call(
                        request.tool_call_id, request.name, seq
                    ).arguments = request.arguments
            case AssistantUsageEvent():
                usage = event.data
                if self._run is not None:
                    self._run.spent = self._run.spent.plus(usage)
                self.segments[-1].spent = self.segments[-1].spent.plus(usage)
                number = self._turn.number if self._turn is not None else None
                self.usage.append(
                    UsagePoint(usage.input_tokens or 0, usage.output_tokens or 0, number)
                )
                if self._turn is not None:
                    self._turn.usage = usage
            case AssistantTurnEndEvent():
                if self._turn is not None:
                    self._turn.ended = event.timestamp
                self._turn, self._calls = None, {}
            case _:
                if not self._tool_event(event, seq):
                    self._operation(event, seq, epoch, withdrawn=withdrawn)

    def _tool_event(self, event: Event, seq: int) -> bool:
        """Fold an event about a tool call; False if `event` is none."""
        match event:
            case ToolExecutionStartEvent():
                call = self._call(event.data.tool_call_id, event.data.tool_name, seq)
                call.started, call.arguments = event.timestamp, event.data.arguments
            case ExternalToolRequestedEvent():
                self._call(event.data.tool_call_id, event.data.tool_name, seq).external = True
            case PermissionRequestedEvent():
                request = event.data.permission_request
                if request.tool_call_id is not None:
                    self._call(request.tool_call_id, request.tool_name, seq)
            case PermissionCompletedEvent() if event.data.tool_call_id is not None:
                self._call(event.data.tool_call_id, "?", seq).permission = event.data.result.kind
            case ToolExecutionCompleteEvent():
                done = event.data
                call = self._call(done.tool_call_id, done.tool_name or "?", seq)
                call.completed, call.outcome = event.timestamp, done.outcome
                if done.result is not None:
                    call.output = done.result.content
                elif done.error is not None:
                    call.output = done.error.message
            case _:
                return False
        return True

    def _operation(self, event: Event, seq: int, epoch: int, *, withdrawn: bool) -> None:
        time = event.timestamp
        match event:
            case SessionStartEvent():
                start = event.data
                title = f"session started ({start.config.model or 'default model'})"
                origin = start.forked_from
                if origin is not None:
                    title = f"forked from session {origin}"
                system = start.config.system_message
                self._entry(Op("start", seq, time, epoch, title, system, origin))
            case SessionResumeEvent():
                self._entry(Op("resume", seq, time, epoch, "session resumed"))
            case SessionContextClearedEvent():
                cleared = event.data
                title = f"context cleared: {cleared.messages_cleared} messages"
                self._context_op(Op("clear", seq, time, epoch, title, cleared.initial_message))
            case SessionCompactionCompleteEvent() if event.data.success:
                compacted, removed = event.data, event.data.messages_removed
                title = f"compacted ({compacted.trigger}): {removed} messages removed"
                summary = compacted.summary_content
                self._context_op(Op("compaction", seq, time, epoch, title, summary))
            case SessionCompactionCompleteEvent():
                title = f"compaction failed: {event.data.error or 'unknown error'}"
                self._entry(Op("compaction_failed", seq, time, epoch, title))
            case SessionTruncatedEvent() if withdrawn:
                title = f"aborted run withdrawn from the window: {event.data.events_removed} events"
                self._context_op(Op("withdrawal", seq, time, epoch, title))
            case SessionTruncatedEvent():
                cut = event.data
                title = f"truncated at event {cut.event_id}: {cut.events_removed} events removed"
                self._context_op(Op("truncation", seq, time, epoch, title))
            case SessionErrorEvent():
                title = f"error: {event.data.error_type}"
                self._entry(Op("error", seq, time, epoch, title, event.data.message))
            case AbortEvent():
                self._entry(Op("abort", seq, time, epoch, f"aborted ({event.data.reason})"))
            case SessionWarningEvent():
                title = f"warning: {event.data.warning_type}"
                self._entry(Op("warning", seq, time, epoch, title, event.data.message))
            case SessionPrunedEvent():
                pruned = event.data
                title = f"{pruned.events_pruned} events pruned before here"
                marks = [f"{b.type} (epoch {b.context_epoch}, {b.timestamp:%Y-%m-%d %H:%M:%S})"
                         for b in pruned.bases]  # fmt: skip
                detail = (
                    "The context operations among them:\n" + "\n".join(marks) if marks else None
                )
                self._entry(Op("pruned", seq, time, epoch, title, detail))
            case _:
                pass  # the rest adds nothing a person reads: external completions

    def _context_op(self, op: Op) -> None:
        """A clear, compaction, truncation or withdrawal: it ends a segment and starts the
        next."""
        self._entry(op)
        self.segments[-1].closed_by = op
        self.segments.append(Segment(len(self.segments), op.epoch, op.name, op.seq))
        self.markers.append((len(self.usage), op.name))

    def _entry(self, entry: Entry) -> None:
        """A context operation during a turn belongs to it; anything else to the list."""
        if isinstance(entry, Op) and entry.name == "clear" and self._turn is not None:
            self._turn.ops.append(entry)
        else:
            self.entries.append(entry)

    def _call(self, call_id: str, name: str, seq: int) -> Call:
        call = self._calls.get(call_id)
        if call is None:
            call = self._calls[call_id] = Call(call_id, name, None, seq)
            if self._turn is not None:
                self._turn.calls.append(call)
            else:
                self.entries.append(call)
        return call

    def run_before(self, index: int) -> Run | None:
        """The run that the entry at `index` belongs to (for a page that starts mid-run)."""
        for entry in reversed(self.entries[:index]):
            if isinstance(entry, Run):
                return entry
        return None


def describe(event: Event) -> str:
    """One line about an event, for the live view."""
    match event:
        case UserMessageEvent():
            return event.data.content
        case AssistantMessageEvent():
            calls = ", ".join(r.name for r in event.data.tool_requests or ())
            return event.data.content + (f" [calls {calls}]" if calls else "")
        case AssistantUsageEvent():
            usage = event.data
            return f"{usage.input_tokens or 0} tokens in, {usage.output_tokens or 0} out"
        case ToolExecutionStartEvent():
            return event.data.tool_name
        case ToolExecutionCompleteEvent():
            return f"{event.data.tool_name or event.data.tool_call_id}: {event.data.outcome}"
        case PermissionCompletedEvent():
            return event.data.result.kind
        case SessionContextClearedEvent():
            cleared = event.data
            return f"{cleared.messages_cleared} messages cleared; seed: {cleared.initial_message}"
        case SessionErrorEvent():
            return f"{event.data.error_type}: {event.data.message}"
        case _:
            return ""
