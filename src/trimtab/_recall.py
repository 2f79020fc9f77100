"""The built-in `recall` tool (spec X7): the model searches what its earlier windows held.

A clear, a compaction or a truncation moves the window's base; the log keeps everything
before it. With `recall` on, the model may search that part of the log by text: the messages
of earlier epochs, what compactions summarised or dropped, what a truncation made the window
forget. It reads the log only (no model call, nothing logged): what it finds enters the window
as the call's result, because the model asked for it, and nothing else does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from trimtab._tools import Tool, ToolInvocation, define_tool
from trimtab.events import (
    AssistantMessageEvent,
    Event,
    Recall,
    SessionCompactionCompleteEvent,
    SessionContextClearedEvent,
    SessionTruncatedEvent,
    ToolExecutionCompleteEvent,
    UserMessageEvent,
)

__all__ = ["RECALL", "RecallArgs", "make_recall", "recall"]

RECALL = "recall"

MAX_QUERY = 500
"""Characters of a query that are searched for (a model may paste a paragraph)."""


class RecallArgs(BaseModel):
    model_config = ConfigDict(defer_build=True)

    query: str
    """Words to find in the earlier conversation (all of them, in any case), such as a name,
    an id or an error message."""


def make_recall(config: Recall) -> Tool:
    """The built-in `recall` with `config`'s bounds."""

    async def recall_tool(params: RecallArgs, invocation: ToolInvocation) -> str:
        events = await invocation.session.get_events()
        return recall(events, params.query, config.max_results, config.max_chars)

    return define_tool(
        RECALL,
        description=(
            "Search the earlier parts of this conversation that are no longer in your context"
            " (cleared or compacted away) for words, such as a name, an id or an error. Returns"
            " short excerpts, newest first, with the id of the event each comes from."
        ),
        params_type=RecallArgs,
        skip_permission=True,
        defer="never",
        handler=recall_tool,
    )


def recall(events: Sequence[Event], query: str, max_results: int, max_chars: int) -> str:
    """The model's answer: excerpts of the texts logged before the window's base that hold
    every word of `query`, newest first."""
    words = _words(query[:MAX_QUERY])
    if not words:
        return "Give a query with at least one word to search for."
    base = _base(events)
    found: list[str] = []
    for event in reversed(events[:base]):
        found += _matches(event, words, max_chars)
        if len(found) >= max_results:
            break
    if not found:
        return f"Nothing in the earlier conversation matches {query[:MAX_QUERY]!r}."
    shown = found[:max_results]
    return f"{len(shown)} excerpt(s) from the earlier conversation, newest first:\n\n" + (
        "\n\n".join(shown)
    )


def _base(events: Sequence[Event]) -> int:
    """Where the window's conversation starts: the latest clear, compaction or truncation
    (what is before it the window no longer holds verbatim)."""
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if isinstance(event, SessionContextClearedEvent | SessionTruncatedEvent):
            return index
        if isinstance(event, SessionCompactionCompleteEvent) and event.data.success:
            return index
    return 0


def _matches(event: Event, words: list[str], max_chars: int) -> list[str]:
    """`event`'s excerpt when its text holds every word."""
    found = _text(event)
    if found is None:
        return []
    kind, text = found
    lowered = text.lower()
    if not all(word in lowered for word in words):
        return []
    at = lowered.find(words[0])
    start = max(0, min(at - max_chars // 3, len(text) - max_chars))
    excerpt = text[start : start + max_chars]
    excerpt = ("…" if start else "") + excerpt + ("…" if start + max_chars < len(text) else "")
    return [f"[event {event.id}, {kind}, epoch {event.context_epoch}]\n{excerpt}"]


def _text(event: Event) -> tuple[str, str] | None:
    """What a model read of `event` in its window: (kind, text), or None."""
    match event:
        case UserMessageEvent():
            return "user message", event.data.content
        case AssistantMessageEvent() if event.data.content:
            return "assistant message", event.data.content
        case ToolExecutionCompleteEvent():
            data = event.data
            text = data.result.content if data.result else data.error.message if data.error else ""
            return f"result of {data.tool_name or 'a tool'}", text
        case SessionCompactionCompleteEvent() if event.data.summary_content:
            return "compaction summary", event.data.summary_content
        case _:
            return None


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"\s+", text.lower()) if w]
