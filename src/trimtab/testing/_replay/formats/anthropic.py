"""Anthropic Messages: `POST /v1/messages`.

Requests are converted to the canonical form: the `system` parameter becomes system messages,
`tool_use` blocks tool calls, and each `tool_result` block a tool message. Answers are
converted back into content blocks (thinking, text, tool_use) or their stream of events.
"""

from __future__ import annotations

import json
from typing import Any

from trimtab.testing._replay.conversations import (
    ConversationFunction,
    ConversationMessage,
    ConversationToolCall,
)
from trimtab.testing._replay.formats._base import (
    ParsedRequest,
    Reply,
    WireFormat,
    split,
    sse,
    text_of,
)

__all__ = ["ANTHROPIC"]

_STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}
"""Chat Completions' finish reasons as stop reasons; any other is sent as it is."""


def _parse(body: dict[str, Any]) -> ParsedRequest:
    system = body.get("system")
    blocks = [{"type": "text", "text": system}] if isinstance(system, str) else system or []
    messages = [ConversationMessage(role="system", content=text_of([b])) for b in blocks]
    for message in body.get("messages", []):
        messages += _canonical(message.get("role"), message.get("content"))
    return ParsedRequest(messages, str(body.get("model", "")), bool(body.get("stream")))


def _canonical(role: Any, content: Any) -> list[ConversationMessage]:
    """One Messages API message as canonical messages."""
    if isinstance(content, str):
        return [ConversationMessage(role=role, content=content)]
    results: list[ConversationMessage] = []
    texts: list[str] = []
    calls: list[ConversationToolCall] = []
    for block in content or ():
        match block.get("type"):
            case "text":
                texts.append(block.get("text", ""))
            case "tool_use":
                function = ConversationFunction(
                    name=block["name"], arguments=json.dumps(block.get("input", {}))
                )
                calls.append(ConversationToolCall(id=block["id"], function=function))
            case "tool_result":
                content = text_of(block.get("content"))
                results.append(
                    ConversationMessage(
                        role="tool", tool_call_id=block["tool_use_id"], content=content
                    )
                )
            case _:
                pass  # thinking and images are not matched
    if role == "assistant":
        return [ConversationMessage(role=role, content="".join(texts), tool_calls=calls or None)]
    # A client merges consecutive user messages into one (the API wants turns to alternate):
    # each text block is one of them.
    return results + [ConversationMessage(role=role, content=text) for text in texts]


def _input(arguments: str) -> Any:
    # `input` is an object on the wire; recorded arguments that are not JSON are sent as the
    # text itself, the nearest a non-streamed answer can get to a model's invalid JSON.
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _message(reply: Reply, content: list[dict[str, Any]], stop: str | None) -> dict[str, Any]:
    return {
        "id": "msg_replay",
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }


def _stop_reason(reply: Reply) -> str:
    return _STOP_REASONS.get(reply.finish_reason, reply.finish_reason)


def _body(reply: Reply) -> dict[str, Any]:
    answer = reply.answer
    content: list[dict[str, Any]] = []
    if answer.reasoning_content:
        content.append({"type": "thinking", "thinking": answer.reasoning_content})
        content[-1]["signature"] = "replay"
    if answer.content:
        content.append({"type": "text", "text": answer.content})
    content += [
        {
            "type": "tool_use",
            "id": call.id,
            "name": call.function.name,
            "input": _input(call.function.arguments),
        }
        for call in reply.calls
    ]
    return _message(reply, content, _stop_reason(reply))


def _events(reply: Reply, request: ParsedRequest, size: int) -> list[bytes]:
    answer = reply.answer
    start = _message(reply, [], None)
    start["usage"] = {"input_tokens": reply.input_tokens, "output_tokens": 1}
    events = [_event("message_start", message=start), _event("ping")]
    # (the empty block at its start, the type and field of its deltas, the pieces)
    blocks: list[tuple[dict[str, Any], str, str, list[str]]] = []
    if answer.reasoning_content:
        thinking = {"type": "thinking", "thinking": "", "signature": ""}
        blocks.append(
            (thinking, "thinking_delta", "thinking", split(answer.reasoning_content, size))
        )
    if answer.content:
        blocks.append(
            ({"type": "text", "text": ""}, "text_delta", "text", split(answer.content, size))
        )
    for call in reply.calls:
        empty: dict[str, Any] = {"type": "tool_use", "id": call.id, "name": call.function.name}
        empty["input"] = {}
        pieces = split(call.function.arguments, size)
        blocks.append((empty, "input_json_delta", "partial_json", pieces))
    for index, (empty, delta_type, field, pieces) in enumerate(blocks):
        events.append(_event("content_block_start", index=index, content_block=empty))
        events += [
            _event("content_block_delta", index=index, delta={"type": delta_type, field: piece})
            for piece in pieces
        ]
        events.append(_event("content_block_stop", index=index))
    delta = {"stop_reason": _stop_reason(reply), "stop_sequence": None}
    events.append(
        _event("message_delta", delta=delta, usage={"output_tokens": reply.output_tokens})
    )
    events.append(_event("message_stop"))
    return events


def _event(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _error(status: int, message: str | None, kind: str | None) -> dict[str, Any]:
    default = "api_error" if status >= 500 else "invalid_request_error"
    error_type = kind or _ERROR_TYPES.get(status, default)
    text = message or error_type.replace("_", " ").capitalize()
    return {"type": "error", "error": {"type": error_type, "message": text}}


ANTHROPIC = WireFormat(
    name="anthropic",
    suffixes=("/messages",),
    parse=_parse,
    body=_body,
    events=_events,
    error=_error,
)
"""The Anthropic Messages format."""
