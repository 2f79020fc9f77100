"""What a wire format provides to the replay server, and helpers the formats share."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trimtab.testing._replay.conversations import ConversationMessage, ConversationToolCall

__all__ = ["ParsedRequest", "Reply", "WireFormat", "split", "sse", "text_of"]

CREATED = 1_700_000_000
"""A fixed timestamp keeps responses reproducible."""


@dataclass(frozen=True)
class ParsedRequest:
    """A model request in the canonical (Chat Completions) form the matching works on."""

    messages: list[ConversationMessage]
    model: str
    stream: bool
    include_usage: bool = True
    """Chat Completions streams report usage only when asked (`stream_options`)."""


@dataclass(frozen=True)
class Reply:
    """What to answer with, before it is put in a wire format."""

    answer: ConversationMessage
    calls: list[ConversationToolCall]
    """The answer's tool calls, with the ids the client should see."""
    model: str
    input_tokens: int
    output_tokens: int

    @property
    def finish_reason(self) -> str:
        """The recorded finish reason, else `tool_calls` or `stop` (Chat Completions terms)."""
        return self.answer.finish_reason or ("tool_calls" if self.calls else "stop")


@dataclass(frozen=True)
class WireFormat:
    """One wire format: how to read its requests and write its answers and errors."""

    name: str
    suffixes: tuple[str, ...]
    """Request paths end with one of these (so `/v1/...`, `/...` and Azure's paths all work)."""
    parse: Callable[[dict[str, Any]], ParsedRequest]
    """The canonical request; raises ValueError (or pydantic's ValidationError) if malformed."""
    body: Callable[[Reply], dict[str, Any]]
    """The non-streamed answer."""
    events: Callable[[Reply, ParsedRequest, int], list[bytes]]
    """The streamed answer as SSE frames, text split into pieces of the given size."""
    error: Callable[[int, str | None, str | None], dict[str, Any]]
    """The error body for a status, an optional message and an optional error type."""

    def handles(self, path: str) -> bool:
        """Whether a request to `path` is in this format."""
        return path.endswith(self.suffixes)


def split(text: str | None, size: int) -> list[str]:
    """`text` in pieces of `size` characters (none for empty text)."""
    text = text or ""
    return [text[i : i + size] for i in range(0, len(text), size)]


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    """One server-sent event."""
    head = f"event: {event}\n".encode() if event is not None else b""
    return head + b"data: " + json.dumps(data).encode() + b"\n\n"


def text_of(content: Any) -> str:
    """Message content: a string, or a list of parts whose text parts are joined."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""
