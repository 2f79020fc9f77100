"""The Anthropic provider: what goes on the wire, and what only this format can send back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from trimtab._errors import ProviderError
from trimtab.events import ToolDefinition
from trimtab.providers._base import Message, ModelRequest, ModelResponse, ProviderEvent, ToolCall
from trimtab.providers._config import ProviderConfig
from trimtab.providers.anthropic import AnthropicProvider
from trimtab.testing import ReplayServer

WEATHER = ToolDefinition(
    name="get_weather",
    description="The weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude",
    "content": [
        {"type": "thinking", "thinking": "Hmm.", "signature": "s"},
        {"type": "text", "text": "Hi"},
    ],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 2},
}


def _sse(*events: dict[str, Any]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


_EMPTY_STREAM = _sse(
    {"type": "message_start", "message": {**ANSWER, "content": []}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
    {"type": "message_stop"},
)


@pytest.fixture
def server() -> ReplayServer:
    """Reached through its transport: these tests are about the wire format, not sockets."""
    return ReplayServer()


@pytest.fixture
async def provider(server: ReplayServer) -> AsyncIterator[AnthropicProvider]:
    config = ProviderConfig(
        type="anthropic", base_url="http://replay.test", api_key="sk-ant-test", max_retries=0
    )
    anthropic = AnthropicProvider(config, transport=server.transport())
    yield anthropic
    await anthropic.aclose()


async def _collect(provider: AnthropicProvider, request: ModelRequest) -> list[ProviderEvent]:
    return [event async for event in provider.stream(request)]


async def test_window_maps_to_system_blocks_tool_use_and_merged_tool_results(
    provider: AnthropicProvider, server: ReplayServer
) -> None:
    calls = (
        ToolCall(id="t1", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="t2", name="get_weather", arguments='{"city": "Ro'),  # invalid JSON
    )
    request = ModelRequest(
        model="claude-test",
        messages=(
            Message(role="system", content="SYSTEM"),
            Message(role="developer", content="DEVELOPER"),
            Message(role="user", content="Weather?"),
            Message(role="assistant", content="Checking.", tool_calls=calls),
            Message(role="tool", tool_call_id="t1", content="sunny"),
            Message(role="tool", tool_call_id="t2", content="Invalid tool arguments"),
            Message(role="user", content="And now?"),
        ),
        tools=(WEATHER,),
    )
    server.fail_next(200, body=ANSWER)

    await _collect(provider, request)

    body = server.requests[-1]
    assert server.received[-1].path == "/v1/messages"
    assert body["system"] == [
        {"type": "text", "text": "SYSTEM"},
        {"type": "text", "text": "DEVELOPER"},
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "Invalid tool arguments"},
                {"type": "text", "text": "And now?"},
            ],
        },
    ]
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "input_schema": WEATHER.parameters,
        }
    ]


@pytest.mark.parametrize(
    ("model", "stream", "max_tokens", "expected"),
    [
        ("some-unknown-model", False, None, 4096),
        ("claude-sonnet-4-test", True, None, 64_000),  # the model's limit...
        ("claude-sonnet-4-test", False, None, 8_192),  # ...capped when not streamed
        ("claude-sonnet-4-test", False, 100, 100),
    ],
)
async def test_max_tokens_defaults_to_the_model_limit(
    provider: AnthropicProvider,
    server: ReplayServer,
    model: str,
    stream: bool,
    max_tokens: int | None,
    expected: int,
) -> None:
    server.fail_next(200, body=_EMPTY_STREAM if stream else ANSWER)
    request = ModelRequest(
        model=model,
        messages=(Message(role="user", content="Hi"),),
        stream=stream,
        max_tokens=max_tokens,
    )

    await _collect(provider, request)

    assert server.requests[-1]["max_tokens"] == expected


async def test_thinking_is_reasoning(provider: AnthropicProvider, server: ReplayServer) -> None:
    server.fail_next(200, body=ANSWER)

    events = await _collect(provider, _request())

    response = events[-1]
    assert isinstance(response, ModelResponse)
    assert (response.content, response.reasoning, response.finish_reason) == ("Hi", "Hmm.", "stop")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 2)


@pytest.mark.parametrize(
    ("error", "error_type", "retryable"),
    [
        ({"type": "overloaded_error", "message": "Overloaded"}, "provider_unavailable", True),
        ({"type": "rate_limit_error", "message": "Slow down"}, "rate_limit", True),
        (
            {"type": "invalid_request_error", "message": "prompt is too long"},
            "context_length",
            False,
        ),
    ],
)
async def test_error_event_mid_stream_is_typed(
    provider: AnthropicProvider,
    server: ReplayServer,
    error: dict[str, str],
    error_type: str,
    retryable: bool,
) -> None:
    start = {"type": "message_start", "message": {**ANSWER, "content": []}}
    delta = {"type": "text_delta", "text": "Hel"}
    server.fail_next(
        200,
        body=_sse(
            start,
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {"type": "content_block_delta", "index": 0, "delta": delta},
            {"type": "error", "error": error},
        ),
    )

    with pytest.raises(ProviderError) as caught:
        await _collect(provider, _request(stream=True))

    assert (caught.value.error_type, caught.value.retryable) == (error_type, retryable)
    assert error["message"] in caught.value.message


async def test_tool_use_with_its_whole_input_at_the_start(
    provider: AnthropicProvider, server: ReplayServer
) -> None:
    # Some compatible servers send the input in content_block_start and no input_json_delta.
    block = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}
    server.fail_next(
        200,
        body=_sse(
            {"type": "message_start", "message": {**ANSWER, "content": []}},
            {"type": "content_block_start", "index": 0, "content_block": block},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}},
            {"type": "message_stop"},
        ),
    )

    events = await _collect(provider, _request(stream=True))

    response = events[-1]
    assert isinstance(response, ModelResponse)
    assert response.tool_calls == (
        ToolCall(id="t1", name="get_weather", arguments='{"city": "Oslo"}'),
    )
    assert response.finish_reason == "tool_calls"


async def test_no_key_and_no_base_url_is_an_authentication_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    provider = AnthropicProvider(ProviderConfig(type="anthropic"))

    with pytest.raises(ProviderError) as caught:
        await _collect(provider, _request())

    assert caught.value.error_type == "authentication"
    assert "ANTHROPIC_API_KEY" in caught.value.message


def _request(*, stream: bool = False) -> ModelRequest:
    return ModelRequest(
        model="claude-test", messages=(Message(role="user", content="Hi"),), stream=stream
    )


async def test_stream_closed_cleanly_before_message_stop_is_an_error(
    provider: AnthropicProvider, server: ReplayServer
) -> None:
    delta = {"type": "text_delta", "text": "Hel"}
    server.fail_next(
        200,
        body=_sse(
            {"type": "message_start", "message": {**ANSWER, "content": []}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {"type": "content_block_delta", "index": 0, "delta": delta},
        ),
    )

    with pytest.raises(ProviderError) as caught:
        await _collect(provider, _request(stream=True))

    assert (caught.value.error_type, caught.value.retryable) == ("provider_unavailable", True)
