"""Fixtures of the server tests: real `trimtab serve` subprocesses on 127.0.0.1, recorded
model conversations (`ReplayServer`), and a driver per transport."""

from __future__ import annotations

import json
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from copilot import RuntimeConnection

import trimtab
from tests.server.accounts import other_account, shared_directory  # noqa: F401 (fixtures)
from tests.server.drivers import Driver, OfficialDriver, RemoteDriver
from tests.server.raw import RawClient
from trimtab.remote import RemoteClient
from trimtab.server.command import TOKEN_VARIABLE
from trimtab.testing import Conversation, ConversationMessage, ReplayServer

SYSTEM = "You are a test assistant."
TRANSPORTS = ["official-tcp", "official-stdio", "trimtab-remote"]


# --- conversations -------------------------------------------------------------------------


def conversation(*messages: dict[str, Any]) -> Conversation:
    return Conversation(messages=[ConversationMessage.model_validate(m) for m in messages])


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None = None, *calls: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def provider(model: ReplayServer) -> dict[str, Any]:
    """A BYOK provider config pointed at the replay server (same dict for both clients)."""
    return {"type": "openai", "base_url": model.base_url, "api_key": "test-key"}


def request_messages(model: ReplayServer, index: int) -> list[tuple[str, str | None]]:
    """(role, content) of each message of the model's request number `index`."""
    return [(m["role"], m.get("content")) for m in model.requests[index]["messages"]]


# --- server processes ----------------------------------------------------------------------


TOKEN_OPTIONS = ("--token", "--tokens-file", "--no-auth", "--stdio")


class ServerProcess:
    """`python -m trimtab.server` listening on 127.0.0.1: a real subprocess.

    Over TCP a server always asks for a token (spec S10): one is made for it here and passed
    as the official SDKs pass one (`COPILOT_CONNECTION_TOKEN`), unless the arguments or the
    environment choose how it authenticates, or `give_token` is False: then the server makes
    its own, read from its file under `env`'s `TRIMTAB_HOME` (which must be given). `token`
    is the token its clients present. `prefix` runs the server through a command that
    `exec`s it (`setpriv ... --`), so that `process.pid` is still the server's.
    """

    def __init__(
        self,
        store: Path | str,
        *args: str,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        give_token: bool = True,
        prefix: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.log = log or Path(store).with_suffix(f".{time.monotonic_ns()}.log")
        env = {**os.environ, **(env or {})}
        self.token: str | None = env.get(TOKEN_VARIABLE) or None
        chosen = "--token" in args or bool(set(args) & set(TOKEN_OPTIONS)) or bool(self.token)
        if "--token" in args:
            self.token = args[args.index("--token") + 1] or None
        elif not chosen and give_token:
            self.token = env[TOKEN_VARIABLE] = secrets.token_urlsafe(16)
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "trimtab.server", "--store", str(store), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log.open("wb"),
            env=env,
        )
        self.port = self._wait_ready(timeout=20.0)
        self.ready_seconds = time.perf_counter() - started
        if not chosen and not give_token:
            self.token_file = Path(env["TRIMTAB_HOME"], "serve", f"{self.port}.token")
            self.token = self.token_file.read_text()

    def connection(self) -> RuntimeConnection:
        """How the official client reaches this server, with its token."""
        return RuntimeConnection.for_uri(f"127.0.0.1:{self.port}", connection_token=self.token)

    def remote(self, **options: Any) -> RemoteClient:
        """trimtab's remote client of this server, with its token."""
        return trimtab.Client.connect(self.url, token=self.token, **options)

    def raw(self, **options: Any) -> RawClient:
        """A raw connection to this server that has presented its token."""
        return RawClient(self.port, token=self.token, **options)

    def _wait_ready(self, timeout: float) -> int:
        stdout = self.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        line = stdout.readline().decode() if ready else ""
        match = re.fullmatch(r"listening on port (\d+)\n", line)
        if match is None:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"server did not start: {line!r}\n{self.log.read_text()}")
        return int(match.group(1))

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def stop(self) -> int:
        """SIGTERM (a graceful stop: leases are released), then the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


StartServer = Callable[..., ServerProcess]
"""`start_server(store=None, *args, env=None)`: a server for this test only."""


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start servers for one test; all are stopped after it."""
    servers: list[ServerProcess] = []

    def start(store: Path | None = None, *args: str, **options: Any) -> ServerProcess:
        server = ServerProcess(store or tmp_path / "trimtab.db", *args, **options)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the TCP scenarios of a module: sessions are independent anyway. Its
    clients' attachments may be any file (a root of `/`): section 12's reading rules are
    those of a server that reads files (spec S13 bounds which)."""
    server = ServerProcess(
        tmp_path_factory.mktemp("shared") / "trimtab.db", "--attachments-root", "/"
    )
    yield server
    assert server.stop() == 0, server.log.read_text()


@pytest.fixture(scope="session")
def stdio_executable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the official client spawns for stdio: `trimtab serve` (the module entry point)."""
    path = tmp_path_factory.mktemp("bin") / "trimtab-serve"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m trimtab.server "$@"\n')
    path.chmod(0o755)
    return path


MakeDriver = Callable[..., Awaitable[Driver]]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_driver(
    transport: str,
    request: pytest.FixtureRequest,
    stdio_executable: Path,
    tmp_path: Path,
    start_server: StartServer,
) -> AsyncIterator[MakeDriver]:
    """Start clients of this test's transport. TCP clients go to `server` (default: the
    module's shared server); a stdio client spawns its own server on `store`.

    Clients stop before the test's own servers do (this fixture depends on `start_server`).
    """
    drivers: list[Driver] = []

    async def make(server: ServerProcess | None = None, store: Path | None = None) -> Driver:
        driver: Driver
        connection: RuntimeConnection
        if transport == "official-stdio":
            args = ["--store", str(store or tmp_path / "stdio.db")]
            connection = RuntimeConnection.for_stdio(path=str(stdio_executable), args=args)
            driver = OfficialDriver(transport, connection)
        else:
            server = server or request.getfixturevalue("shared_server")
            if transport == "official-tcp":
                driver = OfficialDriver(transport, server.connection())
            else:
                driver = RemoteDriver(server.url, token=server.token)
        await driver.start()
        drivers.append(driver)
        return driver

    yield make
    for driver in drivers:
        await driver.stop()
