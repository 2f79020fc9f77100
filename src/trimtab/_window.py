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
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from trimtab.events import (
    AbortEvent,
    AssistantMessageEvent,
    AssistantTurnEndEvent,
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
    ToolExecutionStartData,
    ToolExecutionStartEvent,
    ToolRequest,
    UserMessageEvent,
)
from trimtab.providers import Message, ToolCall, Usage

__all__ = [
    "ContextMessage",
    "ContextWindow",
    "Replay",
    "ReplaySnapshot",
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
                    open_turn.results[data.tool_call_id] = _result_text(event)
            case _:
                pass
    return entries


def _result_text(event: ToolExecutionCompleteEvent) -> str:
    data = event.data
    return data.result.content if data.result else data.error.message if data.error else ""


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
            window.append(_kept(Message, role="user", content=entry.data.content))
        else:
            data = entry.event.data
            window += _render_turn(data.content, data.tool_requests or (), entry.results)
    return window


def _render_turn(
    content: str, requests: Sequence[ToolRequest], results: Mapping[str, str]
) -> list[Message]:
    """An assistant message with the calls that have a result, then those results in request
    order; nothing when it has neither text nor an answered call (no orphans, spec P3)."""
    answered = [r for r in requests if r.tool_call_id in results]
    if not content and not answered:
        return []
    calls = tuple(_to_call(r) for r in answered)
    return [
        _kept(Message, role="assistant", content=content, tool_calls=calls),
        *(
            _kept(
                Message, role="tool", tool_call_id=r.tool_call_id, content=results[r.tool_call_id]
            )
            for r in answered
        ),
    ]


def _to_call(request: ToolRequest) -> ToolCall:
    arguments = request.arguments
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, separators=(",", ":"))
    return _kept(ToolCall, id=request.tool_call_id, name=request.name, arguments=text)


_M = TypeVar("_M", bound=BaseModel)
_FIELDS_SETS: dict[type[BaseModel], set[str]] = {
    model: set(model.model_fields) for model in (Message, ToolCall)
}


def _kept(model: type[_M], **fields: Any) -> _M:
    """`model(**fields)` for a message the window keeps, from fields of validated events.

    Pydantic gives every instance its own set of the fields it was given: 216 bytes, nearly
    half of a short message, which a long session's window would hold thousands of times.
    Nothing reads it (nothing dumps with `exclude_unset`), so they all share one.
    """
    return model.model_construct(_FIELDS_SETS[model], **fields)


class ContextMessage(BaseModel):
    """One message of the window and its estimated size."""

    model_config = ConfigDict(defer_build=True)

    message: Message
    tokens: int


class ContextWindow(BaseModel):
    """What the model will see next (`Session.get_context()`)."""

    model_config = ConfigDict(defer_build=True)

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
        chars = len(message.content)
        if message.tool_calls:  # most messages have none: no generator for them (runs per turn)
            chars += sum(len(c.name) + len(c.arguments) for c in message.tool_calls)
        total += 4 + (chars + 3) // 4
    return total


