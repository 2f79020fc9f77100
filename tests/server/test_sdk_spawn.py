"""Every official Copilot SDK can spawn `trimtab serve` (issue 33): each SDK's exact argv, as
its spawn code builds it, starts a real server that completes the handshake the SDK begins
with (`connect`, with the connection token the SDK put in the environment over TCP).

The table is the contract: a stricter parser that rejects a flag of any row fails here.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.server.raw import RawClient
from trimtab.protocol.errors import AUTHENTICATION_FAILED
from trimtab.protocol.framing import encode_frame

PORT = "{port}"
"""Stands for the port the SDK was told to use (a free one, found when the test runs)."""

# What each SDK runs is `<cli path> <the connection's args> <the SDK's args>`, the
# connection's args being `serve --store ...` here (Rust's `prefix_args`). Each row is the
# SDK's args with every option it has set (log level, port, a GitHub token, no logged-in
# user, an idle timeout, remote sessions), and with none (the defaults).
SDK_ARGVS: dict[str, list[str]] = {
    # Node: nodejs/src/client.ts, CopilotClient.startCLIServer
    "node-stdio": ["--headless", "--no-auto-update", "--stdio"],
    "node-tcp": ["--headless", "--no-auto-update"],
    "node-tcp-all": [
        "--headless",
        "--no-auto-update",
        "--log-level",
        "debug",
        "--port",
        PORT,
        "--auth-token-env",
        "COPILOT_SDK_AUTH_TOKEN",
        "--no-auto-login",
        "--session-idle-timeout",
        "300",
        "--remote",
    ],
    # Python: python/copilot/client.py, CopilotClient._start_cli_server
    "python-stdio": ["--headless", "--no-auto-update", "--log-level", "info", "--stdio"],
    "python-tcp": ["--headless", "--no-auto-update", "--log-level", "info"],
    "python-tcp-all": [
        "--headless",
        "--no-auto-update",
        "--log-level",
        "debug",
        "--auth-token-env",
        "COPILOT_SDK_AUTH_TOKEN",
        "--no-auto-login",
        "--session-idle-timeout",
        "300",
        "--remote",
        "--port",
        PORT,
    ],
    # Go: go/client.go, Client.startCLIServer
    "go-stdio": ["--headless", "--no-auto-update", "--stdio"],
    "go-tcp-all": [
        "--headless",
        "--no-auto-update",
        "--log-level",
        "all",
        "--port",
        PORT,
        "--auth-token-env",
        "COPILOT_SDK_AUTH_TOKEN",
        "--no-auto-login",
        "--session-idle-timeout",
        "300",
        "--remote",
    ],
    # .NET: dotnet/src/Client.cs, CopilotClient.StartCliServerAsync
    "dotnet-stdio": ["--headless", "--no-auto-update", "--stdio"],
    "dotnet-tcp-all": [
        "--headless",
        "--no-auto-update",
        "--log-level",
        "debug",
        "--port",
        PORT,
        "--auth-token-env",
        "COPILOT_SDK_AUTH_TOKEN",
        "--no-auto-login",
        "--session-idle-timeout",
        "300",
        "--remote",
    ],
    # Java: java/sdk/src/main/java/com/github/copilot/CliServerManager.java, startCliServer
    "java-stdio": ["--server", "--no-auto-update", "--log-level", "info", "--stdio"],
    "java-tcp": ["--server", "--no-auto-update", "--log-level", "info"],
    "java-tcp-all": [
        "--server",
        "--no-auto-update",
        "--log-level",
        "debug",
        "--port",
        PORT,
        "--auth-token-env",
        "COPILOT_SDK_AUTH_TOKEN",
        "--no-auto-login",
        "--session-idle-timeout",
        "300",
        "--remote",
    ],
    # Rust: rust/src/lib.rs, Client::spawn_stdio and Client::spawn_tcp
    "rust-stdio": ["--server", "--stdio", "--no-auto-update"],
    "rust-stdio-all": [
        "--server",
        "--stdio",
        "--no-auto-update",
        "--log-level",
        "debug",
        "--auth-token-env",
        "COPILOT_SDK_AUTH_TOKEN",
        "--no-auto-login",
        "--session-idle-timeout",
        "300",
        "--remote",
    ],
    "rust-tcp": ["--server", "--port", "0", "--no-auto-update"],
    "rust-tcp-all": [
        "--server",
        "--port",
        PORT,
        "--no-auto-update",
        "--log-level",
        "debug",
        "--auth-token-env",
        "COPILOT_SDK_AUTH_TOKEN",
        "--no-auto-login",
        "--session-idle-timeout",
        "300",
        "--remote",
    ],
}

READY_TIMEOUT = 30.0
"""Seconds a server (an interpreter start on a busy machine) has to say it listens."""


@dataclass
class Spawned:
    """A server started as an SDK starts it; stopped (killed if need be) by the fixture."""

    process: subprocess.Popen[bytes]
    stderr: Path
    token: str | None

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Start `trimtab serve` with an SDK's args; every server is ended after the test."""
    started: list[Spawned] = []

    def start(args: list[str], *, env: dict[str, str] | None = None) -> Spawned:
        stdio = "--stdio" in args
        # Over TCP every SDK makes up a connection token and hands it over in the environment.
        token = None if stdio else str(uuid.uuid4())
        environment = {**os.environ, "TRIMTAB_HOME": str(tmp_path)}
        if token is not None:
            environment["COPILOT_CONNECTION_TOKEN"] = token
        environment["COPILOT_SDK_AUTH_TOKEN"] = "gho_not_used"
        stderr = tmp_path / f"server{len(started)}.log"
        command = [sys.executable, "-m", "trimtab", "serve", "--store", str(tmp_path / "t.db")]
        process = subprocess.Popen(
            [*command, *args],
            stdin=subprocess.PIPE if stdio else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr.open("wb"),
            env={**environment, **(env or {})},
        )
        spawned = Spawned(process, stderr, token)
        started.append(spawned)
        return spawned

    yield start
    for spawned in started:
        if spawned.process.poll() is None:
            spawned.process.kill()
        spawned.process.wait(timeout=30)


