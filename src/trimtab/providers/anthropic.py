"""The Anthropic Messages provider, through the official `anthropic` package.

The Messages API differs from Chat Completions in ways the window has to be mapped to: system
and developer messages go to the `system` parameter (one text block each, in order), tool
calls are `tool_use` blocks of the assistant message, and their results `tool_result` blocks
of the next user message, so consecutive results become one user message. `max_tokens` is
required: the request's, else the model's known output limit.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import anthropic

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
    connection_error,
    environment_header_names,
    fold_stream,
    own_key_needed,
    provider_errors,
    require_event_stream,
    retry_after,
    status_error,
    stream_error,
    tool_call,
    unexpected_answer,
)
from trimtab.providers._config import ProviderConfig, credentials_environment
from trimtab.providers._http import HttpClient
from trimtab.providers._limits import limits_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import httpx2

__all__ = ["AnthropicProvider"]

_BASE_URL = "https://api.anthropic.com"

_PLACEHOLDER_KEY = "unused"
"""Sent to keyless compatible servers: the client library refuses to start without some key."""

_NON_STREAMED_MAX_TOKENS = 8_192
"""The default `max_tokens` of a non-streamed request is capped: the client refuses
non-streamed requests that may run past ten minutes (and, for some models, past 8,192)."""

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
"""Anthropic's stop reasons as Chat Completions' finish reasons; others pass as they are."""


class AnthropicProvider:
    """A `Provider` speaking the Anthropic Messages API."""

    name = "anthropic"

    def __init__(
        self,
        config: ProviderConfig,
        *,
        env_credentials: bool = False,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        """How the provider was configured."""
        self._environment = credentials_environment(config, env_credentials=env_credentials)
        self._transport = transport
        self._client: anthropic.AsyncAnthropic | None = None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        """Answer one request; raise `ProviderError` on any failure."""
        with provider_errors(self._map_error):
            messages = self._get_client().messages
            body = _body(request, self.config.wire_model or request.model)
            seconds = self.config.deadline(stream=request.stream)
            # A timeout of our own also keeps the client from refusing, or timing by its own
            # estimate, a non-streamed request it guesses may take long.
            body["timeout"] = anthropic.Timeout(**attempt_timeout(seconds))
            if request.headers:
                body["extra_headers"] = request.headers
            if not request.stream:
                async with answer_within(seconds, stream=False):
                    message = await messages.create(**body, stream=False)
                yield _parse_message(message)
                return
            async with answer_within(seconds, stream=True):
                events = await messages.create(**body, stream=True)
                await require_event_stream(events.response)
            stall_timeout = self.config.stall_seconds
            async for event in fold_stream(
                events, _StreamState(), stall_timeout=stall_timeout, close=events.close
            ):
                yield event

    async def aclose(self) -> None:
        """Close the HTTP client, if one was created."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    def _map_error(self, exc: Exception) -> ProviderError | None:
        error = _map_error(exc)
        withheld = self._environment is not os.environ
        if error is not None and withheld and self.config.api_key is None:
            return own_key_needed(error, "ANTHROPIC_API_KEY")
        return error

    def _get_client(self) -> anthropic.AsyncAnthropic:
        # Created on first use, like the OpenAI client: building a provider costs nothing.
        if self._client is None:
            config = self.config
            api_key = config.api_key or self._environment.get("ANTHROPIC_API_KEY")
            if api_key is None and config.base_url is None:
                raise ProviderError(
                    "authentication", "no API key: set api_key or ANTHROPIC_API_KEY"
                )
            headers: dict[str, Any] | None = config.headers
            if self._environment is not os.environ:
                # The headers the library would add from the environment are left out.
                names = environment_header_names("ANTHROPIC_CUSTOM_HEADERS")
                headers = {name: anthropic.Omit() for name in names} | (config.headers or {})
            # An explicit key (a placeholder at worst) keeps the library from looking for
            # credentials in the environment itself.
            self._client = anthropic.AsyncAnthropic(
                api_key=api_key or _PLACEHOLDER_KEY,
                base_url=config.base_url,
                # Each call passes its own (`ProviderConfig.deadline`); this is for any other.
                timeout=anthropic.Timeout(**attempt_timeout(config.deadline(stream=False))),
                default_headers=headers,
                # trimtab's HTTP client, with its retries: the library's own are off.
                max_retries=0,
                http_client=HttpClient(
                    # Where the library sends its requests, as it decides it.
                    config.base_url or os.environ.get("ANTHROPIC_BASE_URL") or _BASE_URL,
                    max_retries=config.max_retries,
                    credentials=(config.headers or {}).keys(),
                    transport=self._transport,
                ),
            )
        return self._client


