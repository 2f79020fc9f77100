"""The OpenAI Chat Completions provider.

One wire format serves OpenAI itself and the OpenAI-compatible servers (Azure's v1 endpoint,
Ollama, vLLM, llama.cpp server, LM Studio), so this module only uses the part of the API they
all share: `chat.completions.create`, streamed or not.
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
    Usage,
)
from trimtab.providers._common import fold_stream, provider_errors, tool_call
from trimtab.providers._config import ProviderConfig
from trimtab.providers._openai_client import OpenAIClient, map_openai_error

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

    from trimtab.events import ToolDefinition

__all__ = ["OpenAIProvider"]


class OpenAIProvider:
    """A `Provider` speaking Chat Completions through the official `openai` client.

    With `type: "azure"` the same wire format goes to Azure OpenAI (see `OpenAIClient`).
    """

    name = "openai"

    def __init__(self, config: ProviderConfig) -> None:
        self._config = config
        self._client = OpenAIClient(config)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        """Answer one request; raise `ProviderError` on any failure."""
        with provider_errors(map_openai_error):
            completions = self._client.get().chat.completions
            body = _body(request, self._client.model(request.model))
            if not request.stream:
                yield _parse_completion(await completions.create(**body, stream=False))
                return
            options: Any = {"include_usage": True}
            chunks = await completions.create(**body, stream=True, stream_options=options)
            stall_timeout = self._config.stall_timeout
            async for event in fold_stream(
                chunks, _StreamState(), stall_timeout=stall_timeout, close=chunks.close
            ):
                yield event

    async def aclose(self) -> None:
        """Close the HTTP client, if one was created."""
        await self._client.aclose()


# --- request ------------------------------------------------------------------------------


def _body(request: ModelRequest, model: str) -> dict[str, Any]:
    """The arguments of `completions.create` for the request, but `stream`, `stream_options`.

    Messages and tools travel in `extra_body`, which the client merges into the JSON body as
    is: given as `messages=` and `tools=`, they would go through the client's typed transform,
    which walks every message and costs ~0.6 ms for a two-message request and ~0.16 ms more
    per message (30 ms per turn at 200 messages), while these are plain JSON already.
    """
    payload: dict[str, Any] = {"messages": [_message(m) for m in request.messages]}
    if request.tools:  # some servers reject an empty list
        payload["tools"] = [_tool(tool) for tool in request.tools]
    # `messages=[]` satisfies the client's required arguments; `extra_body` replaces it.
    body: dict[str, Any] = {"model": model, "messages": [], "extra_body": payload}
    if request.max_tokens is not None:
        # `max_tokens`, not `max_completion_tokens`: the compatible servers know only this one.
        body["max_tokens"] = request.max_tokens
    return body


def _message(message: Message) -> dict[str, Any]:
    # Most OpenAI-compatible servers (vLLM, Ollama, llama.cpp, older Azure API versions) reject
    # the "developer" role, while OpenAI accepts "system" everywhere and treats it as developer
    # instructions on the models that want those.
    role = "system" if message.role == "developer" else message.role
    param: dict[str, Any] = {"role": role, "content": message.content}
    if role == "assistant" and message.tool_calls:
        # Servers differ on "" next to tool calls; null is what OpenAI itself sends.
        param["content"] = message.content or None
        param["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": c.model_dump(include={"name", "arguments"}),
            }
            for c in message.tool_calls
        ]
    if role == "tool":
        param["tool_call_id"] = message.tool_call_id
    return param


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    function = tool.model_dump(include={"name", "description", "parameters"})
    return {"type": "function", "function": function}


# --- response -----------------------------------------------------------------------------


def _parse_completion(completion: ChatCompletion) -> ModelResponse:
    # `getattr`: the client builds models without validation, so a field the server left out
    # is missing rather than None.
    choices = getattr(completion, "choices", None)
    if not choices:
        raise ProviderError("bad_response", "the response has no choices")
    choice = choices[0]
    message = choice.message
    # `function` is None on "custom" tool calls, which we never offer.
    calls = [(call.id, getattr(call, "function", None)) for call in message.tool_calls or ()]
    return ModelResponse(
        content=message.content or "",
        tool_calls=tuple(tool_call(i, f.name, f.arguments) for i, f in calls if f is not None),
        reasoning=_reasoning(message),
        usage=_usage(getattr(completion, "usage", None)),
        finish_reason=choice.finish_reason,
    )


class _StreamState:
    """What the chunks of one stream add up to."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, str]] = []
        """Tool calls (id, name, arguments), which arrive split across chunks."""
        self._calls_by_index: dict[int, dict[str, str]] = {}
        self.usage = Usage()
        self.finish_reason: str | None = None
        self.saw_choice = False

    def add(self, chunk: ChatCompletionChunk) -> list[ProviderEvent]:
        """Fold one chunk in; return the deltas to show as they stream."""
        if getattr(chunk, "usage", None) is not None:
            self.usage = _usage(chunk.usage)
        events: list[ProviderEvent] = []
        for choice in getattr(chunk, "choices", None) or ():
            self.saw_choice = True
            delta = getattr(choice, "delta", None)  # built without validation: may be missing
            if delta is None:
                self.finish_reason = getattr(choice, "finish_reason", None) or self.finish_reason
                continue
            if reasoning := _reasoning(delta):
                self.reasoning.append(reasoning)
                events.append(ReasoningDelta(text=reasoning))
            if delta.content:
                self.text.append(delta.content)
                events.append(TextDelta(text=delta.content))
            for part in delta.tool_calls or ():
                self._add_call_part(part)
            self.finish_reason = choice.finish_reason or self.finish_reason
        return events

    def _add_call_part(self, part: ChoiceDeltaToolCall) -> None:
        call = self._calls_by_index.get(part.index)
        # A new id at a known index is a new call: some servers (Gemini's compatible endpoint)
        # send every parallel call with index 0.
        if call is None or (part.id and call["id"] and part.id != call["id"]):
            call = {"id": "", "name": "", "arguments": ""}
            self._calls_by_index[part.index] = call
            self.calls.append(call)
        call["id"] = call["id"] or part.id or ""
        if part.function is not None:
            call["name"] += part.function.name or ""
            call["arguments"] += part.function.arguments or ""

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
            tool_calls=tuple(tool_call(c["id"], c["name"], c["arguments"]) for c in self.calls),
            reasoning="".join(self.reasoning) if self.reasoning else None,
            usage=self.usage,
            finish_reason=self.finish_reason,
        )


def _reasoning(part: object) -> str | None:
    # Not in the OpenAI schema: DeepSeek and vLLM send `reasoning_content`, OpenRouter and
    # Ollama `reasoning`, as extra fields the client keeps as attributes.
    for field in ("reasoning_content", "reasoning"):
        value = getattr(part, field, None)
        if isinstance(value, str) and value:
            return value
    return None


def _usage(usage: CompletionUsage | None) -> Usage:
    if usage is None:
        return Usage()
    return Usage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)
