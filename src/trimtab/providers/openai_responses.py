"""The OpenAI Responses provider (`wire_api: "responses"`).

The window is sent whole with every request (`store: false`): the session's log is the state,
so no conversation is kept on the server and `previous_response_id` is never used. The system
message goes to `instructions`; developer messages stay in the input with their own role.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trimtab._errors import ProviderError
from trimtab.providers._base import (
    Message,
    ModelRequest,
    ModelResponse,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    Usage,
)
from trimtab.providers._common import (
    answer_within,
    attempt_timeout,
    fold_stream,
    provider_errors,
    require_event_stream,
    stream_error,
    tool_call,
    unexpected_answer,
)
from trimtab.providers._config import ProviderConfig, credentials_environment
from trimtab.providers._openai_client import OpenAIClient

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import httpx2
    from openai.types.responses import Response

__all__ = ["OpenAIResponsesProvider"]

_REASONING_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
"""Open models (gpt-oss on vLLM or Ollama) stream their reasoning; OpenAI's a summary of it."""

_TEXT_DELTAS = ("response.output_text.delta", "response.refusal.delta")
"""A refusal is what the model said instead of an answer: it is shown as the reply."""

_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}
"""Why a response is incomplete, as Chat Completions' finish reasons (others pass as they are)."""


class OpenAIResponsesProvider:
    """A `Provider` speaking the OpenAI Responses API through the official `openai` client."""

    name = "openai-responses"
    native_output = True
    """`ModelRequest.output_schema` goes as the `text.format` (spec OUT6)."""

    def __init__(
        self,
        config: ProviderConfig,
        *,
        env_credentials: bool = False,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        """How the provider was configured."""
        environment = credentials_environment(config, env_credentials=env_credentials)
        self._client = OpenAIClient(config, environment, transport)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        """Answer one request; raise `ProviderError` on any failure."""
        import openai  # imported already, by the client

        with provider_errors(self._client.map_error):
            responses = self._client.get().responses
            body = _body(request, self._client.model(request.model))
            seconds = self.config.deadline(stream=request.stream)
            body["timeout"] = openai.Timeout(**attempt_timeout(seconds))
            if request.headers:
                body["extra_headers"] = request.headers
            if not request.stream:
                async with answer_within(seconds, stream=False):
                    response = await responses.create(**body, stream=False)
                yield _parse_response(response)
                return
            async with answer_within(seconds, stream=True):
                events = await responses.create(**body, stream=True)
                await require_event_stream(events.response)
            stall_timeout = self.config.stall_seconds
            async for event in fold_stream(
                events, _StreamState(), stall_timeout=stall_timeout, close=events.close
            ):
                yield event

    async def aclose(self) -> None:
        """Close the HTTP client, if one was created."""
        await self._client.aclose()


# --- request ------------------------------------------------------------------------------


def _body(request: ModelRequest, model: str) -> dict[str, Any]:
    """The request's fields, but for `stream`."""
    instructions = [m.content for m in request.messages if m.role == "system"]
    body: dict[str, Any] = {
        "model": model,
        "input": [item for m in request.messages for item in _items(m)],
        "store": False,
    }
    if instructions:
        body["instructions"] = "\n\n".join(instructions)
    if request.tools:
        body["tools"] = [
            {"type": "function", "strict": False, **tool.model_dump(include=_TOOL_FIELDS)}
            for tool in request.tools
        ]
    if request.max_tokens is not None:
        body["max_output_tokens"] = request.max_tokens
    if request.reasoning_effort is not None:
        body["reasoning"] = {"effort": request.reasoning_effort}
    if request.tool_choice is not None and request.tools:
        body["tool_choice"] = request.tool_choice
    if request.output_schema is not None:
        # Not `strict`, as for Chat Completions: the reply is checked here (spec OUT6).
        fmt = {"type": "json_schema", "name": "result", "schema": request.output_schema}
        body["text"] = {"format": {**fmt, "strict": False}}
    return body


_TOOL_FIELDS = {"name", "description", "parameters"}


def _items(message: Message) -> list[dict[str, Any]]:
    """The input items of one message (system messages go to `instructions` instead)."""
    match message.role:
        case "system":
            return []
        case "user" if message.images:  # the text, then each image (spec D14)
            parts: list[dict[str, Any]] = [{"type": "input_text", "text": message.content}]
            parts += [
                {"type": "input_image", "image_url": f"data:{i.mime_type};base64,{i.data}"}
                for i in message.images
            ]
            return [{"role": "user", "content": parts}]
        case "developer" | "user":
            return [{"role": message.role, "content": message.content}]
        case "assistant":
            items: list[dict[str, Any]] = []
            if message.content or not message.tool_calls:
                items.append({"role": "assistant", "content": message.content})
            items += [_function_call(call) for call in message.tool_calls]
            return items
        case "tool":
            return [
                {
                    "type": "function_call_output",
                    "call_id": message.tool_call_id,
                    "output": message.content,
                }
            ]


def _function_call(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }


# --- response -----------------------------------------------------------------------------


def _parse_response(response: Response) -> ModelResponse:
    """The `ModelResponse` of a complete (non-streamed) response object."""
    output = getattr(response, "output", None)
    if not isinstance(output, list):
        # The client builds whatever came (an error object, even a text) into a `Response`.
        raise unexpected_answer(_as_data(response), "a Responses API response")
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    # `getattr` throughout: the client builds models without validation, so fields a
    # compatible server leaves out are missing rather than None.
    for item in output:
        match getattr(item, "type", None):
            case "message":
                for part in getattr(item, "content", None) or ():
                    text.append(getattr(part, "text", None) or getattr(part, "refusal", "") or "")
            case "function_call":
                call_id, name = getattr(item, "call_id", None), getattr(item, "name", "")
                calls.append(tool_call(call_id, name, getattr(item, "arguments", "")))
            case "reasoning":
                parts = [
                    *(getattr(item, "content", None) or ()),
                    *(getattr(item, "summary", None) or ()),
                ]
                reasoning += [getattr(part, "text", "") or "" for part in parts]
            case _:
                pass  # built-in tools' items: never requested
    return _response("".join(text), tuple(calls), "".join(reasoning), response)


def _as_data(response: object) -> object:
    """What the server sent, as far as the client kept it: JSON data, or a text."""
    to_dict = getattr(response, "to_dict", None)
    return to_dict() if callable(to_dict) else response


def _response(
    text: str, calls: tuple[ToolCall, ...], reasoning: str, response: Response
) -> ModelResponse:
    usage = getattr(response, "usage", None)
    details = getattr(usage, "input_tokens_details", None)
    return ModelResponse(
        content=text,
        tool_calls=calls,
        reasoning=reasoning or None,
        usage=Usage(
            input_tokens=getattr(usage, "input_tokens", None),
            output_tokens=getattr(usage, "output_tokens", None),
            cache_read_tokens=getattr(details, "cached_tokens", None),
        ),
        finish_reason=_finish_reason(response, bool(calls)),
    )


def _finish_reason(response: Response, has_calls: bool) -> str | None:
    """The response's status as a finish reason; a failed response raises."""
    status = getattr(response, "status", None)
    if status == "failed":
        error = getattr(response, "error", None)
        raise stream_error(getattr(error, "code", None), getattr(error, "message", "failed"))
    if status == "incomplete":
        reason = getattr(getattr(response, "incomplete_details", None), "reason", None)
        return _INCOMPLETE.get(reason or "", reason or "incomplete")
    if status in (None, "completed"):
        return "tool_calls" if has_calls else "stop"
    return str(status)  # a status this code does not know: passed on as it is


class _StreamState:
    """What the events of one stream add up to."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        """Function calls by output index (id, name, arguments)."""
        self.final: Response | None = None
        """The response of the `response.completed` (or `.incomplete`) event."""
        self._deltas: dict[int, list[str]] = {}
        """The argument deltas of each call not yet done, by output index."""

    def add(self, event: Any) -> list[ProviderEvent]:
        """Fold one event in; return the deltas to show as they stream."""
        # `getattr` with defaults: the client builds events without validation.
        kind = getattr(event, "type", None)
        delta = str(getattr(event, "delta", None) or "")
        index = int(getattr(event, "output_index", None) or 0)
        if kind in _TEXT_DELTAS and delta:
            self.text.append(delta)
            return [TextDelta(text=delta)]
        if kind in _REASONING_DELTAS and delta:
            self.reasoning.append(delta)
            return [ReasoningDelta(text=delta)]
        if kind in ("response.output_item.added", "response.output_item.done"):
            self._add_item(index, getattr(event, "item", None))
        elif kind == "response.function_call_arguments.delta":
            # Joined once complete: appending to the string copies it every time.
            self._deltas.setdefault(index, []).append(delta)
        elif kind == "response.function_call_arguments.done":
            arguments = getattr(event, "arguments", None)
            if isinstance(arguments, str):
                self._call(index)["arguments"] = arguments
                self._deltas.pop(index, None)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self.final = getattr(event, "response", None)
        elif kind == "error":
            raise stream_error(getattr(event, "code", None), getattr(event, "message", "error"))
        # Any other event (created, in_progress, content_part.*, *.done, new kinds) adds
        # nothing that the deltas and the items do not carry.
        return []

    def _call(self, index: int) -> dict[str, str]:
        return self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})

    def _add_item(self, index: int, item: Any) -> None:
        if getattr(item, "type", None) != "function_call":
            return
        call = self._call(index)
        call["id"] = getattr(item, "call_id", None) or call["id"]
        call["name"] = getattr(item, "name", None) or call["name"]
        # The finished item's arguments are the whole text; the added item's are empty.
        if arguments := getattr(item, "arguments", None):
            call["arguments"] = arguments
            self._deltas.pop(index, None)

    def response(self) -> ModelResponse:
        """The final response; raise if the stream stopped before the response completed."""
        if self.final is None:
            raise ProviderError(
                "provider_unavailable",
                "the stream ended before the response was complete",
                retryable=True,
            )
        for index, deltas in self._deltas.items():  # calls whose whole text never came
            self._call(index)["arguments"] += "".join(deltas)
        calls = tuple(
            tool_call(c["id"], c["name"], c["arguments"]) for _, c in sorted(self.calls.items())
        )
        return _response("".join(self.text), calls, "".join(self.reasoning), self.final)
