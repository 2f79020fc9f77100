"""The window: what the model sees, as a pure function of the event log (spec P1).

The conversation starts at the latest *base*: a `session.context_cleared` (empty), or a
`session.compaction_complete` / `session.truncated`, which carry the messages the window
starts from, so the window never needs the log before its base. System and developer
messages come from the configuration, which none of these touch (spec C9). Tool results
follow the assistant message that requested them, in request order, whatever order they
completed in (spec T3); a result whose request is not in the window (a sibling of a wiped
batch, spec C6) is left out, and so is a call that has no result (spec P3), so the window
never holds an orphan.

`Projection` is the one implementation of that rule: it takes the events after a base one at
a time, so a window costs a list copy, not a replay.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from trimtab.events import (
    AssistantMessageEvent,
    Event,
    Message,
    ToolDefinition,
    ToolExecutionCompleteEvent,
    ToolRequest,
    UserMessageEvent,
)
from trimtab.providers import ToolCall

__all__ = [
    "ContextMessage",
    "ContextWindow",
    "Projection",
    "context_window",
    "estimate_tokens",
    "head",
    "units",
]


class Projection:
    """The conversation since the window's base, kept up to date one event at a time.

    Only the latest assistant turn can still change (its results arrive after it); what
    precedes it is final and kept as the `Message`s the window sends.
    """

    __slots__ = ("_after", "_final", "_final_tokens", "_rendered", "_turn")

    def __init__(self) -> None:
        self._final: list[Message] = []
        """The messages before the open turn, which no later event can change."""
        self._final_tokens = 0
        """`estimate_tokens(self._final)`, kept as it grows: every model call asks for the
        window's size, which must not cost a pass over a long conversation."""
        self._turn: tuple[str, tuple[ToolRequest, ...], dict[str, str]] | None = None
        """The latest assistant message (content, requests) and the results it has so far."""
        self._rendered: list[Message] | None = None
        """The open turn's messages, until a result changes them."""
        self._after: tuple[Message, ...] = ()
        """User messages sent after the open turn (results may still come for it); a tuple,
        so that the empty one is shared."""

    def add(self, event: Event) -> None:
        """Project one event; those that do not shape the window are ignored."""
        match event:
            case UserMessageEvent():
                images = tuple(event.data.images) if event.data.images else ()
                message = _kept(Message, role="user", content=event.data.content, images=images)
                if self._turn is not None:
                    self._after += (message,)
                else:
                    self._finalize((message,))
            case AssistantMessageEvent():
                self._finalize((*self._turn_messages(), *self._after))
                requests = tuple(event.data.tool_requests or ())
                # Results are only ever added for a request: a turn without any shares one
                # empty dict.
                results = {} if requests else _NO_RESULTS
                self._turn, self._rendered, self._after = (
                    (event.data.content, requests, results),
                    None,
                    (),
                )
            case ToolExecutionCompleteEvent() if self._turn is not None:
                call_id, results = event.data.tool_call_id, self._turn[2]
                if any(r.tool_call_id == call_id for r in self._turn[1]):
                    results[call_id] = _result_text(event)
                    self._rendered = None
            case _:
                pass

    def _finalize(self, messages: Sequence[Message]) -> None:
        self._final += messages
        self._final_tokens += estimate_tokens(messages)

    def _turn_messages(self) -> list[Message]:
        if self._turn is None:
            return []
        if self._rendered is None:
            self._rendered = _render_turn(*self._turn)
        return self._rendered

    def messages(self) -> list[Message]:
        """The conversation's messages, as the next model call sends them."""
        return [*self._final, *self._turn_messages(), *self._after]

    def tokens(self) -> int:
        """`estimate_tokens(self.messages())`, from a running total of the final ones."""
        return (
            self._final_tokens
            + estimate_tokens(self._turn_messages())
            + estimate_tokens(self._after)
        )

    def count(self) -> int:
        """How many messages the conversation holds, counting the latest assistant message
        even while none of its calls has a result yet (what a clear reports, spec C5)."""
        turn = len(self._turn_messages()) or (self._turn is not None)
        return len(self._final) + turn + len(self._after)


_NO_RESULTS: dict[str, str] = {}
"""The results of every turn that requested no tool call: never written (see `add`)."""


def _result_text(event: ToolExecutionCompleteEvent) -> str:
    data = event.data
    return data.result.content if data.result else data.error.message if data.error else ""


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

    Pydantic gives every instance its own set of the fields it was given, nearly half of a
    short message, which a long session's window would hold thousands of times. Nothing
    reads it (nothing dumps with `exclude_unset`), so they all share one.
    """
    return model.model_construct(_FIELDS_SETS[model], **fields)


IMAGE_TOKENS = 1_600
"""What an image costs at most: Anthropic's ~1,600 for the largest it does not scale down,
OpenAI's 765 to 1,105 for a detailed one."""


@lru_cache(maxsize=256)
def head(system_message: str | None, developer_messages: tuple[str, ...]) -> tuple[Message, ...]:
    """The system and developer messages of a window; sessions of one app share them."""
    messages = [Message(role="system", content=system_message)] if system_message else []
    messages += (Message(role="developer", content=text) for text in developer_messages)
    return tuple(messages)


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
    token_ratio: float = 1.0
    """What the model counts per token of these estimates, as its calls reported so far
    (spec X1): `total_tokens * token_ratio` is what the runtime compares with `token_limit`."""


def context_window(
    window: Sequence[Message], tools: Sequence[ToolDefinition], limit: int, ratio: float = 1.0
) -> ContextWindow:
    """The window with a token estimate per message (`ratio`: its calibration, X1)."""
    sized = [ContextMessage(message=m, tokens=estimate_tokens([m])) for m in window]
    tools_tokens = sum(len(t.model_dump_json()) for t in tools) // 4
    return ContextWindow(
        messages=sized,
        tools_tokens=tools_tokens,
        total_tokens=tools_tokens + sum(m.tokens for m in sized),
        token_limit=limit,
        token_ratio=ratio,
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
    """A provider-neutral token estimate: 4 characters per token plus 4 per message, and
    `IMAGE_TOKENS` per image.

    Close enough for English prose and JSON with the common BPE tokenizers; compaction keeps a
    margin (its threshold) so that the estimate does not have to be exact.
    """
    total = 0
    for message in messages:
        chars = len(message.content)
        if message.tool_calls:  # most messages have none: no generator for them (runs per turn)
            chars += sum(len(c.name) + len(c.arguments) for c in message.tool_calls)
        total += 4 + (chars + 3) // 4 + IMAGE_TOKENS * len(message.images)
    return total
