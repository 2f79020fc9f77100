"""Shared fixtures: a Client on each real store, the PostgreSQL test database, and helpers to
read what a session did.

The PostgreSQL cases get one fresh schema per test from `TRIMTAB_TEST_PG_DSN`, which
`.ci/start-postgres.sh` sets. Without it they skip, or fail where every requirement must be met
(`tests/requirements.py`): CI's second run must never pass without having used PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests import requirements
from tests.requirements import require_psycopg as require_psycopg  # where older tests find it
from trimtab import Client, Event, PermissionHandler, Session, Tool, ToolInvocation, define_tool
from trimtab.testing import ScriptedModel


class ClearArgs(BaseModel):
    prompt: str


class EchoArgs(BaseModel):
    text: str


pytest_plugins = ["tests.leftovers"]

PG_DSN_VARIABLE = "TRIMTAB_TEST_PG_DSN"
START_POSTGRES = "source .ci/start-postgres.sh to start a server"


def require_env(name: str) -> str:
    """The PostgreSQL variable's value (`.ci/start-postgres.sh` sets them all)."""
    return requirements.require_env(name, START_POSTGRES)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    requirements.record(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    requirements.record(report)


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background by a non-interactive shell (`pytest &` in a script)
    # inherits SIGINT ignored, and so would every process it starts: the tests that press
    # Ctrl-C would wait for an interrupt nothing can deliver. A handler, unlike SIG_IGN, is
    # not inherited across exec: the children start with the default, as from a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A DSN whose `search_path` is a new, empty schema, dropped after the test.

    Synchronous, so that async fixtures can get it with `request.getfixturevalue`.
    """
    server = require_env(PG_DSN_VARIABLE)
    require_psycopg()
    import psycopg

    schema = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        if server.startswith(("postgresql://", "postgres://")):  # stay a URL, for open_store
            yield f"{server}{'&' if '?' in server else '?'}options=-csearch_path%3D{schema}"
        else:
            yield psycopg.conninfo.make_conninfo(server, options=f"-csearch_path={schema}")
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def client(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Client]:
    """A runtime on each real store backend."""
    store: str | Path
    if request.param == "postgres":
        store = request.getfixturevalue("pg_dsn")
    else:
        store = "memory" if request.param == "memory" else tmp_path / "trimtab.db"
    async with Client(store=store) as runtime:
        yield runtime


class Recorder:
    """Collects every event a session delivers, ephemeral ones included."""

    def __init__(self, session: Session) -> None:
        self.events: list[Event] = []
        self._arrived = asyncio.Event()
        session.on(self._record)

    def _record(self, event: Event) -> None:
        self.events.append(event)
        self._arrived.set()

    async def wait_for(self, event_type: str, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until `count` events of `event_type` arrived."""
        async with asyncio.timeout(timeout):
            while len(self.of(event_type)) < count:
                self._arrived.clear()
                await self._arrived.wait()

    @property
    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def of(self, event_type: str) -> list[Any]:
        return [e for e in self.events if e.type == event_type]


async def clear_handler(params: ClearArgs, invocation: ToolInvocation) -> str:
    result = await invocation.session.history.clear_context(params.prompt)
    return f"Cleared {result.messages_cleared} messages."


def clear_tool(*, is_terminal: bool = True, handler: Callable[..., Any] = clear_handler) -> Tool:
    return define_tool(
        "clear_context",
        description="Clear the conversation and start a fresh context window",
        params_type=ClearArgs,
        is_terminal=is_terminal,
        defer="never",
        handler=handler,
    )


def echo_tool(**options: Any) -> Tool:
    return define_tool(
        "echo", description="Echo text", params_type=EchoArgs, handler=lambda p: p.text, **options
    )


async def open_session(
    client: Client, scripted: ScriptedModel, /, *tools: Tool, **options: Any
) -> Session:
    options.setdefault("on_permission_request", PermissionHandler.approve_all)
    options.setdefault("system_message", "SYSTEM")
    return await client.create_session(provider=scripted, tools=list(tools), **options)


def roles(model: ScriptedModel, index: int) -> list[tuple[str, str]]:
    """The (role, content) pairs of the model's request number `index`."""
    return [(m.role, m.content) for m in model.requests[index].messages]


def restart_command() -> list[str]:
    """`pg_ctl restart` of the test cluster, as the OS user that owns it."""
    pg_ctl = require_env("TRIMTAB_TEST_PG_CTL")
    data = require_env("TRIMTAB_TEST_PG_DATA")
    log = os.environ.get("TRIMTAB_TEST_PG_LOG", os.devnull)
    # -l: without it the server would write to (and hold open) our pipes.
    command = [pg_ctl, "restart", "-D", data, "-l", log, "-m", "fast", "-w", "-t", "20"]
    owner = pwd.getpwuid(os.stat(data).st_uid).pw_name
    if os.geteuid() == 0 and owner != "root":
        command = ["runuser", "-u", owner, "--", *command]
    return command
