"""Spec S1 through a real `trimtab serve` (issue 15, item 1): the server's `OPENAI_API_KEY`
goes to its own `--provider` only, never to a base URL a client chose, nor to one a session
resumed from its log names. The model is a replay server on 127.0.0.1 that records every
request's headers; the client speaks raw JSON-RPC frames."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.server.conftest import StartServer, assistant, conversation, user
from tests.server.raw import RawClient
from trimtab.testing import ReplayServer

SERVER_KEY = "sk-server-secret"
TWO_TURNS = conversation(user("Hi"), assistant("Hello"), user("Hi"), assistant("Hello"))


def _turn(client: RawClient, session_id: str, **create: Any) -> dict[str, Any]:
    """Create (or resume) a session, run one turn; the `sendAndWait` answer."""
    method = "session.resume" if create.pop("resume", False) else "session.create"
    client.result(method, {"sessionId": session_id, **create})
    return client.request("session.sendAndWait", {"sessionId": session_id, "prompt": "Hi"})


async def test_s1_the_servers_key_goes_only_to_its_own_provider(
    start_server: StartServer,
) -> None:
    async with ReplayServer([TWO_TURNS]) as model:
        own = {"type": "openai", "baseUrl": model.base_url}
        url = f"{model.base_url}/chat/completions"
        env = {"OPENAI_API_KEY": SERVER_KEY}
        server = start_server(None, "--provider", json.dumps(own), env=env)

        def first_server() -> list[dict[str, Any]]:
            client = server.raw()
            return [
                _turn(client, "default"),  # the server's provider
                _turn(client, "keyless", provider=own),  # the client's URL, no key
                _turn(client, "keyed", provider={**own, "apiKey": "client-key"}),
            ]

        answers = await asyncio.to_thread(first_server)
        assert all("result" in answer for answer in answers), answers
        assert server.stop() == 0

        # A server with no --provider rebuilds each session's provider from its log.
        plain = start_server(None, env=env)

        def second_server() -> list[dict[str, Any]]:
            client = plain.raw()
            return [_turn(client, name, resume=True) for name in ("default", "keyed")]

        resumed = await asyncio.to_thread(second_server)
        assert all("result" in answer for answer in resumed), resumed

        model.fail_next(401, message="Incorrect API key provided")

        def refused() -> dict[str, Any]:
            client = plain.raw()
            return _turn(client, "refused", provider=own)

        error = (await asyncio.to_thread(refused))["error"]

    auth = [request.headers.get("authorization") for request in model.received]
    assert auth == [
        f"Bearer {SERVER_KEY}",
        "Bearer unused",
        "Bearer client-key",
        "Bearer unused",  # resumed from the log: the key was never stored
        "Bearer unused",
        "Bearer unused",
    ]
    assert error["data"]["errorType"] == "authentication"
    assert error["message"].startswith(
        f"Session error: HTTP 401: Incorrect API key provided ({url});"
    )
    assert error["message"].endswith("give the session's provider its own api_key")


async def test_s17_the_operators_key_can_come_from_a_file_and_a_clients_config_names_none(
    start_server: StartServer, tmp_path: Path
) -> None:
    """`--api-key-file` (or `api_key_file` in the provider's JSON) keeps the key out of the
    server's environment; a client's provider config cannot name a key file (it would
    name any file, whose content would go to the client's endpoint)."""
    key_file = tmp_path / "openai.key"
    key_file.write_text(f"{SERVER_KEY}\n")  # as `echo` writes it
    three = conversation(user("Hi"), assistant("Hello"))
    async with ReplayServer([three, three, three]) as model:
        given = [
            ("--provider", json.dumps({"type": "openai", "baseUrl": model.base_url})),
            ("--api-key-file", str(key_file)),
        ]
        flag = start_server(None, *(arg for pair in given for arg in pair))
        in_json = {"type": "openai", "baseUrl": model.base_url, "api_key_file": str(key_file)}
        json_ = start_server(tmp_path / "second.db", "--provider", json.dumps(in_json))

        def turns() -> list[dict[str, Any]]:
            own = {"type": "openai", "baseUrl": model.base_url, "apiKeyFile": str(key_file)}
            return [
                _turn(flag.raw(), "from-flag"),
                _turn(json_.raw(), "from-json"),
                _turn(flag.raw(), "clients", provider=own),
            ]

        answers = await asyncio.to_thread(turns)
    assert all("result" in answer for answer in answers), answers
    auth = [request.headers.get("authorization") for request in model.received]
    assert auth == [f"Bearer {SERVER_KEY}", f"Bearer {SERVER_KEY}", "Bearer unused"]
