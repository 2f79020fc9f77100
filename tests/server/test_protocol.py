"""Protocol details beyond the shared scenarios: handshake and tokens, hooks, streaming,
session listing, and the errors a client gets for calls the server cannot serve."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from copilot import CopilotClient, RuntimeConnection
from copilot.session import PermissionHandler
from pydantic import BaseModel

import trimtab
from tests.server.conftest import (
    ServerProcess,
    StartServer,
    assistant,
    call,
    conversation,
    provider,
    request_messages,
    tool,
    user,
)
from trimtab import TrimtabError
from trimtab.protocol.framing import encode_frame, read_frame
from trimtab.testing import ReplayServer


@pytest.fixture
async def official(shared_server: ServerProcess) -> AsyncIterator[CopilotClient]:
    client = CopilotClient(connection=shared_server.connection())
    await client.start()
    yield client
    await client.force_stop()


def rpc(port: int, *messages: dict[str, Any]) -> list[dict[str, Any]]:
    """Send requests on a fresh connection and return the answers, in id order."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for message in messages:
            sock.sendall(encode_frame(json.dumps(message).encode()))
        stream = sock.makefile("rb")
        answers = []
        for _ in messages:
            length = int(stream.readline().split(b":")[1])
            stream.readline()
            answers.append(json.loads(stream.read(length)))
    return sorted(answers, key=lambda a: str(a["id"]))


async def test_handshake_ping_status_and_auth(official: CopilotClient) -> None:
    assert (await official.ping("hi")).message == "pong: hi"
    assert (await official.get_status()).protocol_version == 3
    assert (await official.get_auth_status()).isAuthenticated is True


async def test_a_token_is_required_when_the_server_has_one(start_server: StartServer) -> None:
    server = start_server(None, "--token", "right-token")
    for token in (None, "wrong-token"):
        client = CopilotClient(
            connection=RuntimeConnection.for_uri(f"127.0.0.1:{server.port}", connection_token=token)
        )
        with pytest.raises(Exception, match="AUTHENTICATION_FAILED"):
            await client.start()
        await client.force_stop()
        with pytest.raises(TrimtabError, match="AUTHENTICATION_FAILED"):
            await trimtab.Client.connect(server.url, token=token).start()
    right = CopilotClient(
        connection=RuntimeConnection.for_uri(
            f"127.0.0.1:{server.port}", connection_token="right-token"
        )
    )
    await right.start()
    assert (await right.ping("x")).message == "pong: x"
    await right.force_stop()
    # Without `connect`, nothing else is served either.
    [answer] = rpc(server.port, {"jsonrpc": "2.0", "id": 1, "method": "session.list", "params": {}})
    assert "AUTHENTICATION_FAILED" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("url", "options", "error"),
    [
        ("http://127.0.0.1:8765", {}, "server address"),
        ("127.0.0.1:8765", {}, "server address"),
        ("tcp://:8765", {}, "server address"),
        ("tcp://127.0.0.1:99999", {}, "out of range"),
        ("tcp://127.0.0.1:8765", {"token": 5}, "token must be a string"),
        ("tcp://127.0.0.1:8765", {"heartbeat": float("nan")}, "heartbeat"),
    ],
)
def test_connect_refuses_what_cannot_name_a_server_before_connecting(
    url: str, options: dict[str, Any], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        trimtab.Client.connect(url, **options)


async def test_the_official_client_can_spawn_a_tcp_server(
    stdio_executable: Path, tmp_path: Path
) -> None:
    # `for_tcp` passes a generated token in COPILOT_CONNECTION_TOKEN and waits for the
    # "listening on port N" line; the server must honour both.
    connection = RuntimeConnection.for_tcp(
        path=str(stdio_executable), args=["--store", str(tmp_path / "t.db")]
    )
    client = CopilotClient(connection=connection, log_level="warning")
    await client.start()
    assert (await client.ping("spawned")).message == "pong: spawned"
    await client.stop()


class TextArgs(BaseModel):
    text: str


async def test_hooks_shape_prompts_arguments_and_results(official: CopilotClient) -> None:
    from copilot.tools import define_tool

    started: list[str] = []
    hooks: dict[str, Any] = {
        "on_session_start": lambda data, ctx: started.append(data["source"]),
        "on_user_prompt_submitted": lambda data, ctx: {"modifiedPrompt": "Use echo on hello"},
        "on_pre_tool_use": lambda data, ctx: {"modifiedArgs": {"text": "bye"}},
        "on_post_tool_use": lambda data, ctx: {"modifiedResult": f"{data['toolResult']}!"},
    }
    echo = define_tool(
        "echo",
        description="Upper-case",
        params_type=TextArgs,
        handler=lambda params, invocation: params.text.upper(),
        skip_permission=True,
    )
    recorded = conversation(
        user("Use echo on hello"),
        assistant(None, call("c1", "echo", text="hello")),
        tool("c1", "BYE!"),
        assistant("It said BYE!"),
    )
    async with ReplayServer([recorded]) as model:
        session = await official.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            tools=[echo],
            hooks=hooks,  # type: ignore[arg-type]
            on_permission_request=PermissionHandler.approve_all,
        )
        reply = await session.send_and_wait("hi", timeout=30)
    assert reply is not None and reply.data.content == "It said BYE!"  # type: ignore[union-attr]
    assert started == ["new"] and request_messages(model, 1)[-1] == ("tool", "BYE!")


