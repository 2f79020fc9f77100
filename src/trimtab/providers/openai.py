"""The OpenAI Chat Completions provider.

One wire format serves OpenAI itself and the OpenAI-compatible servers (Azure's v1 endpoint,
Ollama, vLLM, llama.cpp server, LM Studio), so this module only uses the part of the API they
all share: `chat.completions.create`, streamed or not.
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from typing import TYPE_CHECKING, Any

import openai

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
from trimtab.providers._config import ProviderConfig

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from openai import AsyncStream
    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

    from trimtab.events import ToolDefinition

__all__ = ["OpenAIProvider"]

_PLACEHOLDER_KEY = "unused"
"""Sent to keyless local servers: the client library refuses to start without some key."""

_CONTEXT_LENGTH = re.compile(
    r"context[ _]?(length|size|window)|maximum context|too many tokens|prompt is too long", re.I
)
"""What vLLM, llama.cpp, LM Studio and OpenAI say when the prompt does not fit."""


class OpenAIProvider:
    """A `Provider` speaking Chat Completions through the official `openai` client."""

    name = "openai"

    def __init__(self, config: ProviderConfig) -> None:
        self._config = config
        self._client: openai.AsyncOpenAI | None = None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        """Answer one request; raise `ProviderError` on any failure."""
        try:
            completions = self._get_client().chat.completions
            if not request.stream:
                yield _parse_completion(await completions.create(**_body(request), stream=False))
                return
            options: Any = {"include_usage": True}
            chunks = await completions.create(**_body(request), stream=True, stream_options=options)
            state = _StreamState()
            try:
                while (chunk := await _next_chunk(chunks, self._config.stall_timeout)) is not None:
                    for event in state.add(chunk):
                        yield event
            finally:
                await chunks.close()
            yield state.response()
        except openai.OpenAIError as exc:
            raise _map_error(exc) from exc
        except ValueError as exc:
            # Only parsing the server's bytes raises ValueError here (JSONDecodeError in a
            # stream or a body, pydantic's ValidationError on a malformed field).
            raise ProviderError("bad_response", f"malformed response: {exc}") from exc

    async def aclose(self) -> None:
        """Close the HTTP client, if one was created."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    def _get_client(self) -> openai.AsyncOpenAI:
        # Created on first use so that building a provider never touches the network or the
        # environment, and a provider that is never called costs nothing.
        if self._client is None:
            config = self._config
            api_key = config.api_key or os.environ.get("OPENAI_API_KEY")
            if api_key is None and config.base_url is None:
                raise ProviderError("authentication", "no API key: set api_key or OPENAI_API_KEY")
            self._client = openai.AsyncOpenAI(
                api_key=api_key or _PLACEHOLDER_KEY,
                base_url=config.base_url,
                timeout=openai.DEFAULT_TIMEOUT if config.timeout is None else config.timeout,
                max_retries=config.max_retries,
                default_headers=config.headers,
            )
        return self._client


# --- request ------------------------------------------------------------------------------


def _body(request: ModelRequest) -> dict[str, Any]:
    """The request's fields, but for `stream` and `stream_options`."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [_message(m) for m in request.messages],
    }
    if request.tools:  # some servers reject an empty list
        body["tools"] = [_tool(tool) for tool in request.tools]
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
        tool_calls=tuple(_tool_call(i, f.name, f.arguments) for i, f in calls if f is not None),
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
            delta = choice.delta
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
        """The final response; raise `bad_response` if the stream carried no answer at all."""
        if not self.saw_choice:
            raise ProviderError("bad_response", "the stream ended without any choice")
        return ModelResponse(
            content="".join(self.text),
            tool_calls=tuple(_tool_call(c["id"], c["name"], c["arguments"]) for c in self.calls),
            reasoning="".join(self.reasoning) if self.reasoning else None,
            usage=self.usage,
            finish_reason=self.finish_reason,
        )


async def _next_chunk(
    chunks: AsyncStream[ChatCompletionChunk], stall_timeout: float | None
) -> ChatCompletionChunk | None:
    """The next chunk, or None at the end; fail with `timeout` if none comes in time."""
    try:
        async with asyncio.timeout(stall_timeout):
            return await anext(chunks)
    except StopAsyncIteration:
        return None
    except TimeoutError:
        raise ProviderError(
            "timeout", f"the stream stalled: no data for {stall_timeout} s", retryable=True
        ) from None


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


def _tool_call(call_id: str | None, name: str, arguments: str | None) -> ToolCall:
    # Some local servers omit ids; the loop needs one to pair each result with its call.
    call_id = call_id or f"call_{uuid.uuid4().hex[:24]}"
    return ToolCall(id=call_id, name=name, arguments=arguments or "")


# --- errors -------------------------------------------------------------------------------


def _map_error(exc: openai.OpenAIError) -> ProviderError:
    """The `ProviderError` for an exception of the client (after its own retries)."""
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError("timeout", "the request timed out", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        host = exc.request.url.host  # not the whole URL: it may hold a key in its query
        message = f"cannot reach {host}: {cause}"
        return ProviderError("provider_unavailable", message, retryable=True)
    if isinstance(exc, openai.APIStatusError):
        return _map_status_error(exc)
    if isinstance(exc, openai.APIError):
        # An `error` object inside a 200 stream: the server failed while generating.
        return ProviderError(
            "provider_unavailable", f"the stream failed: {exc.message}", retryable=True
        )
    return ProviderError("bad_request", str(exc))


def _map_status_error(exc: openai.APIStatusError) -> ProviderError:
    status = exc.status_code
    body = exc.body if isinstance(exc.body, dict) else {}
    detail = body.get("message") if isinstance(body.get("message"), str) else exc.message
    message = f"HTTP {status}: {detail}"
    if status == 429:
        # Out of quota is a 429 too, but waiting does not help it.
        retryable = exc.code != "insufficient_quota"
        retry_after = _retry_after(exc)
        return ProviderError(
            "rate_limit", message, status_code=status, retryable=retryable, retry_after=retry_after
        )
    if status in (401, 403):
        return ProviderError("authentication", message, status_code=status)
    if status == 408:
        return ProviderError("timeout", message, status_code=status, retryable=True)
    if status >= 500:
        return ProviderError("provider_unavailable", message, status_code=status, retryable=True)
    text = f"{exc.code or ''} {exc.type or ''} {detail}"
    if status == 413 or _CONTEXT_LENGTH.search(text):
        return ProviderError("context_length", message, status_code=status)
    return ProviderError("bad_request", message, status_code=status)


def _retry_after(exc: openai.APIStatusError) -> float | None:
    headers = exc.response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return float(headers[name]) * scale
        except (KeyError, ValueError):
            continue  # absent, or an HTTP date: too rare to parse
    return None
