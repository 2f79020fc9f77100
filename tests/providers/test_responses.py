"""The OpenAI Responses provider: what goes on the wire, and what only this format sends back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from trimtab._errors import ProviderError
from trimtab.events import ToolDefinition
from trimtab.providers._base import Message, ModelRequest, ModelResponse, ProviderEvent, ToolCall
from trimtab.providers._config import ProviderConfig
from trimtab.providers.openai_responses import OpenAIResponsesProvider
from trimtab.testing import ReplayServer

COMPLETED = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "model": "gpt",
    "output": [
        {
            "type": "message",
            "id": "m1",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi", "annotations": []}],
        }
    ],
    "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
}


@pytest.fixture
def server() -> ReplayServer:
    """Reached through its transport: these tests are about the wire format, not sockets."""
    return ReplayServer()


@pytest.fixture
async def provider(server: ReplayServer) -> AsyncIterator[OpenAIResponsesProvider]:
    config = ProviderConfig(
        type="openai",
        wire_api="responses",
        base_url="http://replay.test/v1",
        api_key="k",
        max_retries=0,
    )
    responses = OpenAIResponsesProvider(config, transport=server.transport())
    yield responses
    await responses.aclose()


async def _collect(provider: OpenAIResponsesProvider, request: ModelRequest) -> list[ProviderEvent]:
    return [event async for event in provider.stream(request)]


def _request(*messages: Message, stream: bool = False, **options: Any) -> ModelRequest:
    messages = messages or (Message(role="user", content="Hi"),)
    return ModelRequest(model="gpt-test", messages=messages, stream=stream, **options)


def _sse(*events: dict[str, Any]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


async def test_window_maps_to_instructions_and_input_items(
    provider: OpenAIResponsesProvider, server: ReplayServer
) -> None:
    call = ToolCall(id="c1", name="get_weather", arguments='{"city":"Paris"}')
    tool = ToolDefinition(name="get_weather", description="Weather", parameters={"type": "object"})
    server.fail_next(200, body=COMPLETED)

    await _collect(
        provider,
        _request(
            Message(role="system", content="SYSTEM"),
            Message(role="developer", content="DEVELOPER"),
            Message(role="user", content="Weather?"),
            Message(role="assistant", content="Checking.", tool_calls=(call,)),
            Message(role="tool", tool_call_id="c1", content="sunny"),
            tools=(tool,),
            max_tokens=50,
        ),
    )

    body = server.requests[-1]
    assert server.received[-1].path == "/v1/responses"
    assert body["instructions"] == "SYSTEM"
    assert body["input"] == [
        {"role": "developer", "content": "DEVELOPER"},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking."},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "strict": False,
            "name": "get_weather",
            "description": "Weather",
            "parameters": {"type": "object"},
        }
    ]
    assert (body["store"], body["max_output_tokens"]) == (False, 50)


async def test_incomplete_response_has_its_reason(
    provider: OpenAIResponsesProvider, server: ReplayServer
) -> None:
    incomplete = {
        **COMPLETED,
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
    }
    server.fail_next(200, body=incomplete)

    events = await _collect(provider, _request())

    response = events[-1]
    assert isinstance(response, ModelResponse)
    assert (response.content, response.finish_reason) == ("Hi", "length")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 2)


@pytest.mark.parametrize(
    ("event", "error_type"),
    [
        ({"type": "error", "code": "server_error", "message": "boom"}, "provider_unavailable"),
        (
            {
                "type": "response.failed",
                "response": {
                    **COMPLETED,
                    "status": "failed",
                    "error": {"code": "rate_limit_exceeded", "message": "boom"},
                },
            },
            "rate_limit",
        ),
    ],
)
async def test_failure_inside_the_stream_is_typed(
    provider: OpenAIResponsesProvider,
    server: ReplayServer,
    event: dict[str, Any],
    error_type: str,
) -> None:
    delta = {"type": "response.output_text.delta", "output_index": 0, "delta": "Hel"}
    server.fail_next(200, body=_sse({"type": "response.created"}, delta, event))

    with pytest.raises(ProviderError) as caught:
        await _collect(provider, _request(stream=True))

    assert (caught.value.error_type, caught.value.retryable) == (error_type, True)
    assert "boom" in caught.value.message


async def test_unknown_events_are_ignored(
    provider: OpenAIResponsesProvider, server: ReplayServer
) -> None:
    server.fail_next(
        200,
        body=_sse(
            {"type": "response.created"},
            {"type": "response.something_new", "payload": [1, 2]},
            {"type": "response.output_text.delta", "output_index": 0, "delta": "Hi"},
            {"type": "response.completed", "response": COMPLETED},
        ),
    )

    events = await _collect(provider, _request(stream=True))

    response = events[-1]
    assert isinstance(response, ModelResponse)
    assert (response.content, response.finish_reason) == ("Hi", "stop")


async def test_stream_closed_cleanly_before_completed_is_an_error(
    provider: OpenAIResponsesProvider, server: ReplayServer
) -> None:
    delta = {"type": "response.output_text.delta", "output_index": 0, "delta": "Hel"}
    server.fail_next(200, body=_sse({"type": "response.created"}, delta))

    with pytest.raises(ProviderError) as caught:
        await _collect(provider, _request(stream=True))

    assert (caught.value.error_type, caught.value.retryable) == ("provider_unavailable", True)
