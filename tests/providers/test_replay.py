"""The replay server's own features: YAML files, the models list, and explaining a mismatch."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.server.raw import unestablished
from trimtab import Client, PermissionHandler, SessionError
from trimtab.testing import (
    Conversation,
    ConversationMessage,
    ReplayServer,
    load_conversations,
    save_conversations,
)

WEATHER = Conversation.model_validate(
    {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris?\nBe brief."},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
        ]
    }
)


def _get_json(url: str) -> Any:
    # Blocking: run it in a thread, the server answers on the event loop.
    with urllib.request.urlopen(url) as answer:
        return json.load(answer)


def test_yaml_round_trip_in_the_copilot_snapshot_shape(tmp_path: Path) -> None:
    path = tmp_path / "weather.yaml"

    save_conversations(path, [WEATHER], models=["gpt-4.1"])

    text = path.read_text(encoding="utf-8")
    assert text.startswith("models:\n- gpt-4.1\nconversations:\n- messages:\n")
    assert "content: |-\n" in text  # multi-line text as a literal block
    assert load_conversations(path) == [WEATHER]


def test_yaml_with_an_unknown_key_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("conversations:\n- messages:\n  - role: user\n    contnet: hi\n")

    with pytest.raises(ValidationError, match="contnet"):
        load_conversations(path)


async def test_from_yaml_serves_the_file_and_save_yaml_writes_it_back(tmp_path: Path) -> None:
    source, copy = tmp_path / "in.yaml", tmp_path / "out.yaml"
    save_conversations(source, [WEATHER], models=["gpt-4.1"])

    async with ReplayServer.from_yaml(source) as server:
        models = await asyncio.to_thread(_get_json, f"{server.base_url}/models")
        server.save_yaml(copy)

    assert [m["id"] for m in models["data"]] == ["gpt-4.1"]
    assert copy.read_text(encoding="utf-8") == source.read_text(encoding="utf-8")


@pytest.mark.parametrize("wire_api", ["completions", "responses", "anthropic"])
async def test_an_unrecorded_request_is_explained_and_not_retried(wire_api: str) -> None:
    async with ReplayServer([WEATHER]) as server, Client(store="memory") as client:
        if wire_api == "anthropic":
            provider = {"type": "anthropic", "base_url": server.root_url, "api_key": "k"}
        else:
            provider = {"type": "openai", "base_url": server.base_url, "wire_api": wire_api}
        session = await client.create_session(
            provider={**provider, "max_retries": 2},
            model="m",
            on_permission_request=PermissionHandler.approve_all,
        )

        with pytest.raises(SessionError) as caught:
            await session.send_and_wait("Weather in Rome?")

    assert "no recorded conversation" in caught.value.message
    assert "'Weather in Rome?'" in caught.value.message
    assert len(server.requests) == 1  # the mismatch says "do not retry"


async def test_an_unknown_path_is_a_404() -> None:
    async with ReplayServer() as server:
        with pytest.raises(urllib.error.HTTPError) as caught:
            await asyncio.to_thread(urllib.request.urlopen, f"{server.base_url}/embeddings", b"{}")

    assert caught.value.code == 404
    assert server.requests == []


def test_conversation_messages_reject_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="tool_call"):
        ConversationMessage.model_validate({"role": "tool", "tool_call": "x"})


async def test_clients_connecting_together_wait_in_the_accept_queue() -> None:
    async with ReplayServer([WEATHER]) as server:
        port = int(server.root_url.rsplit(":", 1)[1])
        # This test holds the event loop: the server accepts nothing meanwhile.
        assert unestablished(port, 400) == 0