# --- request ------------------------------------------------------------------------------


def _body(request: ModelRequest, model: str) -> dict[str, Any]:
    """The request's fields, but for `stream`; `model` is the name the provider knows.

    `reasoning_effort` is not sent (spec D12): Messages has no effort, only a `thinking`
    budget, and a turn that thinks and calls tools must be sent back with its signed
    thinking blocks, which the log does not keep."""
    system, messages = _messages(request.messages)
    max_tokens = request.max_tokens or limits_for(request.model).max_output_tokens
    if not request.stream and request.max_tokens is None:
        max_tokens = min(max_tokens, _NON_STREAMED_MAX_TOKENS)
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [
            {"name": t.name, "input_schema": t.parameters}
            | ({"description": t.description} if t.description else {})
            for t in request.tools
        ]
        if request.tool_choice == "required":
            body["tool_choice"] = {"type": "any"}
    return body


def _messages(window: tuple[Message, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The `system` blocks and the alternating user / assistant messages of a window."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for message in window:
        if message.role in ("system", "developer"):
            if message.content:  # the API rejects empty text blocks
                system.append({"type": "text", "text": message.content})
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        # Tool results (and a user message after them) share one user message: the API wants
        # every result of a batch in the message right after the one that made the calls.
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


def _blocks(message: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.role == "tool":
        block = {"type": "tool_result", "tool_use_id": message.tool_call_id}
        return [block | ({"content": message.content} if message.content else {})]
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    blocks += [  # a user message's images, after its text (spec D14)
        {"type": "image", "source": {"type": "base64", "media_type": i.mime_type, "data": i.data}}
        for i in message.images
    ]
    blocks += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)}
        for c in message.tool_calls
    ]
    return blocks


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object `tool_use.input` must be."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    # Invalid JSON cannot go on the wire; the call's result already told the model that its
    # arguments were invalid, so an empty object keeps the conversation valid and honest.
    return value if isinstance(value, dict) else {}


# --- response -----------------------------------------------------------------------------


def _parse_message(message: Any) -> ModelResponse:
    """The `ModelResponse` of a complete (non-streamed) message."""
    content = getattr(message, "content", None)
    if not isinstance(content, list):
        # The client builds whatever came (an error object, even a text) into a `Message`.
        to_dict = getattr(message, "to_dict", None)
        raise unexpected_answer(to_dict() if callable(to_dict) else message, "a message")
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        match getattr(block, "type", None):
            case "text":
                text.append(getattr(block, "text", None) or "")
            case "thinking":
                reasoning.append(getattr(block, "thinking", None) or "")
            case "tool_use":
                call_id, name = getattr(block, "id", None), getattr(block, "name", "")
                calls.append(tool_call(call_id, name, _arguments(getattr(block, "input", None))))
            case _:
                pass  # redacted thinking, server tools' blocks: nothing to show
    usage = getattr(message, "usage", None)
    return ModelResponse(
        content="".join(text),
        tool_calls=tuple(calls),
        reasoning="".join(reasoning) or None,
        usage=_usage(usage, getattr(usage, "output_tokens", None)),
        finish_reason=_finish_reason(getattr(message, "stop_reason", None)),
    )


def _usage(usage: Any, output_tokens: int | None) -> Usage:
    """A call's usage, its input tokens counted in full: Messages counts apart those read
    from the prompt cache and those written to it (each a part of the input, U1)."""
    read = getattr(usage, "cache_read_input_tokens", None)
    written = getattr(usage, "cache_creation_input_tokens", None)
    given = getattr(usage, "input_tokens", None)
    parts = [n for n in (given, read, written) if isinstance(n, int)]
    return Usage(
        input_tokens=sum(parts) if parts else None,
        output_tokens=output_tokens,
        cache_read_tokens=read if isinstance(read, int) else None,
    )


def _arguments(value: object) -> str:
    # Text is passed on as it came: a server that sent it instead of an object may have sent
    # invalid JSON, which the loop turns into an `invalid_arguments` outcome.
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


def _finish_reason(stop_reason: str | None) -> str | None:
    return _FINISH_REASONS.get(stop_reason, stop_reason) if stop_reason else None


_DELTA_FIELDS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}
"""The content block deltas that carry text, and the field that holds it."""


