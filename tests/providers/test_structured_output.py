"""Typed results and cost on each wire format (issue 39; spec OUT2, OUT6, U1): what the
request asks (a required tool call, or the API's own structured output), and the cached
tokens each answer reports. Through `Client`, against the replay server's three formats."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from pydantic import BaseModel

from trimtab import Client
from trimtab.providers import ModelRequest, ModelResponse, Provider, make_provider
from trimtab.providers._base import Message
from trimtab.providers._config import ProviderConfig
from trimtab.testing import Conversation, ConversationMessage, ReplayServer


class City(BaseModel):
    name: str
    population: int


RESULT = {"name": "Oslo", "population": 7}


def conversation(*messages: dict[str, Any]) -> Conversation:
    return Conversation(messages=[ConversationMessage.model_validate(m) for m in messages])


def final_result(arguments: dict[str, Any]) -> dict[str, Any]:
    function = {"name": "final_result", "arguments": json.dumps(arguments)}
    return {"id": "call_1", "type": "function", "function": function}


BY_TOOL = conversation(
    {"role": "user", "content": "A city."},
    {"role": "assistant", "content": None, "tool_calls": [final_result(RESULT)]},
)
BY_REPLY = conversation(
    {"role": "user", "content": "A city."},
    {"role": "assistant", "content": json.dumps(RESULT)},
)


def provider(server: ReplayServer, kind: str) -> Provider:
    config: dict[str, Any] = {"type": "openai", "base_url": "http://replay.test/v1"}
    if kind == "responses":
        config["wire_api"] = "responses"
    if kind == "anthropic":
        config = {"type": "anthropic", "base_url": "http://replay.test"}
    parsed = ProviderConfig.model_validate({**config, "api_key": "k", "max_retries": 0})
    return make_provider(parsed, transport=server.transport())


async def typed_run(model: Provider, mode: str) -> City:
    async with Client(store="memory") as client:
        session = await client.create_session(provider=model, structured_output=mode)
        result: City = await session.send_and_wait("A city.", output_type=City, timeout=30)
        return result


@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic"])
async def test_out2_the_result_tool_is_required_on_every_wire_format(kind: str) -> None:
    server = ReplayServer([BY_TOOL])
    assert await typed_run(provider(server, kind), "tool") == City(**RESULT)
    [body] = server.requests
    assert [tool.get("name") or tool["function"]["name"] for tool in body["tools"]] == [
        "final_result"
    ]
    required = {"chat": "required", "responses": "required", "anthropic": {"type": "any"}}
    assert body["tool_choice"] == required[kind]


@pytest.mark.parametrize("kind", ["chat", "responses"])
async def test_out6_a_provider_with_native_structured_output_is_asked_for_it(kind: str) -> None:
    server = ReplayServer([BY_REPLY])
    assert await typed_run(provider(server, kind), "native") == City(**RESULT)
    [body] = server.requests
    assert "tools" not in body and "tool_choice" not in body
    if kind == "chat":
        format_ = body["response_format"]
        assert format_["type"] == "json_schema"
        schema = format_["json_schema"]["schema"]
    else:
        format_ = body["text"]["format"]
        assert (format_["type"], format_["strict"]) == ("json_schema", False)
        schema = format_["schema"]
    assert schema["required"] == ["name", "population"]


async def test_out6_a_provider_without_native_structured_output_uses_the_tool() -> None:
    """Anthropic's Messages has no structured output trimtab sends: native is asked for, and
    the run gives its result through the tool all the same."""
    server = ReplayServer([BY_TOOL])
    assert await typed_run(provider(server, "anthropic"), "native") == City(**RESULT)
    [body] = server.requests
    assert body["tool_choice"] == {"type": "any"} and "output_format" not in body


def answering(body: dict[str, Any]) -> httpx2.MockTransport:
    return httpx2.MockTransport(lambda request: httpx2.Response(200, json=body))


REQUEST = ModelRequest(model="m", messages=(Message(role="user", content="Hi"),))


async def answer(config: dict[str, Any], body: dict[str, Any]) -> ModelResponse:
    parsed = ProviderConfig.model_validate({**config, "api_key": "k", "max_retries": 0})
    model = make_provider(parsed, transport=answering(body))
    try:
        responses = [event async for event in model.stream(REQUEST)]
    finally:
        await model.aclose()
    response = responses[-1]
    assert isinstance(response, ModelResponse)
    return response


async def test_u1_each_wire_format_reports_the_tokens_read_from_the_cache() -> None:
    chat = await answer(
        {"type": "openai", "base_url": "http://m.test/v1"},
        {
            "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": 1000,
                "completion_tokens": 10,
                "prompt_tokens_details": {"cached_tokens": 800},
            },
        },
    )
    assert (chat.usage.input_tokens, chat.usage.cache_read_tokens) == (1000, 800)

    messages = await answer(
        {"type": "anthropic", "base_url": "http://m.test"},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn",
            "usage": {
                "input_tokens": 100,
                "output_tokens": 10,
                "cache_read_input_tokens": 800,
                "cache_creation_input_tokens": 100,
            },
        },
    )
    # Messages counts cached tokens apart: trimtab's input tokens are all of them.
    assert (messages.usage.input_tokens, messages.usage.cache_read_tokens) == (1000, 800)

    responses = await answer(
        {"type": "openai", "wire_api": "responses", "base_url": "http://m.test/v1"},
        {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "hi"}],
                }
            ],
            "usage": {
                "input_tokens": 1000,
                "output_tokens": 10,
                "input_tokens_details": {"cached_tokens": 800},
            },
        },
    )
    assert (responses.usage.input_tokens, responses.usage.cache_read_tokens) == (1000, 800)
