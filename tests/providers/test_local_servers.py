"""Local servers and Azure: the provider dicts the README shows, against the replay server.

Ollama and llama.cpp's server speak Chat Completions under `/v1`; the tests point the README's
dicts, unchanged but for host and port, at a replay server speaking the same format.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from trimtab import Client, PermissionHandler
from trimtab.testing import Conversation, ConversationMessage, ReplayServer

README = Path(__file__).parents[2] / "README.md"

OLLAMA = {"type": "openai", "base_url": "http://localhost:11434/v1", "api_key": "ollama"}
LLAMA_CPP = {"type": "openai", "base_url": "http://localhost:8080/v1"}

CONVERSATIONS = [
    Conversation(
        messages=[
            ConversationMessage(role="user", content="Say hello"),
            ConversationMessage(role="assistant", content="Hello from a local model."),
        ]
    )
]


@pytest.fixture
async def server() -> AsyncIterator[ReplayServer]:
    async with ReplayServer(CONVERSATIONS) as replay:
        yield replay


def _pointed_at(config: dict[str, Any], server: ReplayServer) -> dict[str, Any]:
    """`config` with the server's host and port, and everything else (the path) unchanged."""
    netloc = urlsplit(server.root_url).netloc
    url = urlunsplit(urlsplit(config["base_url"])._replace(netloc=netloc))
    return {**config, "base_url": url}


async def _ask(provider: dict[str, Any], *, model: str, streaming: bool = False) -> str:
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=provider,
            model=model,
            streaming=streaming,
            on_permission_request=PermissionHandler.approve_all,
        )
        reply = await session.send_and_wait("Say hello")
    assert reply is not None
    return reply.data.content


@pytest.mark.parametrize("config", [OLLAMA, LLAMA_CPP], ids=["ollama", "llama.cpp"])
def test_readme_shows_the_tested_dicts(config: dict[str, Any]) -> None:
    assert json.dumps(config) in README.read_text(encoding="utf-8")


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streamed"])
async def test_ollama(
    server: ReplayServer, monkeypatch: pytest.MonkeyPatch, streaming: bool
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    reply = await _ask(_pointed_at(OLLAMA, server), model="qwen2.5:7b", streaming=streaming)

    assert reply == "Hello from a local model."
    request = server.received[-1]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer ollama"
    assert request.body["model"] == "qwen2.5:7b"


async def test_llama_cpp_server_needs_no_key(
    server: ReplayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    reply = await _ask(_pointed_at(LLAMA_CPP, server), model="local", streaming=True)

    assert reply == "Hello from a local model."
    assert server.received[-1].path == "/v1/chat/completions"


@pytest.mark.parametrize(
    ("wire_api", "path"),
    [
        ("completions", "/openai/deployments/gpt-4o-mini/chat/completions"),
        ("responses", "/openai/responses"),
    ],
)
async def test_azure_puts_deployment_version_and_key_where_azure_wants_them(
    server: ReplayServer, wire_api: str, path: str
) -> None:
    provider = {
        "type": "azure",
        "base_url": server.root_url,
        "api_key": "azure-key",
        "deployment": "gpt-4o-mini",
        "api_version": "2024-10-21",
        "wire_api": wire_api,
    }

    reply = await _ask(provider, model="gpt-4o")

    assert reply == "Hello from a local model."
    request = server.received[-1]
    assert request.path == path
    assert request.query == {"api-version": "2024-10-21"}
    assert request.headers["api-key"] == "azure-key"
    assert request.body["model"] == "gpt-4o-mini"  # the deployment, not the session's model


async def test_azure_without_api_version_is_refused_clearly(server: ReplayServer) -> None:
    provider = {"type": "azure", "base_url": server.root_url, "api_key": "k", "deployment": "d"}

    async with Client(store="memory") as client:
        with pytest.raises(ValueError, match="'azure' needs api_version"):
            await client.create_session(provider=provider, model="gpt-4o")
    assert server.requests == []
