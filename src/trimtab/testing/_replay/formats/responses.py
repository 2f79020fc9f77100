"""OpenAI Responses: `POST /v1/responses` (also Azure's `/openai/responses`).

Requests are converted to the canonical form: `instructions` becomes the system message,
`function_call` items the tool calls of the assistant message they follow, and
`function_call_output` items tool messages. Answers become output items (reasoning, message,
function calls), or the events that build them.
"""

from __future__ import annotations

from collections.abc import Iterator
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
from trimtab.testing._replay.formats.openai_chat import openai_error

__all__ = ["RESPONSES"]

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
"""Finish reasons that make a response `incomplete`, and the reason given for it."""


def _parse(body: dict[str, Any]) -> ParsedRequest:
    messages: list[ConversationMessage] = []
    if instructions := body.get("instructions"):
        messages.append(ConversationMessage(role="system", content=str(instructions)))
    items = body.get("input") or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items:
        _add_item(messages, item)
    return ParsedRequest(messages, str(body.get("model", "")), bool(body.get("stream")))


def _add_item(messages: list[ConversationMessage], item: dict[str, Any]) -> None:
    match item.get("type", "message"):
        case "message":
            content = text_of(item.get("content"))
            messages.append(ConversationMessage(role=item.get("role"), content=content))
        case "function_call":
            function = ConversationFunction(
                name=item["name"], arguments=item.get("arguments") or ""
            )
            call = ConversationToolCall(id=item.get("call_id", ""), function=function)
            last = messages[-1] if messages else None
            # A message with text and calls is a message item followed by function_call items.
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or ()), call]
            else:
                messages.append(
                    ConversationMessage(role="assistant", content="", tool_calls=[call])
                )
        case "function_call_output":
            output = item.get("output")
            messages.append(
                ConversationMessage(
                    role="tool", tool_call_id=item.get("call_id"), content=text_of(output)
                )
            )
        case _:
            pass  # reasoning items and the like are not matched


def _items(reply: Reply) -> Iterator[dict[str, Any]]:
    """The answer's output items, complete."""
    answer = reply.answer
    if answer.reasoning_content:
        text = {"type": "reasoning_text", "text": answer.reasoning_content}
        yield {"type": "reasoning", "id": "rs_replay", "summary": [], "content": [text]}
    if answer.content:
        part = {"type": "output_text", "text": answer.content, "annotations": []}
        yield {
            "type": "message",
            "id": "msg_replay",
            "role": "assistant",
            "status": "completed",
            "content": [part],
        }
    for index, call in enumerate(reply.calls):
        yield {
            "type": "function_call",
            "id": f"fc_replay_{index}",
            "call_id": call.id,
            "name": call.function.name,
            "arguments": call.function.arguments,
            "status": "completed",
        }


def _body(reply: Reply) -> dict[str, Any]:
    reason = _INCOMPLETE.get(reply.finish_reason)
    if reason is None and reply.finish_reason not in ("stop", "tool_calls"):
        reason = reply.finish_reason  # a reason this API does not have: sent as it is
    return {
        "id": "resp_replay",
        "object": "response",
        "created_at": CREATED,
        "status": "completed" if reason is None else "incomplete",
        "incomplete_details": None if reason is None else {"reason": reason},
        "error": None,
        "model": reply.model,
        "output": list(_items(reply)),
        "usage": {
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        },
    }


def _events(reply: Reply, request: ParsedRequest, size: int) -> list[bytes]:
    final = _body(reply)
    start = {**final, "status": "in_progress", "output": [], "incomplete_details": None}
    frames: list[dict[str, Any]] = [{"type": "response.created", "response": start}]
    for index, item in enumerate(final["output"]):
        frames += _item_events(index, item, size)
    done = "response.completed" if final["status"] == "completed" else "response.incomplete"
    frames.append({"type": done, "response": final})
    return [
        sse({**frame, "sequence_number": number}, event=frame["type"])
        for number, frame in enumerate(frames)
    ]


def _item_events(index: int, item: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """The events that build one output item, from `added` to `done`."""
    where = {"item_id": item["id"], "output_index": index}
    match item["type"]:
        case "reasoning":
            empty = {**item, "content": []}
            pieces = split(item["content"][0]["text"], size)
            deltas = [
                {"type": "response.reasoning_text.delta", **where, "content_index": 0, "delta": p}
                for p in pieces
            ]
        case "message":
            empty = {**item, "status": "in_progress", "content": []}
            deltas = [
                {"type": "response.output_text.delta", **where, "content_index": 0, "delta": p}
                for p in split(item["content"][0]["text"], size)
            ]
        case _:
            empty = {**item, "status": "in_progress", "arguments": ""}
            deltas = [
                {"type": "response.function_call_arguments.delta", **where, "delta": piece}
                for piece in split(item["arguments"], size)
            ]
            deltas.append(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "arguments": item["arguments"],
                }
            )
    added = {"type": "response.output_item.added", "output_index": index, "item": empty}
    done = {"type": "response.output_item.done", "output_index": index, "item": item}
    return [added, *deltas, done]


RESPONSES = WireFormat(
    name="openai-responses",
    suffixes=("/responses",),
    parse=_parse,
    body=_body,
    events=_events,
    error=openai_error,
)
"""The Responses format."""