def _handshake_over_stdio(server: Spawned) -> list[dict[str, Any]]:
    """`connect` and `ping` on the server's stdin; its answers, once stdin is closed."""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "connect", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {"message": "sdk"}},
    ]
    stdin = b"".join(encode_frame(json.dumps(r).encode()) for r in requests)
    stdout, _ = server.process.communicate(stdin, timeout=READY_TIMEOUT)
    answers = []
    while stdout:
        header, _, rest = stdout.partition(b"\r\n\r\n")
        length = int(header.split(b":")[1])
        answers.append(json.loads(rest[:length]))
        stdout = rest[length:]
    return answers


def _listening_port(server: Spawned) -> int:
    stdout = server.process.stdout
    assert stdout is not None
    ready, _, _ = select.select([stdout], [], [], READY_TIMEOUT)
    line = stdout.readline().decode() if ready else ""
    found = re.fullmatch(r"listening on port (\d+)\n", line)
    assert found is not None, f"{line!r}\n{server.log()}"
    return int(found.group(1))


@pytest.mark.parametrize("sdk", list(SDK_ARGVS))
def test_s8_every_official_sdk_spawns_the_server(spawn: Any, sdk: str) -> None:
    port = _free_port()
    args = [str(port) if arg == PORT else arg for arg in SDK_ARGVS[sdk]]
    server = spawn(args)
    if "--stdio" in args:
        connected, pong = _handshake_over_stdio(server)
        assert server.process.returncode == 0, server.log()
    else:
        listening = _listening_port(server)
        if PORT in SDK_ARGVS[sdk]:
            assert listening == port
        client = RawClient(listening)
        try:
            connected = client.request("connect", {"token": server.token})
            pong = client.request("ping", {"message": "sdk"})
        finally:
            client.close()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0, server.log()
    assert connected["result"]["protocolVersion"] == 3, connected
    assert pong["result"]["message"] == "pong: sdk"
    # The one meaningful option besides the transport: what goes to stderr.
    debug = (
        args[args.index("--log-level") + 1] in ("debug", "all") if "--log-level" in args else False
    )
    assert (" DEBUG trimtab.server: " in server.log()) == debug, server.log()


def test_s8_the_token_a_tcp_sdk_hands_over_is_required(spawn: Any) -> None:
    server = spawn(SDK_ARGVS["java-tcp"])
    client = RawClient(_listening_port(server))
    try:
        refused = client.request("connect", {"token": "not-" + str(server.token)})
        assert refused["error"]["code"] == AUTHENTICATION_FAILED
        assert client.request("connect", {"token": server.token})["result"]["protocolVersion"] == 3
    finally:
        client.close()


def test_s8_a_stdio_server_ignores_a_token_inherited_in_the_environment(spawn: Any) -> None:
    # A stdio client sends no token; its runtime inherits the parent's environment.
    server = spawn(SDK_ARGVS["node-stdio"], env={"COPILOT_CONNECTION_TOKEN": "inherited"})
    connected, _ = _handshake_over_stdio(server)
    assert connected["result"]["protocolVersion"] == 3, server.log()
