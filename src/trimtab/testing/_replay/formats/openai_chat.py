"""OpenAI Chat Completions: `POST /v1/chat/completions` (also Azure's deployment paths).

This is the canonical form itself, so reading a request is mostly validation.
"""

from __future__ import annotations

from typing import Any

from trimtab.testing._replay.conversations import (
    ConversationFunction,
    ConversationMessage,
    ConversationToolCall,
)
from trimtab.testing._replay.formats._base import (
    CREATED,
    ParsedRequest,
    Reply,
    WireFormat,
    split,
    sse,
    text_of,
)

__all__ = ["OPENAI_CHAT", "openai_error"]


def _parse(body: dict[str, Any]) -> ParsedRequest:
    """The request's messages; unknown fields (such as `name`) are ignored."""
    messages = [
        ConversationMessage(
            role=m.get("role"),
            content=text_of(m.get("content")),
            tool_calls=[
                ConversationToolCall(
                    id=c.get("id", ""), function=ConversationFunction(**c.get("function", {}))
                )
                for c in m.get("tool_calls") or ()
            ],
            tool_call_id=m.get("tool_call_id"),
        )
        for m in body.get("messages", [])
    ]
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    return ParsedRequest(
        messages, str(body.get("model", "")), bool(body.get("stream")), include_usage
    )


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }


def _body(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.answer.content}
    if reply.calls:
        message["tool_calls"] = [c.model_dump() for c in reply.calls]
    if reply.answer.reasoning_content is not None:
        message["reasoning_content"] = reply.answer.reasoning_content
    choice = {"index": 0, "message": message, "finish_reason": reply.finish_reason}
    return {
        "id": "chatcmpl-replay",
        "object": "chat.completion",
        "created": CREATED,
        "model": reply.model,
        "choices": [choice],
        "usage": _usage(reply),
    }


def _events(reply: Reply, request: ParsedRequest, size: int) -> list[bytes]:
    """The stream's chunks, split the way real servers split them."""
    base = {
        "id": "chatcmpl-replay",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": reply.model,
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    answer = reply.answer
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": p}) for p in split(answer.reasoning_content, size)]
    chunks += [chunk({"content": piece}) for piece in split(answer.content, size)]
    for index, call in enumerate(reply.calls):
        # The name comes only in a call's first chunk; the arguments follow in pieces.
        head = {"name": call.function.name, "arguments": ""}
        chunks.append(chunk(_call_delta(index, id=call.id, type="function", function=head)))
        chunks += [
            chunk(_call_delta(index, function={"arguments": piece}))
            for piece in split(call.function.arguments, size)
        ]
    chunks.append(chunk({}, reply.finish_reason))
    if request.include_usage:
        chunks.append({**base, "choices": [], "usage": _usage(reply)})
    return [*(sse(c) for c in chunks), b"data: [DONE]\n\n"]


def _call_delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, **fields}]}


_ERRORS: dict[int, tuple[str, str, str]] = {
    400: ("invalid_request_error", "invalid_request", "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "permission_denied", "Permission denied."),
    404: ("invalid_request_error", "not_found", "Not found."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached; please retry."),
}


def openai_error(status: int, message: str | None, kind: str | None) -> dict[str, Any]:
    """OpenAI's error body (the Responses API uses the same)."""
    default = ("server_error", "server_error", "The server had an error.")
    error_type, code, text = _ERRORS.get(status, default)
    return {"error": {"message": message or text, "type": kind or error_type, "code": code}}


OPENAI_CHAT = WireFormat(
    name="openai-chat",
    suffixes=("/chat/completions",),
    parse=_parse,
    body=_body,
    events=_events,
    error=openai_error,
)
"""The Chat Completions format."""