class _Projection:
    """The conversation since the base, kept up to date one event at a time.

    `conversation()` replays the window's events on every call: O(window) work per model
    request, several times per turn, and the events must stay in memory. This is the same
    projection kept incrementally (O(1) per event) as final `Message`s, so that a window is a
    list copy and an idle session holds a few messages instead of its events. Only the latest
    assistant turn can still change (its results arrive after it); what precedes it is final.
    """

    __slots__ = ("_after", "_final", "_rendered", "_turn", "length")

    def __init__(self) -> None:
        self._final: list[Message] = []
        """The messages before the open turn, which no later event can change."""
        self._turn: tuple[str, tuple[ToolRequest, ...], dict[str, str]] | None = None
        """The latest assistant message (content, requests) and the results it has so far."""
        self._rendered: list[Message] | None = None
        """The open turn's messages, until a result changes them."""
        self._after: list[Message] = []
        """User messages sent after the open turn (results may still come for it)."""
        self.length = 0
        """`conversation_length` of the events added (the base not included)."""

    def add(self, event: Event) -> None:
        """Project one window event (see `_conversation`, which this must agree with)."""
        match event:
            case UserMessageEvent():
                message = _kept(Message, role="user", content=event.data.content)
                (self._after if self._turn is not None else self._final).append(message)
                self.length += 1
            case AssistantMessageEvent():
                self._final += self._turn_messages()
                self._final += self._after
                data = event.data
                self._turn, self._rendered, self._after = (
                    (data.content, tuple(data.tool_requests or ()), {}),
                    None,
                    [],
                )
                self.length += 1
            case ToolExecutionCompleteEvent() if self._turn is not None:
                call_id, results = event.data.tool_call_id, self._turn[2]
                if any(r.tool_call_id == call_id for r in self._turn[1]):
                    self.length += call_id not in results
                    results[call_id] = _result_text(event)
                    self._rendered = None
            case _:
                pass

    def _turn_messages(self) -> list[Message]:
        if self._turn is None:
            return []
        if self._rendered is None:
            self._rendered = _render_turn(*self._turn)
        return self._rendered

    def messages(self) -> list[Message]:
        return [*self._final, *self._turn_messages(), *self._after]