class _StreamState:
    """What the events of one stream add up to."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        """Content blocks by index: their type, text, and for tool_use id, name and JSON."""
        self.input: Any = None
        """The usage of `message_start`: the input tokens, those of the cache included."""
        self.output_tokens: int | None = None
        self.stop_reason: str | None = None
        self.stopped = False

    def add(self, event: Any) -> list[ProviderEvent]:
        """Fold one event in; return the deltas to show as they stream."""
        # `getattr` with defaults: the client builds events without validation.
        index = int(getattr(event, "index", None) or 0)
        match getattr(event, "type", None):
            case "message_start":
                self._add_usage(getattr(getattr(event, "message", None), "usage", None))
            case "content_block_start":
                block = getattr(event, "content_block", None)
                self.blocks[index] = {
                    "type": getattr(block, "type", None),
                    "id": getattr(block, "id", None),
                    "name": getattr(block, "name", ""),
                    "input": getattr(block, "input", None),
                    "parts": [],
                }
            case "content_block_delta":
                return self._add_delta(index, getattr(event, "delta", None))
            case "message_delta":
                stop_reason = getattr(getattr(event, "delta", None), "stop_reason", None)
                self.stop_reason = stop_reason or self.stop_reason
                self._add_usage(getattr(event, "usage", None))
            case "message_stop":
                self.stopped = True
            case _:
                pass  # ping, content_block_stop, and kinds added after this was written
        return []

    def _add_delta(self, index: int, delta: Any) -> list[ProviderEvent]:
        block = self.blocks.setdefault(index, {"type": None, "name": "", "parts": []})
        kind = getattr(delta, "type", None)
        field = _DELTA_FIELDS.get(kind or "")
        text = getattr(delta, field, None) if field is not None else None
        if not isinstance(text, str):
            return []  # signature and citation deltas, and kinds added after this was written
        block["parts"].append(text)
        if kind == "text_delta":
            return [TextDelta(text=text)]
        if kind == "thinking_delta":
            return [ReasoningDelta(text=text)]
        return []

    def _add_usage(self, usage: Any) -> None:
        # message_start carries the input tokens; message_delta the output tokens so far
        # (and, from newer servers, the input tokens again).
        if getattr(usage, "input_tokens", None):
            self.input = usage
        self.output_tokens = getattr(usage, "output_tokens", None) or self.output_tokens

    def response(self) -> ModelResponse:
        """The final response; raise if the stream stopped before `message_stop`."""
        if not self.stopped:
            raise ProviderError(
                "provider_unavailable",
                "the stream ended before the response was complete",
                retryable=True,
            )
        blocks = [self.blocks[i] for i in sorted(self.blocks)]
        calls = tuple(
            tool_call(b["id"], b["name"], "".join(b["parts"]) or _arguments(b.get("input")))
            for b in blocks
            if b["type"] == "tool_use"
        )
        reasoning = "".join("".join(b["parts"]) for b in blocks if b["type"] == "thinking")
        return ModelResponse(
            content="".join("".join(b["parts"]) for b in blocks if b["type"] == "text"),
            tool_calls=calls,
            reasoning=reasoning or None,
            usage=_usage(self.input, self.output_tokens),
            finish_reason=_finish_reason(self.stop_reason),
        )


# --- errors -------------------------------------------------------------------------------


def _map_error(exc: Exception) -> ProviderError | None:
    """The `ProviderError` for an exception of the `anthropic` client (after its retries)."""
    if not isinstance(exc, anthropic.AnthropicError):
        return None
    if isinstance(exc, anthropic.APITimeoutError):
        return ProviderError("timeout", "the request timed out", retryable=True)
    if isinstance(exc, anthropic.APIConnectionError):
        return connection_error(exc.request.url, exc)
    if isinstance(exc, anthropic.APIResponseValidationError):
        return ProviderError("bad_response", f"malformed response: {exc.message}")
    if isinstance(exc, anthropic.APIStatusError):
        error = exc.body.get("error") if isinstance(exc.body, dict) else None
        error = error if isinstance(error, dict) else {}
        kind = str(error.get("type") or "")
        detail = str(error.get("message") or exc.message)
        if exc.status_code < 400:
            # An `error` event inside a 200 stream (the client raises it as a status error).
            return stream_error(kind, detail)
        return status_error(
            exc.status_code,
            detail,
            url=exc.response.request.url,
            kind=kind,
            retry_after=retry_after(exc.response.headers),
        )
    return ProviderError("bad_request", str(exc))
