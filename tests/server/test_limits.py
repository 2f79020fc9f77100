"""Hostile clients against a real `trimtab serve` process, over raw sockets (issue 15, items
2-5): empty tokens, clients that never read, stalled and idle sockets, too many connections,
and JSON nested too deeply. In each case the server stays up for everyone else."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_model import FakeModel
from tests.server.conftest import ServerProcess, StartServer
from tests.server.raw import RawClient, rss_kb, unestablished
from trimtab.protocol.errors import AUTHENTICATION_FAILED, SERVER_BUSY
from trimtab.protocol.jsonrpc import INVALID_PARAMS, PARSE_ERROR
from trimtab.server import ServerOptions, serve
from trimtab.server.auth import Credentials

TOKEN = "s3cret-token"


def _serve_exit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m trimtab.server ARGS` in a clean environment, expected to stop at once."""
    return subprocess.run(
        [sys.executable, "-m", "trimtab.server", "--store", "memory", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_clean_env(), **(env or {})},
    )


def _clean_env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if key not in ("COPILOT_CONNECTION_TOKEN", "TRIMTAB_STORE")
    }


# --- item 2: an empty token is no token ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--host", "0.0.0.0", "--token", ""], None),
        (["--host", "0.0.0.0"], {"COPILOT_CONNECTION_TOKEN": ""}),
    ],
)
def test_issue15_2_an_empty_token_does_not_open_a_public_address(
    args: list[str], env: dict[str, str] | None
) -> None:
    done = _serve_exit(*args, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: refusing to listen on '0.0.0.0' without a connection")
    assert done.stdout == "" and "Traceback" not in done.stderr


async def test_issue15_2_an_empty_token_is_refused_in_process() -> None:
    with pytest.raises(ValueError, match="without a connection token"):
        await serve(ServerOptions(host="0.0.0.0", token="", store="memory"))
    with pytest.raises(ValueError, match="empty connection token"):
        Credentials.single("")


def test_issue15_2_an_empty_token_never_authenticates(start_server: StartServer) -> None:
    server = start_server(None, "--token", TOKEN)
    client = RawClient(server.port)
    for token in ("", None):
        answer = client.request("connect", {} if token is None else {"token": token})
        assert answer["error"]["code"] == AUTHENTICATION_FAILED
    assert client.request("ping")["error"]["code"] == AUTHENTICATION_FAILED
    assert client.result("connect", {"token": TOKEN})["protocolVersion"] == 3


# --- item 3: a client that never reads is cut off -------------------------------------------


def test_issue15_3_a_client_that_never_reads_is_cut_off_and_memory_stays_bounded(
    start_server: StartServer, record_property: Any
) -> None:
    server = start_server(None)
    before = rss_kb(server.process.pid)
    flood = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    connect = {"jsonrpc": "2.0", "id": 0, "method": "connect", "params": {"token": server.token}}
    flood.sendall(_frame(connect))
    # Each ping is answered with its message: 64 KiB out for every 64 KiB in, never read.
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"message": "x" * 65536}}
    frame = _frame(ping)
    sent, cut = 0, False
    other_answers: list[str] = []

    def other_client() -> None:
        # Meanwhile another client is served as usual.
        client = server.raw()
        for n in range(20):
            other_answers.append(client.result("ping", {"message": n})["message"])
        client.close()

    helper = threading.Thread(target=other_client)
    helper.start()
    try:
        while sent < 256 * 1024 * 1024:  # 4x more than the limit lets through
            flood.sendall(frame)
            sent += len(frame)
    except (BrokenPipeError, ConnectionResetError):
        cut = True
    helper.join(timeout=60)
    peak = rss_kb(server.process.pid, "VmHWM")
    after = rss_kb(server.process.pid)
    record_property("rss_before_mb", round(before / 1024, 1))
    record_property("rss_peak_mb", round(peak / 1024, 1))
    record_property("flood_sent_mb", round(sent / 2**20, 1))
    assert cut, f"sent {sent} bytes without being cut off"
    assert other_answers == [f"pong: {n}" for n in range(20)]
    # The default limit is 8 MiB of unsent output; add what the kernel and Python hold.
    assert peak - before < 80 * 1024, (before, peak, after)
    assert "left more than 8388608 bytes of output unread" in _log_when(server, "unread")
    assert server.raw().result("ping", {"message": "still up"})["message"]