async def test_a_blocked_prompt_runs_nothing(official: CopilotClient) -> None:
    warnings: list[Any] = []
    async with ReplayServer([]) as model:
        session = await official.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            hooks={"on_user_prompt_submitted": lambda d, c: {"decision": "block", "reason": "no"}},
            on_permission_request=PermissionHandler.approve_all,
        )
        session.on(
            lambda e: warnings.append(e.to_dict()) if e.type.value == "session.warning" else None
        )
        with pytest.raises(Exception, match="prompt_blocked"):
            await session.send("anything")
    assert model.requests == [] and warnings[0]["data"]["warningType"] == "policy_blocked"


async def test_streaming_sends_deltas(official: CopilotClient) -> None:
    deltas: list[str] = []
    recorded = conversation(
        user("Tell me a story"), assistant("Once upon a time, there was a test.")
    )
    async with ReplayServer([recorded], chunk_size=5) as model:
        session = await official.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            streaming=True,
            on_permission_request=PermissionHandler.approve_all,
        )
        session.on(
            lambda e: (
                deltas.append(e.data.delta_content)  # type: ignore[union-attr]
                if e.type.value == "assistant.message_delta"
                else None
            )
        )
        reply = await session.send_and_wait("Tell me a story", timeout=30)
    assert reply is not None and "".join(deltas) == reply.data.content  # type: ignore[union-attr]
    assert len(deltas) > 1


async def test_sessions_are_listed_and_deleted(
    official: CopilotClient, shared_server: ServerProcess
) -> None:
    recorded = conversation(user("Say hello"), assistant("Hello there!"))
    async with ReplayServer([recorded]) as model:
        session = await official.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            on_permission_request=PermissionHandler.approve_all,
        )
        await session.send_and_wait("Say hello", timeout=30)
    listed = {s.session_id: s for s in await official.list_sessions()}
    assert listed[session.session_id].summary == "Say hello"
    assert listed[session.session_id].is_remote is False
    async with shared_server.remote() as remote:
        records = {r.session_id: r for r in await remote.list_sessions()}
        assert records[session.session_id].event_count > 3
        await remote.delete_session(session.session_id)
        with pytest.raises(trimtab.SessionNotFoundError):
            await remote.delete_session(session.session_id)
    assert session.session_id not in {s.session_id for s in await official.list_sessions()}