class ReplaySnapshot(BaseModel):
    """A `Replay` between runs, as a store keeps it (`Store.save_snapshot`), so that opening a
    session costs O(window + events since), not O(log)."""

    model_config = ConfigDict(defer_build=True)

    event_count: int
    last_id: str | None
    config: SessionConfigData
    epoch: int
    turns: int
    conversation: list[Message]
    length: int
    """`conversation_length`, which counts a bit more than the rendered messages (C5)."""
    tokens: tuple[int, int] | None
    unfinished_calls: list[ToolExecutionStartData]
    open_turn: str | None
    last_message_id: str | None
    pending_seed: str | None
    seed_recorded: bool


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
    """The events since the latest base that the window is built from (if `keep_events`)."""
    keep_events: bool = True
    """Whether to keep `window_events`; a live session needs only the projection."""
    projection: _Projection = field(default_factory=_Projection, repr=False, compare=False)
    """The conversation since the base, built incrementally from the same events."""
    _tokens: tuple[int, int] | None = field(default=None, repr=False)
    """Input and output tokens summed over every `assistant.usage`; None before the first.

    Two ints rather than a `Usage` model: ~300 bytes less in every idle session."""
    unfinished_calls: dict[str, ToolExecutionStartData] = field(default_factory=dict)
    """Tool calls started but never completed (a crash mid-call), by call id."""
    open_turn: str | None = None
    """The id of a turn started and not ended (a crash mid-turn)."""
    last_message_id: str | None = None
    """The message id of the latest user message: what a continued run answers."""
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
                self.config = _shared(event.data.config)
            case SessionResumeEvent() if event.data.config is not None:
                self.config = _shared(event.data.config)
            case SessionContextClearedEvent():
                self.epoch += 1
                self._rebase(())
                self.pending_seed, self.seed_recorded = event.data.initial_message, False
            case SessionCompactionCompleteEvent() if event.data.success:
                self._rebase(tuple(event.data.base))
            case SessionTruncatedEvent():
                self._rebase(tuple(event.data.base))
                self.pending_seed = None
            case AssistantUsageEvent():
                used_in, used_out = self._tokens or (0, 0)
                self._tokens = (
                    used_in + (event.data.input_tokens or 0),
                    used_out + (event.data.output_tokens or 0),
                )
            case AssistantTurnStartEvent():
                self.turns += 1
                self.open_turn = event.data.turn_id
            case AssistantTurnEndEvent():
                self.open_turn = None
            case ToolExecutionStartEvent():
                self.unfinished_calls[event.data.tool_call_id] = event.data
            case ToolExecutionCompleteEvent():
                self.unfinished_calls.pop(event.data.tool_call_id, None)
                self._add_to_window(event)
            case UserMessageEvent():
                self._add_to_window(event)
                self.seed_recorded = event.data.source == "context_cleared"
                self.last_message_id = event.data.message_id
            case AssistantMessageEvent():
                self._add_to_window(event)
                self.pending_seed = None
            case SessionErrorEvent() | AbortEvent():
                self.pending_seed = None  # the seeded run happened; it just did not end well
            case _:
                pass

    def snapshot(self) -> ReplaySnapshot:
        """This replay as data; its conversation becomes the base of the one restored."""
        return ReplaySnapshot(
            event_count=self.event_count,
            last_id=self.last_id,
            config=self.config,
            epoch=self.epoch,
            turns=self.turns,
            conversation=self.conversation(),
            length=self.conversation_length(),
            tokens=self._tokens,
            unfinished_calls=list(self.unfinished_calls.values()),
            open_turn=self.open_turn,
            last_message_id=self.last_message_id,
            pending_seed=self.pending_seed,
            seed_recorded=self.seed_recorded,
        )

    @classmethod
    def restore(cls, snapshot: ReplaySnapshot) -> Replay:
        """The replay a snapshot describes; apply the events after it to bring it up to date."""
        replayed = cls(
            config=_shared(snapshot.config),
            event_count=snapshot.event_count,
            last_id=snapshot.last_id,
            epoch=snapshot.epoch,
            turns=snapshot.turns,
            base=tuple(snapshot.conversation),
            keep_events=False,
            _tokens=snapshot.tokens,
            unfinished_calls={c.tool_call_id: c for c in snapshot.unfinished_calls},
            open_turn=snapshot.open_turn,
            last_message_id=snapshot.last_message_id,
            pending_seed=snapshot.pending_seed,
            seed_recorded=snapshot.seed_recorded,
        )
        replayed.projection.length = snapshot.length - len(snapshot.conversation)
        return replayed

    @property
    def usage(self) -> Usage:
        """Tokens used by every model call of the session (spec C9: survives clears)."""
        if self._tokens is None:
            return Usage()
        return Usage(input_tokens=self._tokens[0], output_tokens=self._tokens[1])

    def _rebase(self, base: tuple[Message, ...]) -> None:
        self.base, self.window_events, self.projection = base, [], _Projection()

    def _add_to_window(self, event: Event) -> None:
        if self.keep_events:
            self.window_events.append(event)
        self.projection.add(event)

    def window(self) -> list[Message]:
        """`build_window(config, base, window_events)`, from the projection: O(1) per event
        applied instead of O(window) per call."""
        config = self.config
        head = _head(config.system_message, tuple(config.developer_messages))
        return [*head, *self.base, *self.projection.messages()]

    def conversation(self) -> list[Message]:
        """`conversation(base, window_events)`, from the projection."""
        return [*self.base, *self.projection.messages()]

    def conversation_length(self) -> int:
        """`conversation_length(base, window_events)`, in O(1)."""
        return len(self.base) + self.projection.length


@lru_cache(maxsize=256)
def _head(system_message: str | None, developer_messages: tuple[str, ...]) -> tuple[Message, ...]:
    """The system and developer messages of a window; sessions of one app share them."""
    head = [Message(role="system", content=system_message)] if system_message else []
    head += (Message(role="developer", content=text) for text in developer_messages)
    return tuple(head)


_configs: weakref.WeakValueDictionary[str, SessionConfigData] = weakref.WeakValueDictionary()


def _shared(config: SessionConfigData) -> SessionConfigData:
    """An equal configuration already in memory, if any, else `config`.

    Configurations are immutable and most sessions of one process share theirs (same model,
    prompt and tools): interning them saves ~1.5 KB per idle session.
    """
    key = config.model_dump_json()
    shared = _configs.get(key)
    if shared is None:
        _configs[key] = shared = config
    return shared


def replay(events: Iterable[Event]) -> Replay:
    state = Replay()
    for event in events:
        state.apply(event)
    return state
