"""The OpenAI Chat Completions provider, against the replay server over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import ValidationError

from tests.fake_model import LocalServer
from trimtab._errors import ProviderError
from trimtab.events import ToolDefinition
from trimtab.providers._base import (
    Message,
    ModelRequest,
    ModelResponse,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
)
from trimtab.providers._config import ProviderConfig, make_provider
from trimtab.providers.anthropic import AnthropicProvider
from trimtab.providers.openai import OpenAIProvider
from trimtab.providers.openai_responses import OpenAIResponsesProvider
from trimtab.testing import Conversation, ConversationMessage, ReplayServer

WEATHER = ToolDefinition(
    name="get_weather",
    description="The weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _conversation(*messages: dict[str, Any]) -> Conversation:
    return Conversation(messages=[ConversationMessage.model_validate(m) for m in messages])


Make = Callable[..., OpenAIProvider]
"""The `make` fixture: builds a provider pointed at the server, with config overrides."""

HELLO = "Hello there, how can I help you today?"
CONVERSATIONS = [
    _conversation(
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello"},
        {"role": "assistant", "content": HELLO},
    ),
    _conversation(
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [_call("call_1", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        {"role": "assistant", "content": "It is sunny in Paris."},
    ),
    _conversation(
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                _call("call_a", "get_weather", {"city": "Paris"}),
                _call("call_b", "get_weather", {"city": "Rome", "units": "metric"}),
            ],
        },
    ),
    _conversation(
        {"role": "user", "content": "Think first"},
        {
            "role": "assistant",
            "reasoning_content": "Let me think about it carefully.",
            "content": "42",
        },
    ),
]


@pytest.fixture
async def server() -> AsyncIterator[ReplayServer]:
    async with ReplayServer(CONVERSATIONS, chunk_size=4) as replay:
        yield replay


@pytest.fixture
async def make(server: ReplayServer, request: pytest.FixtureRequest) -> AsyncIterator[Make]:
    """Build providers pointed at the server (no retries unless asked); close them after.

    They reach it in process (`ReplayServer.transport()`), except in tests marked
    `over_http`, which are about what happens on a connection.
    """
    providers: list[OpenAIProvider] = []
    over_http = request.node.get_closest_marker("over_http") is not None

    def build(**overrides: Any) -> OpenAIProvider:
        options: dict[str, Any] = {
            "base_url": server.base_url if over_http else "http://replay.test/v1",
            "api_key": "sk-test",
            "max_retries": 0,
        }
        config = ProviderConfig(type="openai", **{**options, **overrides})
        transport = None if over_http else server.transport()
        provider = OpenAIProvider(config, transport=transport)
        providers.append(provider)
        return provider

    yield build
    for provider in providers:
        await provider.aclose()


def _request(*messages: Message, stream: bool = False, **options: Any) -> ModelRequest:
    return ModelRequest(model="test-model", messages=messages, stream=stream, **options)


def user(text: str) -> Message:
    return Message(role="user", content=text)


async def _collect(provider: OpenAIProvider, request: ModelRequest) -> list[ProviderEvent]:
    return [event async for event in provider.stream(request)]


async def _response(provider: OpenAIProvider, request: ModelRequest) -> ModelResponse:
    events = await _collect(provider, request)
    assert isinstance(events[-1], ModelResponse)
    assert sum(isinstance(e, ModelResponse) for e in events) == 1
    return events[-1]


async def _error(provider: OpenAIProvider, request: ModelRequest) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await _collect(provider, request)
    return caught.value


# --- replies --------------------------------------------------------------------------


async def test_plain_reply_non_streaming(make: Make) -> None:
    events = await _collect(make(), _request(user("Say hello")))

    assert len(events) == 1
    response = events[0]
    assert isinstance(response, ModelResponse)
    assert response.content == HELLO
    assert response.tool_calls == ()
    assert response.finish_reason == "stop"


async def test_plain_reply_streaming_deltas_concatenate(make: Make) -> None:
    events = await _collect(make(), _request(user("Say hello"), stream=True))

    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 1
    assert "".join(deltas) == HELLO
    assert isinstance(events[-1], ModelResponse)
    assert events[-1].content == HELLO
    assert events[-1].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
async def test_one_tool_call_and_its_result(make: Make, stream: bool) -> None:
    provider = make()
    question = user("Weather in Paris?")

    first = await _response(provider, _request(question, stream=stream, tools=(WEATHER,)))

    assert first.tool_calls == (
        ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
    )
    assert first.finish_reason == "tool_calls"
    call_message = Message(role="assistant", tool_calls=first.tool_calls)
    result = Message(role="tool", tool_call_id="call_1", content="sunny, 21 C")
    second = await _response(provider, _request(question, call_message, result, stream=stream))
    assert second.content == "It is sunny in Paris."


@pytest.mark.parametrize("stream", [False, True])
async def test_two_parallel_tool_calls(make: Make, stream: bool) -> None:
    response = await _response(make(), _request(user("Weather in Paris and Rome?"), stream=stream))

    assert response.content == "Checking both."
    assert [(c.id, c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("call_a", "get_weather", {"city": "Paris"}),
        ("call_b", "get_weather", {"city": "Rome", "units": "metric"}),
    ]


async def test_arguments_split_across_chunks_are_reassembled(
    make: Make, server: ReplayServer
) -> None:
    response = await _response(make(), _request(user("Weather in Paris and Rome?"), stream=True))

    # chunk_size=4 split each argument string into several deltas.
    assert response.tool_calls[1].arguments == '{"city": "Rome", "units": "metric"}'
    assert server.requests[-1]["stream"] is True


async def test_parallel_calls_sharing_index_zero_are_kept_apart(
    make: Make, server: ReplayServer
) -> None:
    # Gemini's OpenAI-compatible endpoint numbers every parallel call 0; the ids tell them apart.
    def chunk(call: dict[str, Any], finish_reason: str | None = None) -> str:
        delta = {"tool_calls": [{"index": 0, "type": "function", **call}]}
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return "data: " + json.dumps({"id": "x", "choices": [choice]})

    paris = {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    rome = {"id": "c2", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}
    body = f"{chunk(paris)}\n\n{chunk(rome, 'tool_calls')}\n\ndata: [DONE]\n\n"
    server.fail_next(200, body=body)

    response = await _response(make(), _request(user("Weather?"), stream=True))

    assert [(c.id, c.arguments) for c in response.tool_calls] == [
        ("c1", '{"city":"Paris"}'),
        ("c2", '{"city":"Rome"}'),
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_usage_is_reported(make: Make, server: ReplayServer, stream: bool) -> None:
    response = await _response(make(), _request(user("Say hello"), stream=stream))

    assert response.usage.input_tokens is not None and response.usage.input_tokens > 0
    assert response.usage.output_tokens is not None and response.usage.output_tokens > 0
    if stream:
        assert server.requests[-1]["stream_options"] == {"include_usage": True}


async def test_reasoning_content_deltas(make: Make) -> None:
    events = await _collect(make(), _request(user("Think first"), stream=True))

    reasoning = [e.text for e in events if isinstance(e, ReasoningDelta)]
    assert len(reasoning) > 1
    assert "".join(reasoning) == "Let me think about it carefully."
    final = events[-1]
    assert isinstance(final, ModelResponse)
    assert final.reasoning == "Let me think about it carefully."
    assert final.content == "42"


async def test_reasoning_content_non_streaming(make: Make) -> None:
    response = await _response(make(), _request(user("Think first")))

    assert response.reasoning == "Let me think about it carefully."


# --- the request on the wire ----------------------------------------------------------


async def test_request_body_has_roles_and_tool_schema(make: Make, server: ReplayServer) -> None:
    call = ToolCall(id="call_1", name="get_weather", arguments='{"city":"Paris"}')
    request = _request(
        Message(role="system", content="You are terse."),
        Message(role="developer", content="Use metric units."),
        user("Weather in Paris?"),
        Message(role="assistant", tool_calls=(call,)),
        Message(role="tool", tool_call_id="call_1", content="sunny, 21 C"),
        tools=(WEATHER,),
        max_tokens=100,
    )

    await _response(make(), request)

    body = server.requests[-1]
    assert [m["role"] for m in body["messages"]] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assert body["messages"][3] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    }
    assert body["messages"][4] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "sunny, 21 C",
    }
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    assert body["max_tokens"] == 100
    assert body["model"] == "test-model"
    assert "stream" not in body or body["stream"] is False


TRICKY = 'quote " backslash \\ newline \n tab \t nul \x00 sep \u2028 é 中文 😀 </script>'


async def test_request_text_reaches_the_server_unchanged(make: Make, server: ReplayServer) -> None:
    # The messages are written as JSON text by hand (see `_body`): every string must survive.
    call = ToolCall(id=f"id {TRICKY}", name="get_weather", arguments=json.dumps({"city": TRICKY}))
    request = _request(
        user(TRICKY),
        Message(role="assistant", content=TRICKY, tool_calls=(call,)),
        Message(role="tool", tool_call_id=call.id, content=TRICKY),
        Message(role="assistant", content=""),
    )

    with pytest.raises(ProviderError):  # no recording continues these: only the request counts
        await _response(make(), request)

    assert server.requests[-1]["messages"] == [
        {"role": "user", "content": TRICKY},
        {
            "role": "assistant",
            "content": TRICKY,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": TRICKY},
        {"role": "assistant", "content": ""},
    ]


async def test_streamed_request_asks_for_usage(make: Make, server: ReplayServer) -> None:
    await _collect(make(), _request(user("Say hello"), stream=True))

    assert server.requests[-1]["stream"] is True
    assert server.requests[-1]["stream_options"] == {"include_usage": True}


async def test_tools_and_max_tokens_omitted_when_unset(make: Make, server: ReplayServer) -> None:
    await _response(make(), _request(user("Say hello")))

    assert "tools" not in server.requests[-1]
    assert "max_tokens" not in server.requests[-1]


async def test_tool_call_ids_match_by_order_not_literally(make: Make) -> None:
    # A client that renamed the call still gets the recorded continuation.
    call = ToolCall(id="my-own-id", name="get_weather", arguments='{"city":"Paris"}')
    request = _request(
        user("Weather in Paris?"),
        Message(role="assistant", tool_calls=(call,)),
        Message(role="tool", tool_call_id="my-own-id", content="sunny, 21 C"),
    )

    response = await _response(make(), request)

    assert response.content == "It is sunny in Paris."


async def test_tool_call_without_id_gets_one(make: Make, server: ReplayServer) -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
        ],
    }
    server.fail_next(200, body={"id": "x", "choices": [{"index": 0, "message": message}]})

    response = await _response(make(), _request(user("Weather in Paris?")))

    assert response.tool_calls[0].id.startswith("call_")
    assert response.tool_calls[0].name == "get_weather"


# --- errors ---------------------------------------------------------------------------


async def test_rate_limit_with_retry_after_is_retried(make: Make, server: ReplayServer) -> None:
    server.fail_next(429, retry_after=0.05)

    response = await _response(make(max_retries=1), _request(user("Say hello")))

    assert response.content == HELLO
    assert len(server.requests) == 2


async def test_rate_limit_exhausted_is_retryable_with_retry_after(
    make: Make, server: ReplayServer
) -> None:
    server.fail_next(429, retry_after=0.05)

    error = await _error(make(), _request(user("Say hello")))

    assert (error.error_type, error.status_code, error.retryable) == ("rate_limit", 429, True)
    assert error.retry_after == 0.05


async def test_persisting_500_is_provider_unavailable(make: Make, server: ReplayServer) -> None:
    server.fail_next(500, retry_after=0.01, times=3)

    error = await _error(make(max_retries=2), _request(user("Say hello"), stream=True))

    assert (error.error_type, error.status_code, error.retryable) == (
        "provider_unavailable",
        500,
        True,
    )
    assert len(server.requests) == 3


async def test_401_is_authentication(make: Make, server: ReplayServer) -> None:
    server.fail_next(401)

    error = await _error(make(), _request(user("Say hello")))

    assert (error.error_type, error.status_code, error.retryable) == ("authentication", 401, False)
    assert "Incorrect API key" in error.message


@pytest.mark.parametrize(
    "error_body",
    [
        {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"},
        # vLLM says it in the message only.
        {
            "message": "This model's maximum context length is 4096 tokens.",
            "type": "BadRequestError",
        },
    ],
)
async def test_context_length_400(
    make: Make, server: ReplayServer, error_body: dict[str, Any]
) -> None:
    server.fail_next(400, body={"error": error_body})

    error = await _error(make(), _request(user("Say hello")))

    assert (error.error_type, error.status_code) == ("context_length", 400)


async def test_other_400_is_bad_request(make: Make, server: ReplayServer) -> None:
    server.fail_next(
        400, body={"error": {"message": "unknown model", "type": "invalid_request_error"}}
    )

    error = await _error(make(), _request(user("Say hello")))

    assert (error.error_type, error.status_code, error.retryable) == ("bad_request", 400, False)


async def test_connection_refused_is_provider_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = ProviderConfig(type="openai", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    provider = OpenAIProvider(config)

    error = await _error(provider, _request(user("Say hello")))
    await provider.aclose()

    assert (error.error_type, error.retryable) == ("provider_unavailable", True)


@pytest.mark.over_http
async def test_request_timeout(make: Make, server: ReplayServer) -> None:
    server.stall_next(5.0)

    error = await _error(make(timeout=0.2), _request(user("Say hello")))

    assert error.error_type == "timeout"


@pytest.mark.over_http
async def test_stall_timeout_while_streaming(make: Make, server: ReplayServer) -> None:
    server.stall_next(5.0)

    error = await _error(make(stall_timeout=0.2), _request(user("Say hello"), stream=True))

    assert error.error_type == "timeout"


async def test_malformed_sse_is_bad_response(make: Make, server: ReplayServer) -> None:
    server.fail_next(200, body='data: {"id": "x", "choices": [\n\ndata: [DONE]\n\n')

    error = await _error(make(), _request(user("Say hello"), stream=True))

    assert error.error_type == "bad_response"


def _split_reply_choices() -> list[dict[str, Any]]:
    """A reply as the Copilot API sends it: text in one choice, each tool call in another."""
    paris = _call("c1", "get_weather", {"city": "Paris"})
    rome = _call("c2", "get_weather", {"city": "Rome"})
    return [
        {"index": 0, "message": {"role": "assistant", "content": "Checking."}},
        {"index": 1, "message": {"role": "assistant", "content": None, "tool_calls": [paris]}},
        {"index": 2, "message": {"role": "assistant", "tool_calls": [rome]}},
    ]


async def test_D3_choices_of_one_reply_are_merged(make: Make, server: ReplayServer) -> None:
    choices = _split_reply_choices()
    choices[0]["finish_reason"] = "stop"
    choices[1]["finish_reason"] = choices[2]["finish_reason"] = "tool_calls"
    server.fail_next(200, body={"id": "x", "object": "chat.completion", "choices": choices})

    response = await _response(make(), _request(user("Weather?")))

    assert response.content == "Checking."
    assert [(c.id, c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("c1", "get_weather", {"city": "Paris"}),
        ("c2", "get_weather", {"city": "Rome"}),
    ]
    assert response.finish_reason == "tool_calls"


async def test_D3_streamed_choices_of_one_reply_are_merged(
    make: Make, server: ReplayServer
) -> None:
    # Each choice's call is numbered 0 and its arguments come in pieces without an id.
    def chunk(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason}
        return "data: " + json.dumps({"id": "x", "choices": [choice]}) + "\n\n"

    def part(call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
        function = {"arguments": arguments} | ({"name": name} if name else {})
        return {"tool_calls": [{"index": 0, "id": call_id, "function": function}]}

    body = "".join(
        [
            chunk(0, {"role": "assistant", "content": "Check"}),
            chunk(1, part("c1", "get_weather", '{"city":')),
            chunk(2, part("c2", "get_weather", '{"city":')),
            chunk(0, {"content": "ing."}, "stop"),
            chunk(1, part(None, None, '"Paris"}'), "tool_calls"),
            chunk(2, part(None, None, '"Rome"}'), "tool_calls"),
            "data: [DONE]\n\n",
        ]
    )
    server.fail_next(200, body=body)

    response = await _response(make(), _request(user("Weather?"), stream=True))

    assert response.content == "Checking."
    assert [(c.id, c.arguments) for c in response.tool_calls] == [
        ("c1", '{"city":"Paris"}'),
        ("c2", '{"city":"Rome"}'),
    ]
    assert response.finish_reason == "tool_calls"


async def test_no_choices_is_bad_response(make: Make, server: ReplayServer) -> None:
    server.fail_next(200, body={"id": "x", "object": "chat.completion", "choices": []})

    error = await _error(make(), _request(user("Say hello")))

    assert error.error_type == "bad_response"


async def test_empty_stream_is_bad_response(make: Make, server: ReplayServer) -> None:
    server.fail_next(200, body="data: [DONE]\n\n")

    error = await _error(make(), _request(user("Say hello"), stream=True))

    assert error.error_type == "bad_response"


async def test_unrecorded_request_explains_the_mismatch(make: Make) -> None:
    error = await _error(make(), _request(user("Say goodbye")))

    assert error.error_type == "provider_unavailable"
    assert "no recorded conversation" in error.message
    assert "'Say goodbye'" in error.message


# --- config ---------------------------------------------------------------------------


def test_config_accepts_camel_and_snake_case() -> None:
    camel = ProviderConfig.model_validate(
        {"type": "openai", "baseUrl": "http://x/v1", "apiKey": "k", "wireApi": "completions"}
    )
    snake = ProviderConfig.model_validate(
        {"type": "openai", "base_url": "http://x/v1", "api_key": "k", "wire_api": "completions"}
    )

    assert camel == snake


def test_unknown_config_key_is_an_error_naming_it() -> None:
    with pytest.raises(ValidationError, match="baseURL"):
        ProviderConfig.model_validate({"type": "openai", "baseURL": "http://x/v1"})


def test_public_dict_hides_secrets() -> None:
    config = ProviderConfig(
        type="openai",
        base_url="http://user:pw-secret@example.test/v1",
        api_key="sk-secret",
        headers={"Authorization": "Bearer tok-secret", "X-Tenant": "acme"},
    )

    public = config.public_dict()

    assert public == {
        "type": "openai",
        "baseUrl": "http://example.test/v1",
        "wireApi": "completions",
        "maxRetries": 2,
        "headers": {"X-Tenant": "acme"},
    }
    for secret in ("sk-secret", "tok-secret"):
        assert secret not in repr(config)
    # The log's copy rebuilds a provider (credentials then come from the environment).
    assert ProviderConfig.model_validate(public).base_url == "http://example.test/v1"


def test_make_provider_builds_each_remote_type() -> None:
    assert isinstance(make_provider(ProviderConfig(type="openai")), OpenAIProvider)
    responses = make_provider(ProviderConfig(type="openai", wire_api="responses"))
    assert isinstance(responses, OpenAIResponsesProvider)
    assert isinstance(make_provider(ProviderConfig(type="anthropic")), AnthropicProvider)
    azure = ProviderConfig(type="azure", api_version="2024-10-21", deployment="gpt-4o")
    assert isinstance(make_provider(azure), OpenAIProvider)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"type": "azure", "deployment": "gpt-4o"}, "'azure' needs api_version"),
        ({"type": "openai", "deployment": "gpt-4o"}, "deployment applies only to .*'azure'"),
        ({"type": "anthropic", "api_version": "1"}, "api_version applies only to .*'azure'"),
        ({"type": "anthropic", "wire_api": "responses"}, "wire_api 'responses' applies only"),
    ],
)
def test_make_provider_refuses_options_that_do_not_fit_the_type(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make_provider(ProviderConfig.model_validate(config))


def test_importing_trimtab_imports_no_client_library() -> None:
    code = (
        "import sys, trimtab, trimtab.providers._config, trimtab.testing; "
        "assert not {'openai', 'anthropic', 'yaml'} & set(sys.modules), sys.modules.keys()"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


async def test_stream_closed_cleanly_before_its_finish_is_an_error(
    make: Make, server: ReplayServer
) -> None:
    # The HTTP body ends properly, but the answer does not: no finish reason, no [DONE].
    chunk = {"id": "x", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}
    server.fail_next(200, body=f"data: {json.dumps(chunk)}\n\n")

    error = await _error(make(), _request(user("Say hello"), stream=True))

    assert (error.error_type, error.retryable) == ("provider_unavailable", True)
    assert "before the response was complete" in error.message


async def test_make_provider_sends_through_an_injected_transport(server: ReplayServer) -> None:
    """No socket: the transport answers, and it saw the request the provider built."""
    config = ProviderConfig(type="openai", base_url="http://replay.test/v1", api_key="sk-test")
    provider = make_provider(config, transport=server.transport())
    assert isinstance(provider, OpenAIProvider)
    try:
        response = await _response(provider, _request(user("Say hello")))
    finally:
        await provider.aclose()
    assert response.content == HELLO
    assert server.received[-1].headers["authorization"] == "Bearer sk-test"
    assert server.received[-1].path == "/v1/chat/completions"


def test_a_local_provider_takes_no_transport() -> None:
    with pytest.raises(ValueError, match="no HTTP client"):
        make_provider(ProviderConfig(type="local"), transport=ReplayServer().transport())


@pytest.mark.parametrize("stream", [False, True])
async def test_D9_wire_model_is_the_model_named_in_the_request(
    make: Make, server: ReplayServer, stream: bool
) -> None:
    await _response(make(wire_model="my-fine-tune"), _request(user("Say hello"), stream=stream))
    assert server.requests[-1]["model"] == "my-fine-tune"


@pytest.mark.parametrize("stream", [False, True])
async def test_D9_request_headers_are_sent_with_that_request(
    make: Make, server: ReplayServer, stream: bool
) -> None:
    request = _request(user("Say hello"), stream=stream, headers={"X-Turn": "7"})
    await _response(make(headers={"X-Provider": "p"}), request)
    assert server.received[-1].headers["x-turn"] == "7"
    assert server.received[-1].headers["x-provider"] == "p"


class _SetsACookie(LocalServer):
    """Answers every completion; the first answer sets a cookie (as a load balancer's
    affinity or a bot check does). Records each request's `Cookie` header."""

    def __init__(self) -> None:
        super().__init__()
        self.cookies: list[str | None] = []

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            try:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
            except asyncio.IncompleteReadError:
                return
            headers = {
                name.lower(): value
                for name, value in (line.split(": ", 1) for line in head.split("\r\n")[1:] if line)
            }
            await reader.readexactly(int(headers["content-length"]))
            self.cookies.append(headers.get("cookie"))
            setting = b"Set-Cookie: affinity=node-7; Path=/\r\n" if len(self.cookies) == 1 else b""
            body = json.dumps(
                {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
            ).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%s"
                b"Content-Length: %d\r\n\r\n%s" % (setting, len(body), body)
            )
            await writer.drain()


async def test_an_answers_cookie_goes_with_the_next_requests() -> None:
    # As the `openai` client's: its httpx client keeps a cookie jar.
    async with _SetsACookie() as server:
        config = ProviderConfig(type="openai", base_url=f"{server.root_url}/v1", api_key="k")
        provider = OpenAIProvider(config)
        request = ModelRequest(model="m", messages=(Message(role="user", content="hi"),))
        try:
            for _ in range(3):
                answer = [e async for e in provider.stream(request)][-1]
                assert isinstance(answer, ModelResponse) and answer.content == "ok"
        finally:
            await provider.aclose()
    assert server.cookies == [None, "affinity=node-7", "affinity=node-7"]
