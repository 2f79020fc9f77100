"""The OpenAI Chat Completions provider.

One wire format serves OpenAI itself and the OpenAI-compatible servers (Azure's v1 endpoint,
Ollama, vLLM, llama.cpp server, LM Studio), so this module only uses the part of the API they
all share: `POST /chat/completions`, streamed or not, over plain HTTP (see `ChatClient`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _string  # a str as a JSON literal, in C
from typing import TYPE_CHECKING, Any

from trimtab._errors import ProviderError
from trimtab.providers._base import (
    Message,
    ModelRequest,
    ModelResponse,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    Usage,
)
from trimtab.providers._common import (
    fold_stream,
    provider_errors,
    tool_call,
    unexpected_answer,
)
from trimtab.providers._config import ProviderConfig, credentials_environment
from trimtab.providers._openai_client import ChatClient, stream_events

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import httpx2

    from trimtab.events import ToolDefinition

__all__ = ["OpenAIProvider"]


class OpenAIProvider:
    """A `Provider` speaking Chat Completions, as the official `openai` client does.

    With `type: "azure"` the same wire format goes to Azure OpenAI (see `ChatClient`).
    `env_credentials`: see `make_provider`.
    """

    name = "openai"
    native_output = True
    """`ModelRequest.output_schema` goes as `response_format` (spec OUT6)."""

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
        self._client = ChatClient(config, environment, transport)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        """Answer one request; raise `ProviderError` on any failure."""
        with provider_errors():
            model = self._client.model(request.model)
            try:
                body = _body(request, model)
            except ValueError as exc:  # not the server's answer: what this side would send
                raise ProviderError(
                    "bad_request", f"the request cannot be written: {exc}"
                ) from None
            if not request.stream:
                answer = await self._client.post(body, model=model, headers=request.headers)
                try:
                    completion = json.loads(answer)
                except ValueError:
                    text = answer.decode(errors="replace")
                    raise unexpected_answer(text, "a chat completion in JSON") from None
                yield _parse_completion(completion)
                return
            response = await self._client.open_stream(body, model=model, headers=request.headers)
            async for event in fold_stream(
                stream_events(response),
                _StreamState(),
                stall_timeout=self.config.stall_seconds,
                close=response.aclose,
            ):
                yield event

    async def aclose(self) -> None:
        """Close the HTTP client, if one was created."""
        await self._client.aclose()


# --- request ------------------------------------------------------------------------------


def _body(request: ModelRequest, model: str) -> bytes:
    """The request's JSON body.

    The messages, the part that grows with the conversation, are written as JSON text one by
    one rather than built as dicts for one `json.dumps`: a long session's request then makes a
    short string per message instead of a dict (and a list and its parts) per message, which
    in a long-running server kept the memory growing a little on every turn.
    """
    fields: dict[str, Any] = {"model": model, "stream": request.stream}
    if request.stream:
        fields["stream_options"] = {"include_usage": True}
    if request.tools:  # some servers reject an empty list
        fields["tools"] = [_tool(tool) for tool in request.tools]
    if request.max_tokens is not None:
        # `max_tokens`, not `max_completion_tokens`: the compatible servers know only this one.
        fields["max_tokens"] = request.max_tokens
    if request.reasoning_effort is not None:
        fields["reasoning_effort"] = request.reasoning_effort
    if request.tool_choice is not None and request.tools:
        fields["tool_choice"] = request.tool_choice
    if request.output_schema is not None:
        # Not `strict`: it refuses schemas that are not closed (`additionalProperties`), and
        # the reply is checked here in any case (spec OUT6).
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "result", "schema": request.output_schema},
        }
    messages = ",".join([_message(m) for m in request.messages])
    # `fields` is never empty, so its JSON goes on after its opening brace.
    return f'{{"messages":[{messages}],{_json(fields)[1:]}'.encode()


def _message(message: Message) -> str:
    """One message as JSON text (see `_body`)."""
    # Most OpenAI-compatible servers (vLLM, Ollama, llama.cpp, older Azure API versions) reject
    # the "developer" role, while OpenAI accepts "system" everywhere and treats it as developer
    # instructions on the models that want those.
    role = "system" if message.role == "developer" else message.role
    content = _string(message.content)
    if role == "assistant" and message.tool_calls:
        # Servers differ on "" next to tool calls; null is what OpenAI itself sends.
        content = content if message.content else "null"
        calls = ",".join(
            f'{{"id":{_string(c.id)},"type":"function","function":'
            f'{{"name":{_string(c.name)},"arguments":{_string(c.arguments)}}}}}'
            for c in message.tool_calls
        )
        return f'{{"role":"assistant","content":{content},"tool_calls":[{calls}]}}'
    if message.images:  # a user message's (spec D14): the text, then each image
        parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}]
        parts += [
            {"type": "image_url", "image_url": {"url": f"data:{i.mime_type};base64,{i.data}"}}
            for i in message.images
        ]
        return f'{{"role":"{role}","content":{_json(parts)}}}'
    if role == "tool":
        call_id = _json(message.tool_call_id)
        return f'{{"role":"tool","content":{content},"tool_call_id":{call_id}}}'
    return f'{{"role":"{role}","content":{content}}}'


def _json(value: Any) -> str:
    # As the HTTP client would encode a body: compact, UTF-8 rather than \u escapes.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    function = tool.model_dump(include={"name", "description", "parameters"})
    return {"type": "function", "function": function}


# --- response -----------------------------------------------------------------------------


def _parse_completion(completion: Any) -> ModelResponse:
    """The response a completion adds up to.

    We ask for one choice, but the Copilot API (and proxies in front of it) send one answer
    split over several: the text in one, tool calls in others. They are parts of one reply,
    read in order, so that no tool call is lost (spec D3).
    """
    choices = completion.get("choices") if isinstance(completion, dict) else None
    if not choices or not all(isinstance(choice, dict) for choice in choices):
        raise unexpected_answer(completion, "a chat completion with choices")
    messages = [choice.get("message") or {} for choice in choices]
    # No `function` on "custom" tool calls, which we never offer.
    calls = [
        (call.get("id"), call.get("function"))
        for message in messages
        for call in message.get("tool_calls") or ()
    ]
    reasoning = [r for message in messages if (r := _reasoning(message))]
    finish = [f for choice in choices if (f := choice.get("finish_reason"))]
    return ModelResponse(
        content="\n\n".join(text for message in messages if (text := message.get("content"))),
        tool_calls=tuple(
            tool_call(i, f.get("name") or "", f.get("arguments")) for i, f in calls if f
        ),
        reasoning="".join(reasoning) if reasoning else None,
        usage=_usage(completion.get("usage")),
        # A reply that calls tools ends by calling them, whichever part said so.
        finish_reason="tool_calls" if "tool_calls" in finish else (finish[0] if finish else None),
    )


class _StreamState:
    """What the chunks of one stream add up to."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[_CallParts] = []
        """Tool calls, which arrive split across chunks."""
        self._calls_by_index: dict[tuple[int, int], _CallParts] = {}
        self.usage = Usage()
        self.finish_reason: str | None = None
        self.saw_choice = False

    def add(self, chunk: dict[str, Any]) -> list[ProviderEvent]:
        """Fold one chunk in; return the deltas to show as they stream."""
        if chunk.get("usage") is not None:
            self.usage = _usage(chunk["usage"])
        events: list[ProviderEvent] = []
        # Every choice is a part of the one reply (see `_parse_completion`), folded in.
        for choice in chunk.get("choices") or ():
            self.saw_choice = True
            self._finish(choice.get("finish_reason"))
            delta = choice.get("delta")
            if delta is None:
                continue
            if reasoning := _reasoning(delta):
                self.reasoning.append(reasoning)
                events.append(ReasoningDelta(text=reasoning))
            if content := delta.get("content"):
                self.text.append(content)
                events.append(TextDelta(text=content))
            for part in delta.get("tool_calls") or ():
                self._add_call_part(choice.get("index", 0), part)
        return events

    def _finish(self, reason: str | None) -> None:
        # A reply that calls tools ends by calling them, whichever part said so.
        if reason and self.finish_reason != "tool_calls":
            self.finish_reason = reason

    def _add_call_part(self, choice: int, part: dict[str, Any]) -> None:
        index, call_id = (choice, part.get("index", 0)), part.get("id")
        call = self._calls_by_index.get(index)
        # A new id at a known index is a new call: some servers (Gemini's compatible endpoint)
        # send every parallel call with index 0.
        if call is None or (call_id and call.id and call_id != call.id):
            call = _CallParts()
            self._calls_by_index[index] = call
            self.calls.append(call)
        call.id = call.id or call_id or ""
        if function := part.get("function"):
            call.name.append(function.get("name") or "")
            call.arguments.append(function.get("arguments") or "")

    def response(self) -> ModelResponse:
        """The final response; raise if the stream carried no answer, or stopped mid-way."""
        if not self.saw_choice:
            raise ProviderError("bad_response", "the stream ended without any choice")
        if self.finish_reason is None:
            # Every server ends a choice with a finish reason; a stream without one was cut
            # short (the client library does not tell a missing `[DONE]` from a present one).
            raise ProviderError(
                "provider_unavailable",
                "the stream ended before the response was complete",
                retryable=True,
            )
        return ModelResponse(
            content="".join(self.text),
            tool_calls=tuple(
                tool_call(c.id, "".join(c.name), "".join(c.arguments)) for c in self.calls
            ),
            reasoning="".join(self.reasoning) if self.reasoning else None,
            usage=self.usage,
            finish_reason=self.finish_reason,
        )


@dataclass(slots=True)
class _CallParts:
    """One streamed tool call's parts, joined once it is complete: appending to a string
    held in a dict copies it every time (a long call's arguments took time as the square of
    their length)."""

    id: str = ""
    name: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)


def _reasoning(part: dict[str, Any]) -> str | None:
    # Not in the OpenAI schema: DeepSeek and vLLM send `reasoning_content`, OpenRouter and
    # Ollama `reasoning`.
    for key in ("reasoning_content", "reasoning"):
        value = part.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _usage(usage: dict[str, Any] | None) -> Usage:
    if usage is None:
        return Usage()
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        input_tokens=usage.get("prompt_tokens"),
        output_tokens=usage.get("completion_tokens"),
        cache_read_tokens=cached,
    )
