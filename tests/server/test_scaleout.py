"""Scale-out: several `trimtab serve` processes sharing one store (a SQLite file, or one
PostgreSQL database), with servers killed mid-run, clients racing for one session and
reconnecting mid-run, and PostgreSQL restarted mid-run.

Every test checks the log a client reads back: each event once, in one unbroken parent
chain (nothing acknowledged lost, nothing doubled), and each run ending in exactly one
`session.idle` for the client that follows it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest
from pydantic import BaseModel

from tests.conftest import Recorder, restart_command
from tests.server.conftest import (
    ServerProcess,
    assistant,
    call,
    conversation,
    provider,
    tool,
    user,
)
from trimtab import Event, PermissionHandler, SessionError, define_tool
from trimtab.events import AssistantMessageEvent, UserMessageEvent
from trimtab.remote import RemoteClient
from trimtab.testing import ReplayServer

TTL = 2.0
"""The servers' lease TTL: a killed server's sessions are taken over this long after."""

INTERRUPTED = "The execution of this tool, or a previous tool was interrupted."

HI = conversation(user("Say hi"), assistant("Hi!"))


class TextArgs(BaseModel):
    text: str


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """What the servers share: a SQLite file, or a fresh PostgreSQL schema."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_dsn"))
    return str(tmp_path / "shared.db")


@pytest.fixture
def servers(store: str, tmp_path: Path) -> Iterator[Callable[[], ServerProcess]]:
    """Start `trimtab serve` processes on the shared store; all stop after the test."""
    started: list[ServerProcess] = []

    def start() -> ServerProcess:
        log = tmp_path / f"server-{len(started)}.log"
        server = ServerProcess(store, "--lease-ttl", str(TTL), log=log)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def kill_9(server: ServerProcess) -> float:
    """SIGKILL: no lease released, nothing flushed. Returns when it happened."""
    server.process.kill()
    server.process.wait()
    return time.monotonic()


async def until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    """Poll `condition`: it watches another process (the model server's requests)."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def drop_connection(client: RemoteClient) -> None:
    """The network drops the client's connection: no detach reaches the server."""
    runner = client._runner
    assert runner is not None
    runner.cancel()  # closes the connection
    await asyncio.gather(runner, return_exceptions=True)


def check_log(log: list[Event]) -> list[str]:
    """Assert that the log is one unbroken chain of distinct events; return their types."""
    assert len({e.id for e in log}) == len(log), "an event was stored twice"
    assert log[0].type == "session.start" and log[0].parent_id is None
    for before, event in zip(log, log[1:], strict=False):
        assert event.parent_id == before.id, f"the chain breaks at {event.type} {event.id}"
    return [e.type for e in log]


def contents(log: list[Event], event_type: str) -> list[str]:
    messages = (e for e in log if isinstance(e, UserMessageEvent | AssistantMessageEvent))
    return [e.data.content for e in messages if e.type == event_type]


async def test_r1_kill_9_mid_model_call_the_run_is_taken_over_and_finishes(
    servers: Callable[[], ServerProcess],
) -> None:
    async with ReplayServer([HI]) as model:
        owner, other = servers(), servers()
        model.stall_next(60)
        async with owner.remote() as first:
            session = await first.create_session(provider=provider(model))
            await session.send("Say hi")
            await until(lambda: len(model.requests) == 1)
            killed = kill_9(owner)

        async with other.remote() as second:
            resumed = await second.resume_session(session.session_id, provider=provider(model))
            seen = Recorder(resumed)  # type: ignore[arg-type]
            await seen.wait_for("session.idle", timeout=TTL + 10)
            took = time.monotonic() - killed
            log = await resumed.get_events()

    types = check_log(log)
    assert contents(log, "user.message") == ["Say hi"]
    assert contents(log, "assistant.message") == ["Hi!"]
    assert types.count("session.resume") == 1
    assert seen.types.count("session.idle") == 1
    assert took < TTL + 5, f"taken over {took:.1f} s after the kill"
    assert len(model.requests) == 2  # the call the crash cut is made again