async def test_s3_a_client_that_reads_gets_its_own_large_message_back(
    start_server: StartServer,
) -> None:
    # A prompt past the output limit (within the frame limit) comes back to its client in its
    # `user.message`, more events queued behind it: the client still reads, and is answered.
    async with FakeModel(reply="done") as model:
        provider = {"type": "openai", "base_url": model.base_url, "api_key": "k"}
        server = start_server(None, "--provider", json.dumps(provider))

        def converse() -> Any:
            client = server.raw()
            client.result("session.create", {"sessionId": "big"})
            prompt = "x" * (9 * 2**20)
            return client.result("session.sendAndWait", {"sessionId": "big", "prompt": prompt})

        answer = await asyncio.to_thread(converse)
    assert answer["response"]["data"]["content"] == "done"
    assert "unread" not in server.log.read_text()


def test_s3_a_client_gets_a_large_frame_read_only_once_it_has_the_token(
    start_server: StartServer,
) -> None:
    # Parsing a frame of tiny objects costs ~30x its size: before `connect` with the token,
    # a frame past what a `connect` needs is refused before its body is read.
    server = start_server(None, "--token", TOKEN)
    params = {"message": "x" * 2**20}
    large = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": params}
    stranger = RawClient(server.port)
    stranger.send(large)
    answer = stranger.receive()
    assert answer is not None and answer["error"]["code"] == PARSE_ERROR
    assert stranger.receive() is None  # closed: the stream cannot be resynchronised
    member = RawClient(server.port)
    member.result("connect", {"token": TOKEN})
    answer = member.request("ping", params)
    assert answer["result"]["message"] == "pong: " + "x" * 2**20, str(answer)[:300]


