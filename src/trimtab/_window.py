"""The window: what the model sees, as a pure function of the event log (spec P1).

The conversation starts at the latest *base*: a `session.context_cleared` (empty), or a
`session.compaction_complete` / `session.truncated`, which carry the messages the window
starts from, so the window never needs the log before its base. System and developer
messages come from the configuration, which none of these touch (spec C9). Tool results
follow the assistant message that requested them, in request order, whatever order they
completed in (spec T3); a result whose request is not in the window (a sibling of a wiped
batch, spec C6) is left out, and so is a call that has no result (spec P3), so the window
never holds an orphan.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from trimtab.events import (
    AbortEvent,
    AssistantMessageEvent,
    AssistantTurnStartEvent,
    AssistantUsageEvent,
    Event,
    SessionCompactionCompleteEvent,
    SessionConfigData,
    SessionContextClearedEvent,
    SessionErrorEvent,
    SessionResumeEvent,
    SessionStartEvent,
    SessionTruncatedEvent,
    ToolDefinition,
    ToolExecutionCompleteEvent,
    ToolExecutionStartEvent,
    ToolRequest,
    UserMessageEvent,
)
from trimtab.providers import Message, ToolCall, Usage

__all__ = [
    "ContextMessage",
    "ContextWindow",
    "Replay",
    "build_window",
    "conversation",
    "context_window",
    "conversation_length",
    "estimate_tokens",
    "replay",
    "units",
]


@dataclass
class _Turn:
    """An assistant message with the results its calls have so far."""

    event: AssistantMessageEvent
    results: dict[str, str] = field(default_factory=dict)


def _conversation(events: Iterable[Event]) -> list[UserMessageEvent | _Turn]:
    entries: list[UserMessageEvent | _Turn] = []
    open_turn: _Turn | None = None
    for event in events:
        match event:
            case SessionContextClearedEvent():
                entries, open_turn = [], None
            case UserMessageEvent():
                entries.append(event)
            case AssistantMessageEvent():
                open_turn = _Turn(event)
                entries.append(open_turn)
            case ToolExecutionCompleteEvent() if open_turn is not None:
                data = event.data
                requested = open_turn.event.data.tool_requests or ()
                if any(r.tool_call_id == data.tool_call_id for r in requested):
                    text = (
                        data.result.content
                        if data.result
                        else data.error.message
                        if data.error
                        else ""
                    )
                    open_turn.results[data.tool_call_id] = text
            case _:
                pass
    return entries


def conversation_length(base: Sequence[Message], events: Iterable[Event]) -> int:
    """Non-system, non-developer messages in the window, counting unanswered calls' messages too.

    This is what a clear reports as `messages_cleared` (spec C5): the assistant message that
    requested the clearing call counts even though its results are not recorded yet.
    """
    entries = _conversation(events)
    return len(base) + sum(
        1 if isinstance(e, UserMessageEvent) else 1 + len(e.results) for e in entries
    )


def build_window(
    config: SessionConfigData, base: Sequence[Message], events: Iterable[Event]
) -> list[Message]:
    """The messages of the next model call: system, developer, then the conversation."""
    window: list[Message] = []
    if config.system_message:
        window.append(Message(role="system", content=config.system_message))
    window.extend(Message(role="developer", content=text) for text in config.developer_messages)
    return window + conversation(base, events)


def conversation(base: Sequence[Message], events: Iterable[Event]) -> list[Message]:
    """The conversation part of the window: the base, then what the events add."""
    window = list(base)
    for entry in _conversation(events):
        if isinstance(entry, UserMessageEvent):
            window.append(Message(role="user", content=entry.data.content))
            continue
        answered = [
            r for r in entry.event.data.tool_requests or () if r.tool_call_id in entry.results
        ]
        if not entry.event.data.content and not answered:
            continue
        window.append(
            Message(
                role="assistant",
                content=entry.event.data.content,
                tool_calls=tuple(_to_call(r) for r in answered),
            )
        )
        window.extend(
            Message(role="tool", tool_call_id=r.tool_call_id, content=entry.results[r.tool_call_id])
            for r in answered
        )
    return window


def _to_call(request: ToolRequest) -> ToolCall:
    arguments = request.arguments
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, separators=(",", ":"))
    return ToolCall(id=request.tool_call_id, name=request.name, arguments=text)


class ContextMessage(BaseModel):
    """One message of the window and its estimated size."""

    message: Message
    tokens: int


class ContextWindow(BaseModel):
    """What the model will see next (`Session.get_context()`)."""

    messages: list[ContextMessage]
    tools_tokens: int
    """The estimated size of the tool schemas sent with the messages."""
    total_tokens: int
    token_limit: int
    """The model's context window."""