async def test_calls_the_server_cannot_serve_get_clear_errors(
    shared_server: ServerProcess,
) -> None:
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "connect",
        "params": {"token": shared_server.token},
    }
    answers = rpc(
        shared_server.port,
        hello,
        {"jsonrpc": "2.0", "id": 1, "method": "session.workspaces.diff", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "session.send", "params": {}},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "session.send",
            "params": {"sessionId": "x", "prompt": "hi"},
        },
        {"jsonrpc": "2.0", "id": 4, "method": "session.create", "params": {"sessionId": "x"}},
        {"jsonrpc": "2.0", "id": 5, "method": "session.resume", "params": {"sessionId": "nope"}},
        {"jsonrpc": "2.0", "id": 6, "method": "session.detach", "params": {"sessionId": "x"}},
    )
    codes = [a.get("error", {}).get("code") for a in answers]
    # 0: connect ok; 1: unknown; 2: no sessionId; 3: not open here; 4: no provider;
    # 5: not stored; 6: detaching what is not attached is a no-op.
    assert codes == [None, -32601, -32602, -32002, -32602, -32002, None]
    assert answers[0]["result"]["protocolVersion"] == 3


async def test_tool_names_given_twice_are_invalid_params(shared_server: ServerProcess) -> None:
    tool = {"name": "echo", "description": "echo", "parameters": {"type": "object"}}
    create = {"sessionId": "dup-tools", "provider": {"type": "openai"}, "tools": [tool, tool]}
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "connect",
        "params": {"token": shared_server.token},
    }
    answers = rpc(
        shared_server.port,
        hello,
        {"jsonrpc": "2.0", "id": 1, "method": "session.create", "params": create},
        {"jsonrpc": "2.0", "id": 2, "method": "session.list", "params": {}},
    )
    assert answers[1]["error"]["code"] == -32602
    assert "unique" in answers[1]["error"]["message"]
    assert "dup-tools" not in json.dumps(answers[2])


async def test_t6_a_tool_name_no_provider_accepts_is_invalid_params(
    shared_server: ServerProcess,
) -> None:
    tool = {"name": "get weather", "description": "d", "parameters": {"type": "object"}}
    create = {"sessionId": "bad-name", "provider": {"type": "openai"}, "tools": [tool]}
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "connect",
        "params": {"token": shared_server.token},
    }
    answers = rpc(
        shared_server.port,
        hello,
        {"jsonrpc": "2.0", "id": 1, "method": "session.create", "params": create},
    )
    assert answers[1]["error"]["code"] == -32602
    assert "tools" in answers[1]["error"]["message"]


async def test_many_requests_in_flight_on_one_connection(official: CopilotClient) -> None:
    answers = await asyncio.gather(*(official.ping(str(n)) for n in range(50)))
    assert [a.message for a in answers] == [f"pong: {n}" for n in range(50)]


async def test_a_tool_whose_client_left_fails_instead_of_hanging(
    shared_server: ServerProcess,
) -> None:
    from copilot.tools import define_tool

    echo = define_tool(
        "echo",
        description="Upper-case",
        params_type=TextArgs,
        handler=lambda params, invocation: params.text.upper(),
        skip_permission=True,
    )
    recorded = conversation(
        user("Use echo on hello"),
        assistant(None, call("c1", "echo", text="hello")),
        tool("c1", "No connected client provides the tool 'echo'."),
        assistant("The tool is gone."),
    )
    owner, guest = (CopilotClient(connection=shared_server.connection()) for _ in range(2))
    async with ReplayServer([recorded]) as model:
        await owner.start()
        await guest.start()
        created = await owner.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            tools=[echo],
            on_permission_request=PermissionHandler.approve_all,
        )
        joined = await guest.resume_session(
            created.session_id,
            provider=provider(model),  # type: ignore[arg-type]
            on_permission_request=PermissionHandler.approve_all,
        )
        await created.disconnect()  # the only client with the tool leaves
        reply = await joined.send_and_wait("Use echo on hello", timeout=30)
        assert reply is not None and reply.data.content == "The tool is gone."  # type: ignore[union-attr]
        await owner.force_stop()
        await guest.force_stop()