async def test_p3_kill_9_mid_tool_call_the_call_is_cancelled_and_the_run_finishes(
    servers: Callable[[], ServerProcess],
) -> None:
    started = asyncio.Event()

    async def stuck(params: TextArgs) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    interrupted = conversation(
        user("Use echo on hello"),
        assistant(None, call("call_1", "echo", text="hello")),
        tool("call_1", INTERRUPTED),
        assistant("The echo was interrupted."),
    )
    async with ReplayServer([interrupted]) as model:
        owner, other = servers(), servers()
        options: dict[str, Any] = {
            "provider": provider(model),
            "on_permission_request": PermissionHandler.approve_all,
        }
        async with owner.remote() as first:
            session = await first.create_session(
                tools=[define_tool("echo", handler=stuck)], **options
            )
            await session.send("Use echo on hello")
            await asyncio.wait_for(started.wait(), 15)
            killed = kill_9(owner)

        async with other.remote() as second:
            ran: list[str] = []

            def echo_text(params: TextArgs) -> str:
                ran.append(params.text)
                return params.text.upper()

            echo = define_tool("echo", handler=echo_text)
            resumed = await second.resume_session(session.session_id, tools=[echo], **options)
            seen = Recorder(resumed)  # type: ignore[arg-type]
            await seen.wait_for("session.idle", timeout=TTL + 10)
            took = time.monotonic() - killed
            log = await resumed.get_events()

    types = check_log(log)
    assert types.count("tool.execution_start") == types.count("tool.execution_complete") == 1
    complete = next(e for e in log if e.type == "tool.execution_complete")
    assert complete.data.outcome == "cancelled"
    assert ran == []  # not idempotent: never run twice
    assert contents(log, "assistant.message")[-1] == "The echo was interrupted."
    assert seen.types.count("session.idle") == 1
    assert took < TTL + 5


async def test_r1_two_servers_racing_for_one_session_run_it_once_at_a_time(
    servers: Callable[[], ServerProcess], backend: str
) -> None:
    either_order = [
        conversation(user("from A"), assistant("to A"), user("from B"), assistant("to B")),
        conversation(user("from B"), assistant("to B"), user("from A"), assistant("to A")),
    ]
    async with ReplayServer(either_order) as model:
        a, b = servers(), servers()
        async with a.remote() as on_a, b.remote() as on_b:
            first = await on_a.create_session(provider=provider(model))
            second = await on_b.resume_session(first.session_id, provider=provider(model))
            seen_a, seen_b = Recorder(first), Recorder(second)  # type: ignore[arg-type]

            sends: list[Awaitable[object]] = [first.send_and_wait("from A", timeout=20)]
            if backend == "postgres":
                # Live events cross processes on PostgreSQL: B's client sees the run end.
                sends.append(second.send_and_wait("from B", timeout=20))
            else:
                sends.append(second.send("from B"))
            await asyncio.gather(*sends)
            await seen_a.wait_for("session.idle", 2)
            log = await first.get_events()

    types = check_log(log)
    assert sorted(contents(log, "user.message")) == ["from A", "from B"]
    assert sorted(contents(log, "assistant.message")) == ["to A", "to B"]
    # One run at a time: the second run's message comes after the first run's turn ended.
    runs = "".join(
        "u" if t == "user.message" else "e"
        for t in types
        if t in {"user.message", "assistant.turn_end"}
    )
    assert runs == "ueue"
    assert seen_a.types.count("session.idle") == 2
    if backend == "postgres":
        assert seen_b.types.count("session.idle") == 2
        assert [e.type for e in seen_b.events if not e.ephemeral] == types[
            -len([e for e in seen_b.events if not e.ephemeral]) :
        ]


async def test_r2_a_client_of_another_server_sees_the_owners_run_from_its_resume_on(
    servers: Callable[[], ServerProcess], backend: str
) -> None:
    twice = conversation(user("Say hi"), assistant("Hi!"), user("Again"), assistant("Hi!"))
    async with ReplayServer([twice]) as model:
        a, b = servers(), servers()
        model.stall_next(2)
        async with a.remote() as on_a, b.remote() as on_b:
            session = await on_a.create_session(provider=provider(model))
            await session.send("Say hi")
            await until(lambda: len(model.requests) == 1)
            # B's first follower: its listener connects (PostgreSQL) before the resume returns.
            followed = await on_b.resume_session(session.session_id, provider=provider(model))
            mine, seen = Recorder(session), Recorder(followed)  # type: ignore[arg-type]
            await session.send("Again")  # at once, A busy: the queue's change is live only
            await mine.wait_for("session.idle", 2, timeout=20)
            await seen.wait_for("session.idle", 2, timeout=10)

    live = [e.type for e in mine.events if e.ephemeral]
    assert "pending_messages.modified" in live and "session.usage_info" in live
    if backend == "postgres":
        assert seen.types == mine.types
    else:  # live events reach only the owner's own process: the log's, and each run's idle
        stored = [e.type for e in mine.events if not e.ephemeral or e.type == "session.idle"]
        assert seen.types == stored