def _frame(message: Any) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def _log_when(server: ServerProcess, text: str, within: float = 10.0) -> str:
    """The server's log, once it contains `text` (or after `within` seconds)."""
    deadline = time.monotonic() + within
    while text not in (log := server.log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return log


# --- item 4: stalled, idle and surplus connections ------------------------------------------


@pytest.fixture
def many_files() -> Iterator[None]:
    """Room for 1,000+ sockets in this process and in the servers it starts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if wanted < 2500:
        pytest.skip(f"the open-file limit ({hard}) is too low for this test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_issue15_4_stalled_sockets_neither_lock_out_a_client_nor_stay(
    start_server: StartServer, many_files: None
) -> None:
    server = start_server(None, "--token", TOKEN, "--connect-timeout", "3")
    stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(1200)]
    half = stalled[:600]
    for sock in half:
        sock.sendall(b"Content-Len")  # a header begun, never finished
    try:
        client = RawClient(server.port)
        assert client.result("connect", {"token": TOKEN})["ok"] is True
        assert client.result("ping", {"message": "hi"})["message"] == "pong: hi"
        # Unauthenticated connections are closed after the connect deadline; this one stays.
        time.sleep(3.5)
        assert all(_closed(sock) for sock in stalled)
        assert client.result("ping", {"message": "still"})["message"] == "pong: still"
    finally:
        for sock in stalled:
            sock.close()


def test_a_burst_of_connections_waits_in_the_accept_queue_while_the_server_is_busy(
    start_server: StartServer,
) -> None:
    """Clients connecting together while the server's one thread is busy complete their
    handshakes at once: the listening socket's queue holds them, where asyncio's default of
    100 would drop the rest, each retrying its connection a second (then 3, 7...) later."""
    server = start_server(None, "--token", TOKEN)
    server.process.send_signal(signal.SIGSTOP)  # busy: accepts nothing
    try:
        assert unestablished(server.port, 400) == 0
    finally:
        server.process.send_signal(signal.SIGCONT)
    client = RawClient(server.port)
    assert client.result("connect", {"token": TOKEN})["ok"] is True


def _closed(sock: socket.socket) -> bool:
    """Whether the server has closed (or reset) this connection, waiting up to 10 s."""
    sock.settimeout(10)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def test_issue15_4_a_frame_header_must_arrive_in_time(start_server: StartServer) -> None:
    server = start_server(None, "--frame-timeout", "1")
    client = RawClient(server.port)
    client.sock.sendall(b"Content-Length: 40\r\n")  # and nothing more
    answer = client.receive()
    assert answer is not None and answer["error"]["code"] == PARSE_ERROR
    assert "took more than 1 s" in answer["error"]["message"]
    assert client.receive() is None  # then closed
    # A body that stops halfway is cut off too.
    client = RawClient(server.port)
    client.sock.sendall(b"Content-Length: 40\r\n\r\n{")
    answer = client.receive()
    assert answer is not None and "paused for more than 1 s" in answer["error"]["message"]


def test_issue15_4_idle_connections_are_closed_unless_a_session_is_attached(
    start_server: StartServer,
) -> None:
    server = start_server(None, "--idle-timeout", "1")
    idle, busy = server.raw(), server.raw()
    busy.result("session.create", {"sessionId": "kept", "provider": {"type": "openai"}})
    assert idle.closed_by_server(within=10)
    time.sleep(1.5)
    # The connection holding a session is kept, however long it waits.
    assert busy.result("ping", {"message": "here"})["message"] == "pong: here"


def test_issue15_4_connections_beyond_the_limit_are_refused_clearly(
    start_server: StartServer,
) -> None:
    server = start_server(None, "--max-connections", "3")
    open_ = [server.raw() for _ in range(3)]
    for client in open_:
        client.result("ping")
    refused = RawClient(server.port)
    answer = refused.receive()
    assert answer is not None and answer["error"]["code"] == SERVER_BUSY
    assert answer["error"]["message"].startswith("SERVER_BUSY: the server has 3 connections open")
    assert refused.receive() is None
    open_[0].close()
    # Once the server has seen that one go, a new client is served.
    deadline = time.monotonic() + 20
    while True:
        client = RawClient(server.port)
        answer = client.request("connect", {"token": server.token})
        if "result" in answer:
            answer = client.request("ping", {"message": "in"})
        if "result" in answer or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert answer["result"]["message"] == "pong: in"


# --- item 5: JSON nested too deeply -------------------------------------------------------


def test_issue15_5_deep_json_is_a_parse_error_on_a_connection_that_stays_open(
    start_server: StartServer,
) -> None:
    server = start_server(None)
    client = server.raw()
    client.send(b"[" * 100_000 + b"]" * 100_000)
    answer = client.receive()
    assert answer == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": PARSE_ERROR, "message": "Parse error: the JSON is nested too deeply"},
    }
    deep = b'{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"message": %s}}' % (
        b'{"a": ' * 50_000 + b"1" + b"}" * 50_000
    )
    client.send(deep)
    assert client.response(7)["error"]["code"] == PARSE_ERROR
    # Params that parse, but are too deep to store, are invalid params; nothing is created.
    schema = json.loads("[" * 500 + "]" * 500)
    params = {
        "sessionId": "deep",
        "provider": {"type": "openai"},
        "tools": [{"name": "t", "parameters": {"type": "object", "x": schema}}],
    }
    answer = client.request("session.create", params)
    assert answer["error"]["code"] == INVALID_PARAMS
    assert "nested deeper than 64 levels" in answer["error"]["message"]
    assert client.result("session.list")["sessions"] == []
    assert client.result("ping", {"message": "alive"})["message"] == "pong: alive"
    assert "Traceback" not in server.log.read_text()


def test_issue15_5_deep_json_over_stdio_is_answered_without_a_traceback(tmp_path: Path) -> None:
    """Over stdio too: one parse error, the server goes on, stderr stays clean."""
    requests = b"".join(
        _frame_bytes(body)
        for body in (
            b"[" * 200_000 + b"]" * 200_000,
            json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {}}).encode(),
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "trimtab.server", "--stdio", "--store", "memory"],
        input=requests,
        capture_output=True,
        timeout=60,
        env=_clean_env(),
    )
    assert done.returncode == 0
    assert b'"code":-32700' in done.stdout and b'"id":2,"result"' in done.stdout
    assert b"Traceback" not in done.stderr


def _frame_bytes(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
