"""The window: what the model sees, as a pure function of the event log (spec P1).

The conversation starts after the latest `session.context_cleared`; system and developer
messages come from the configuration, which a clear never touches (spec C9). Tool results
follow the assistant message that requested them, in request order, whatever order they
completed in (spec T3); a result whose request is not in the window (a sibling of a wiped
batch, spec C6) is left out, and so is a call that has no result (spec P3), so the window
never holds an orphan.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from trimtab.events import (
    AbortEvent,
    AssistantMessageEvent,
    AssistantTurnStartEvent,
    Event,
    SessionConfigData,
    SessionContextClearedEvent,
    SessionErrorEvent,
    SessionResumeEvent,
    SessionStartEvent,
    ToolExecutionCompleteEvent,
    ToolExecutionStartEvent,
    ToolRequest,
    UserMessageEvent,
)
from trimtab.providers import Message, ToolCall

__all__ = ["Replay", "build_window", "conversation_length", "replay"]


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


def conversation_length(events: Iterable[Event]) -> int:
    """Non-system, non-developer messages in the window, counting unanswered calls' messages too.

    This is what a clear reports as `messages_cleared` (spec C5): the assistant message that
    requested the clearing call counts even though its results are not recorded yet.
    """
    return sum(
        1 if isinstance(e, UserMessageEvent) else 1 + len(e.results) for e in _conversation(events)
    )


def build_window(config: SessionConfigData, events: Iterable[Event]) -> list[Message]:
    """The messages of the next model call."""
    window: list[Message] = []
    if config.system_message:
        window.append(Message(role="system", content=config.system_message))
    window.extend(Message(role="developer", content=text) for text in config.developer_messages)
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


@dataclass
class Replay:
    """What a session needs in memory, rebuilt from its log (resume is replay, spec P1)."""

    config: SessionConfigData = field(default_factory=SessionConfigData)
    event_count: int = 0
    last_id: str | None = None
    epoch: int = 0
    turns: int = 0
    window_events: list[Event] = field(default_factory=list)
    """The events since the latest clear that the window is built from."""
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
                self.window_events = []
                self.pending_seed, self.seed_recorded = event.data.initial_message, False
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