async def test_e1_a_client_reconnecting_mid_run_finds_the_run_finished_once(
    servers: Callable[[], ServerProcess], backend: str
) -> None:
    async with ReplayServer([HI]) as model:
        a, b = servers(), servers()
        model.stall_next(1.5)
        async with a.remote() as first:
            session = await first.create_session(provider=provider(model))
            await session.send("Say hi")
            await until(lambda: len(model.requests) == 1)
            await drop_connection(first)
        # The connection is gone mid-run (no detach reached the server); the run goes on.
        # The client comes back on the other server where live events cross (PostgreSQL),
        # else on the same one.
        again = b if backend == "postgres" else a
        async with again.remote() as second:
            resumed = await second.resume_session(session.session_id, provider=provider(model))
            seen = Recorder(resumed)  # type: ignore[arg-type]
            await seen.wait_for("session.idle", timeout=10)
            log = await resumed.get_events()

    check_log(log)
    assert contents(log, "user.message") == ["Say hi"]
    assert contents(log, "assistant.message") == ["Hi!"]
    assert seen.types.count("session.idle") == 1
    assert len(model.requests) == 1


async def test_p2_postgres_restarted_mid_run_the_run_ends_cleanly_and_loses_nothing(
    pg_dsn: str, tmp_path: Path
) -> None:
    restart = restart_command()
    after = conversation(user("Say hi"), assistant("Hi!"), user("Say hi"), assistant("Hi!"))
    async with ReplayServer([after]) as model:
        server = ServerProcess(pg_dsn, log=tmp_path / "server.log")
        async with server.remote() as client:
            session = await client.create_session(provider=provider(model))
            seen = Recorder(session)  # type: ignore[arg-type]
            model.stall_next(3)
            run = asyncio.create_task(session.send_and_wait("Say hi", timeout=60))
            await until(lambda: len(model.requests) == 1)
            await asyncio.to_thread(subprocess.run, restart, check=True, capture_output=True)
            try:
                reply = await run
                first = reply.data.content if reply is not None else None
            except SessionError as error:
                first = f"error: {error}"  # failed cleanly: a typed error, then idle
            await seen.wait_for("session.idle")
            # The session still works once the database is back.
            reply = await session.send_and_wait("Say hi", timeout=30)
            log = await session.get_events()
        server.stop()

    check_log(log)
    assert first == "Hi!" or str(first).startswith("error: ")
    assert contents(log, "user.message") == ["Say hi", "Say hi"]
    assert reply is not None and reply.data.content == "Hi!"
    assert seen.types.count("session.idle") == 2


async def test_the_scale_out_example_runs_as_the_readme_says(pg_dsn: str) -> None:
    turns = conversation(
        user("Say hello."),
        assistant("Hello!"),
        user("Say hello again."),
        assistant("Hello again!"),
        user("And once more."),
        assistant("Once more!"),
    )
    async with ReplayServer([turns]) as model:
        env = {**os.environ, "TRIMTAB_EXAMPLE_PROVIDER": json.dumps(provider(model))}
        example = Path(__file__).parents[2] / "examples" / "02_scale_out.py"
        done = await asyncio.create_subprocess_exec(
            sys.executable, str(example), pg_dsn, env=env, stdout=PIPE, stderr=PIPE
        )
        out, err = await asyncio.wait_for(done.communicate(), 60)

    assert done.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[:2] == ["A: Hello!", "B (run in A): Hello again!"]
    assert re.fullmatch(r"B \(run in B, [\d.]+ s after A died\): Once more!", lines[2])