async def test_w3_a_remote_send_and_wait_refuses_a_bad_timeout_before_sending(
    shared_server: ServerProcess,
) -> None:
    async with ReplayServer() as model, shared_server.remote() as remote:
        session = await remote.create_session(provider=provider(model), model="m")
        before = len(await session.get_events())
        for value in (-1.0, 0, float("nan")):
            with pytest.raises(ValueError, match="timeout must be a positive number"):
                await session.send_and_wait("hi", timeout=value)
        assert len(await session.get_events()) == before and model.requests == []


async def test_w4_a_call_waiting_on_a_frozen_server_ends_within_two_heartbeats(
    start_server: StartServer,
) -> None:
    server = start_server(None)
    hello = conversation(user("Say hello"), assistant("Hello!"))
    async with (
        ReplayServer([hello]) as model,
        server.remote(heartbeat=0.5) as remote,
    ):
        session = await remote.create_session(provider=provider(model), model="m")
        server.process.send_signal(signal.SIGSTOP)  # frozen: the socket stays open, silent
        try:
            started = time.monotonic()
            with pytest.raises(ConnectionError):
                async with asyncio.timeout(10):  # a regression fails here, not hangs
                    await session.get_events()
            # A heartbeat's silence, a ping's wait, and slack for a loaded machine.
            assert time.monotonic() - started < 2 * 0.5 + 2.0
        finally:
            server.process.send_signal(signal.SIGCONT)


async def test_w4_a_long_call_on_a_live_server_outlasts_many_heartbeats(
    shared_server: ServerProcess,
) -> None:
    hello = conversation(user("Say hello"), assistant("Hello!"))
    async with (
        ReplayServer([hello]) as model,
        shared_server.remote(heartbeat=0.3) as remote,
    ):
        session = await remote.create_session(provider=provider(model), model="m")
        model.stall_next(2.0)  # the model answers after ~7 heartbeats
        reply = await session.send_and_wait("Say hello", timeout=30)
        assert reply is not None and reply.data.content == "Hello!"


async def test_w4_connecting_to_a_server_that_never_answers_ends_in_time() -> None:
    with socket.socket() as silent:  # accepts (the kernel does), never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(10):  # a regression fails the assertion below
                await trimtab.Client.connect(url, heartbeat=0.3).start()
        assert time.monotonic() - started < 2 * 0.3 + 2.0
    with pytest.raises(ValueError, match="heartbeat must be a positive, finite number"):
        trimtab.Client.connect(url, heartbeat=float("nan"))


async def test_w4_a_server_that_answers_a_ping_with_an_error_is_still_watched() -> None:
    """An error is an answer (a server without `ping` is alive), so the watch goes on: once
    the server falls silent, the waiting call still ends."""
    pings = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal pings
        while (body := await read_frame(reader)) is not None:
            request = json.loads(body)
            if request["method"] == "connect":
                result: Any = {"ok": True, "protocolVersion": 3}
                answer = {"jsonrpc": "2.0", "id": request["id"], "result": result}
            elif request["method"] == "ping" and (pings := pings + 1) == 1:
                error = {"code": -32601, "message": "Method not found: ping"}
                answer = {"jsonrpc": "2.0", "id": request["id"], "error": error}
            else:
                continue  # silent from here on: `session.list` and later pings
            writer.write(encode_frame(json.dumps(answer).encode()))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with trimtab.Client.connect(url, heartbeat=0.3) as remote:
            with pytest.raises(ConnectionError):
                async with asyncio.timeout(10):  # a regression fails here, not hangs
                    await remote.list_sessions()
        assert pings >= 2
    finally:
        server.close()
