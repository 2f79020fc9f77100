"""Spec S1: credentials from the environment go only where they belong (issue 15, item 1).

A replay server on 127.0.0.1 records every request's headers. The process's environment holds
keys and the client libraries' credential variables; a config a session chose, with a
`base_url` of its own, must never carry them, while the runtime's own default provider does.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from trimtab import Client, SessionError
from trimtab._errors import ProviderError
from trimtab.providers import ModelRequest, ProviderConfig, make_provider
from trimtab.providers._base import Message
from trimtab.store import MemoryStore
from trimtab.testing import Conversation, ConversationMessage, ReplayServer

SECRETS = {
    "OPENAI_API_KEY": "sk-env-openai",
    "AZURE_OPENAI_API_KEY": "env-azure-key",
    "ANTHROPIC_API_KEY": "sk-ant-env",
    "OPENAI_ORG_ID": "org-env",
    "OPENAI_PROJECT_ID": "proj-env",
    "OPENAI_CUSTOM_HEADERS": "X-Env-Secret: env-custom",
    "ANTHROPIC_CUSTOM_HEADERS": "X-Env-Secret: env-custom",
}

HELLO = Conversation(
    messages=[
        ConversationMessage(role=role, content=content)
        for role, content in [("user", "Hi"), ("assistant", "Hello")] * 2
    ]
)
"""Hi, Hello, Hi, Hello: a first turn, and a second one after a resume."""


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


def _config(kind: str, server: ReplayServer, **extra: Any) -> dict[str, Any]:
    """A config of each wire format pointed at the replay server."""
    match kind:
        case "chat":
            return {"type": "openai", "base_url": server.base_url, **extra}
        case "responses":
            return {
                "type": "openai", "wire_api": "responses", "base_url": server.base_url, **extra,
            }  # fmt: skip
        case "azure":
            return {
                "type": "azure", "base_url": server.root_url, "api_version": "2024-10-21", **extra,
            }  # fmt: skip
        case "anthropic":
            return {"type": "anthropic", "base_url": server.root_url, **extra}
    raise AssertionError(kind)


def _env_values_in(headers: dict[str, str]) -> set[str]:
    """The environment's secret values that appear in any header."""
    text = " ".join(headers.values())
    return {value for value in SECRETS.values() if value.split(": ")[-1] in text}


async def _call(config: dict[str, Any], *, env_credentials: bool) -> None:
    provider = make_provider(
        ProviderConfig.model_validate({**config, "max_retries": 0}),
        env_credentials=env_credentials,
    )
    try:
        request = ModelRequest(model="m", messages=(Message(role="user", content="Hi"),))
        async for _ in provider.stream(request):
            pass
    finally:
        await provider.aclose()


KINDS = ["chat", "responses", "azure", "anthropic"]


KEYS = {
    "chat": "OPENAI_API_KEY",
    "responses": "OPENAI_API_KEY",
    "azure": "AZURE_OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}


@pytest.mark.parametrize("kind", KINDS)
async def test_s1_a_config_with_its_own_base_url_gets_no_environment_credential(
    kind: str, environment: None
) -> None:
    async with ReplayServer([HELLO]) as server:
        if kind == "azure":
            # Azure has no keyless servers: the call fails before any request is made.
            with pytest.raises(ProviderError, match="give the session's provider its own api_key"):
                await _call(_config(kind, server), env_credentials=False)
        else:
            await _call(_config(kind, server), env_credentials=False)
        await _call(_config(kind, server, api_key="own-key"), env_credentials=False)
        await _call(_config(kind, server), env_credentials=True)
    *sessions, operators = (request.headers for request in server.received)
    for headers in sessions:
        assert _env_values_in(headers) == set(), headers
    assert "own-key" in " ".join(sessions[-1].values())
    # The operator's provider gets the environment's credentials for its own base URL.
    assert SECRETS[KEYS[kind]] in _env_values_in(operators)


async def test_s1_a_keyless_config_that_is_refused_says_it_must_bring_a_key(
    environment: None,
) -> None:
    async with (
        ReplayServer([HELLO]) as server,
        Client(store="memory") as client,
    ):
        server.fail_next(401, message="Incorrect API key provided")
        url = f"{server.base_url}/chat/completions"
        session = await client.create_session(
            provider={"type": "openai", "base_url": server.base_url, "max_retries": 0}
        )
        with pytest.raises(SessionError) as failed:
            await session.send_and_wait("Hi")
    assert failed.value.error_type == "authentication"
    assert failed.value.message.startswith(f"HTTP 401: Incorrect API key provided ({url});")
    assert "give the session's provider its own api_key" in failed.value.message
    assert server.received[0].headers["authorization"] == "Bearer unused"


async def test_s1_the_clients_default_provider_is_the_operators_and_sessions_are_not(
    environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with ReplayServer([HELLO]) as server:
        own = {"type": "openai", "base_url": server.base_url}
        # No base_url: the vendor's endpoint (OPENAI_BASE_URL stands for it here), the key's.
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        store = MemoryStore()
        async with Client(store=store, provider=own) as client:
            default = await client.create_session()
            chosen = await client.create_session(provider=dict(own))
            vendor = await client.create_session(provider={"type": "openai"})
            for session in (default, chosen, vendor):
                await session.send_and_wait("Hi")
            ids = [default.session_id, chosen.session_id]
        # Resumed from its log by a client with no default provider: a session's config.
        async with Client(store=store) as other:
            for session_id in ids:
                resumed = await other.resume_session(session_id)
                await resumed.send_and_wait("Hi")
    auth = [request.headers["authorization"] for request in server.received]
    key = f"Bearer {SECRETS['OPENAI_API_KEY']}"
    assert auth == [key, "Bearer unused", key, "Bearer unused", "Bearer unused"]


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"X Tenant": "tenant-secret"}, "header 'X Tenant' holds a character HTTP cannot carry"),
        ({"Authorization": "Bearer sk-h\u00e9re"}, "'Authorization' holds a character HTTP"),
        (
            {"Transfer-Encoding": "chunked-secret"},
            "header 'Transfer-Encoding' is the HTTP client's",
        ),
    ],
)
def test_s1_d9_provider_headers_http_cannot_send_are_refused_without_their_values(
    headers: dict[str, str], message: str
) -> None:
    """Refused when the config is read, not by every model call; the error never repeats a
    value given (a header often holds a key), nor does any other error of the config."""
    with pytest.raises(ValidationError, match=message) as caught:
        ProviderConfig(type="openai", api_key="sk-config-key", headers=headers)
    assert all(value not in str(caught.value) for value in headers.values())
    with pytest.raises(ValidationError) as caught:
        ProviderConfig(type="openai", api_key=["sk-config-key"])
    assert "sk-config-key" not in str(caught.value)
    # A proxy reached by address may need its host named: the config's own choice.
    assert ProviderConfig(type="openai", headers={"Host": "llm.internal"}).headers