def context_window(
    window: Sequence[Message], tools: Sequence[ToolDefinition], limit: int
) -> ContextWindow:
    """The window with a token estimate per message."""
    sized = [ContextMessage(message=m, tokens=estimate_tokens([m])) for m in window]
    tools_tokens = sum(len(t.model_dump_json()) for t in tools) // 4
    return ContextWindow(
        messages=sized,
        tools_tokens=tools_tokens,
        total_tokens=tools_tokens + sum(m.tokens for m in sized),
        token_limit=limit,
    )


def units(messages: Sequence[Message]) -> list[list[Message]]:
    """Split a conversation into units that must stay whole: a user message, or an assistant
    message with the tool results that answer it (never split a call from its result)."""
    grouped: list[list[Message]] = []
    for message in messages:
        if message.role == "tool" and grouped:
            grouped[-1].append(message)
        else:
            grouped.append([message])
    return grouped


def estimate_tokens(messages: Iterable[Message]) -> int:
    """A provider-neutral token estimate: 4 characters per token plus 4 per message.

    Close enough for English prose and JSON with the common BPE tokenizers; compaction keeps a
    margin (its threshold) so that the estimate does not have to be exact.
    """
    total = 0
    for message in messages:
        chars = len(message.content) + sum(
            len(c.name) + len(c.arguments) for c in message.tool_calls
        )
        total += 4 + (chars + 3) // 4
    return total


@dataclass
class Replay:
    """What a session needs in memory, rebuilt from its log (resume is replay, spec P1)."""

    config: SessionConfigData = field(default_factory=SessionConfigData)
    event_count: int = 0
    last_id: str | None = None
    epoch: int = 0
    turns: int = 0
    base: tuple[Message, ...] = ()
    """The conversation the window starts from (set by compaction and truncation)."""
    window_events: list[Event] = field(default_factory=list)
    """The events since the latest base that the window is built from."""
    usage: Usage = field(default_factory=Usage)
    """Tokens used by every model call of the session (spec C9: survives clears)."""
    unfinished_calls: dict[str, str] = field(default_factory=dict)
    """Tool calls started but never completed (a crash mid-call): call id -> tool name."""
    pending_seed: str | None = None
    """A committed clear's prompt that no seeded run has answered yet (spec C10)."""
    seed_recorded: bool = False
    """Whether that seed's `user.message` is already in the log."""

    def apply(self, event: Event) -> None:
        """Advance the replay by one persisted event."""
        self.event_count += 1
        self.last_id = event.id
        match event:
            case SessionStartEvent():
                self.config = event.data.config
            case SessionResumeEvent() if event.data.config is not None:
                self.config = event.data.config
            case SessionContextClearedEvent():
                self.epoch += 1
                self.base, self.window_events = (), []
                self.pending_seed, self.seed_recorded = event.data.initial_message, False
            case SessionCompactionCompleteEvent() if event.data.success:
                self.base, self.window_events = tuple(event.data.base), []
            case SessionTruncatedEvent():
                self.base, self.window_events = tuple(event.data.base), []
                self.pending_seed = None
            case AssistantUsageEvent():
                self.usage = Usage(
                    input_tokens=(self.usage.input_tokens or 0) + (event.data.input_tokens or 0),
                    output_tokens=(self.usage.output_tokens or 0) + (event.data.output_tokens or 0),
                )
            case AssistantTurnStartEvent():
                self.turns += 1
            case ToolExecutionStartEvent():
                self.unfinished_calls[event.data.tool_call_id] = event.data.tool_name
            case ToolExecutionCompleteEvent():
                self.unfinished_calls.pop(event.data.tool_call_id, None)
                self.window_events.append(event)
            case UserMessageEvent():
                self.window_events.append(event)
                self.seed_recorded = event.data.source == "context_cleared"
            case AssistantMessageEvent():
                self.window_events.append(event)
                self.pending_seed = None
            case SessionErrorEvent() | AbortEvent():
                self.pending_seed = None  # the seeded run happened; it just did not end well
            case _:
                pass


def replay(events: Iterable[Event]) -> Replay:
    state = Replay()
    for event in events:
        state.apply(event)
    return state
