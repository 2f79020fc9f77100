"""Runs are bounded over `trimtab serve` too (issue 14, item 5; spec E5): a session's cap on
model calls comes from trimtab's `maxTurns` field of `session.create` and `session.resume`
(the Copilot protocol has none), and a run that reaches it ends in `session.error
{errorType: "max_turns"}` and one `session.idle`, which `session.sendAndWait` reports."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import trimtab
from tests.fake_model import FakeModel
from tests.server.conftest import ServerProcess, StartServer
from trimtab.protocol.errors import RUN_FAILED
from trimtab.protocol.jsonrpc import INVALID_PARAMS


def capped_run(
    server: ServerProcess, method: str, params: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Open a session on a new connection (`session.create` or `session.resume`), run one
    prompt, and let go of it (the server closes it: a later resume opens it anew); return
    `sendAndWait`'s error and the types of the events sent meanwhile."""
    client = server.raw()
    session = {"sessionId": params["sessionId"]}
    try:
        client.result(method, params)
        answer = client.request("session.sendAndWait", {**session, "prompt": "go"})
        types = [
            n["params"]["event"]["type"]
            for n in client.notifications
            if n["method"] == "session.event"  # not the session.lifecycle ones
        ]
        client.result("session.detach", session)
        return answer["error"], types
    finally:
        client.close()


async def test_e5_max_turns_caps_a_run_over_serve_and_comes_from_create_and_resume(
    start_server: StartServer, tmp_path: Path
) -> None:
    """Before `maxTurns` and the cap, the run never ended and `sendAndWait` never answered."""
    async with FakeModel(tool="work", always_call=True) as model:
        server = start_server(tmp_path / "trimtab.db")
        create = {"sessionId": "capped", "provider": model.provider(), "maxTurns": 3}

        error, types = await asyncio.to_thread(capped_run, server, "session.create", create)
        assert len(model.requests) == 3
        assert (error["code"], error["data"]["errorType"]) == (RUN_FAILED, "max_turns")
        assert types.count("session.idle") == 1
        assert types[-2:] == ["session.error", "session.idle"]
        # The model called a tool the session does not have: each call failed, and the loop
        # went on, as it does with a tool whose call fails.
        assert types.count("tool.execution_complete") == 3

        resume = {"sessionId": "capped", "maxTurns": 5}
        error, types = await asyncio.to_thread(capped_run, server, "session.resume", resume)
        assert len(model.requests) == 3 + 5
        assert error["data"]["errorType"] == "max_turns"
        assert types.count("session.idle") == 1

        refused = server.raw()
        try:
            for turns in (0, True, 2.0, "3"):  # a whole number of turns, not coerced to one
                bad = {**create, "sessionId": "none", "maxTurns": turns}
                answer = await asyncio.to_thread(refused.request, "session.create", bad)
                assert answer["error"]["code"] == INVALID_PARAMS, turns
        finally:
            refused.close()


async def test_e5_the_native_remote_client_sends_max_turns(
    start_server: StartServer, tmp_path: Path
) -> None:
    """Before `max_turns` had a wire form in `Client.connect`'s sessions, it was refused there
    with a `TypeError` (not available on a remote session)."""
    async with FakeModel(tool="work", always_call=True) as model:
        server = start_server(tmp_path / "trimtab.db")
        async with server.remote() as remote:
            session = await remote.create_session(provider=model.provider(), max_turns=2)
            with pytest.raises(trimtab.SessionError) as raised:
                await session.send_and_wait("go", timeout=60)

    assert raised.value.error_type == "max_turns"
    assert len(model.requests) == 2
