"""Nothing acknowledged is lost (issue 14, item 1; spec P4), under `kill -9` at random moments.

A real `trimtab serve` runs sessions whose model takes a little time and calls a client-side
tool, while the official Copilot client keeps them busy: it sends message after message, so
that most arrive while a run is in progress and wait in the store's inbox. The server is
killed with SIGKILL at random moments (during start-up, a resume, a takeover, a model call, a
tool call, a send) and started again; the client comes back and resumes its sessions. At the
end the store's log must hold every acknowledged send exactly once, in one unbroken chain per
session, with every started tool call completed.

`TRIMTAB_KILL_LOOPS` sets the number of kills (5 by default, which keeps each variant near
15 s; the issue's figure is 20 or more), `TRIMTAB_KILL_SEED` the random seed (printed on
failure, so that a run can be repeated).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from copilot import CopilotClient
from copilot.generated.session_events import AssistantMessageData
from copilot.session import PermissionHandler
from copilot.tools import define_tool as copilot_tool
from pydantic import BaseModel

from tests.fake_model import FakeModel
from tests.server.conftest import ServerProcess
from trimtab.events import Event
from trimtab.store import open_store

KILLS = int(os.environ.get("TRIMTAB_KILL_LOOPS", "5"))
SEED = int(os.environ.get("TRIMTAB_KILL_SEED", str(time.time_ns() % 1_000_000)))

SESSIONS = 3
TTL = 1.0
"""The servers' lease TTL: a killed server's sessions are free again this long after."""
BACKLOG = 4
"""Sends a session may have waiting (acknowledged, not yet run) before the client pauses: the
sessions stay busy, and the inbox stays short enough to drain at the end within seconds."""


class NoArgs(BaseModel):
    pass


@dataclass
class Tally:
    """What the client saw, across every server it talked to."""

    acknowledged: dict[str, list[str]] = field(default_factory=dict)
    """Per session, the message ids `session.send` returned, in order."""
    started: set[str] = field(default_factory=set)
    """Message ids whose `user.message` the client saw delivered."""
    queued: int = 0
    """Sends acknowledged while an earlier one of their session still waited: inputs to a
    busy session, which the inbox holds."""
    kills: int = 0

    def backlog(self, session_id: str) -> int:
        return sum(1 for m in self.acknowledged[session_id] if m not in self.started)


@pytest.fixture(params=["sqlite", "postgres"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_dsn"))
    return str(tmp_path / "kill.db")


def start_server(store: str, logs: Path, number: int) -> ServerProcess:
    return ServerProcess(store, "--lease-ttl", str(TTL), log=logs / f"server-{number}.log")


def session_options(model: FakeModel, rng: random.Random) -> dict[str, Any]:
    async def work(params: NoArgs, invocation: Any) -> str:
        await asyncio.sleep(rng.uniform(0, 0.1))
        return "worked"

    tool = copilot_tool(
        "work", description="Do some work", params_type=NoArgs, handler=work, skip_permission=True
    )
    return {
        "provider": model.provider(),
        "model": "fake",
        "tools": [tool],
        "on_permission_request": PermissionHandler.approve_all,
    }


async def drive(
    server: ServerProcess,
    session_ids: list[str],
    tally: Tally,
    options: dict[str, Any],
    rng: random.Random,
    *,
    create: bool,
    opened: asyncio.Event,
) -> None:
    """Resume (or create) the sessions and keep them busy, until cancelled."""
    client = CopilotClient(connection=server.connection())
    try:
        await client.start()
        sessions = []
        for session_id in session_ids:
            if create:
                session = await client.create_session(session_id=session_id, **options)
            else:
                session = await client.resume_session(session_id, **options)
            session.on(lambda event: _note_started(tally, event.to_dict()))
            # Inputs whose runs began while the last client was going away count as begun.
            for event in await session.get_events():
                _note_started(tally, event.to_dict())
            sessions.append(session)
        opened.set()

        async def keep_busy(session: Any) -> None:
            acknowledged = tally.acknowledged[session.session_id]
            while True:
                if tally.backlog(session.session_id) >= BACKLOG:
                    await asyncio.sleep(0.05)
                    continue
                waiting = tally.backlog(session.session_id)
                message_id = await session.send(f"message {len(acknowledged)}")
                acknowledged.append(message_id)  # no await in between: nothing is lost here
                tally.queued += waiting > 0
                await asyncio.sleep(rng.uniform(0.01, 0.1))

        async with asyncio.TaskGroup() as group:
            for session in sessions:
                group.create_task(keep_busy(session))
    except Exception:
        pass  # the server was killed: what was acknowledged until then counts
    finally:
        await client.force_stop()


def _note_started(tally: Tally, event: dict[str, Any]) -> None:
    if event["type"] == "user.message" and "messageId" in event["data"]:
        tally.started.add(event["data"]["messageId"])


async def drain(
    server: ServerProcess, session_ids: list[str], tally: Tally, options: dict[str, Any]
) -> None:
    """Resume every session once more and wait until each has run all its inputs: a last
    `send_and_wait` returns only after the runs queued before it."""
    client = CopilotClient(connection=server.connection())
    try:
        await client.start()
        for session_id in session_ids:
            session = await client.resume_session(session_id, **options)
            reply = await session.send_and_wait("last message", timeout=60)
            assert reply is not None and isinstance(reply.data, AssistantMessageData)
            assert reply.data.content == "done"
    finally:
        await client.force_stop()


def check_log(log: list[Event]) -> tuple[list[str | None], list[str]]:
    """Assert one unbroken chain of distinct events and complete tool calls; return the
    message ids of its `user.message`s and the problems found with its tool calls."""
    assert len({e.id for e in log}) == len(log), "an event was stored twice"
    assert log[0].type == "session.start" and log[0].parent_id is None
    for before, event in zip(log, log[1:], strict=False):
        assert event.parent_id == before.id, f"the chain breaks at {event.type} {event.id}"
    starts = Counter(e.data.tool_call_id for e in log if e.type == "tool.execution_start")
    completes = Counter(e.data.tool_call_id for e in log if e.type == "tool.execution_complete")
    problems = [f"{call}: {completes[call]} completions" for call in starts if completes[call] != 1]
    problems += [f"{call}: completed, never started" for call in completes if call not in starts]
    messages = [e.data.message_id for e in log if e.type == "user.message"]
    return messages, problems


async def test_p4_kill_9_at_random_moments_loses_no_acknowledged_send(
    store_spec: str, tmp_path: Path
) -> None:
    """Before durable inputs, a send to a busy session was acknowledged from memory: over 20
    kills, 603 of 1,284 such sends were lost."""
    rng = random.Random(SEED)
    session_ids = [f"kill-{n}" for n in range(SESSIONS)]
    tally = Tally(acknowledged={session_id: [] for session_id in session_ids})
    async with FakeModel(delay=0.05, tool="work") as model:
        options = session_options(model, rng)
        for number in range(KILLS):
            server = start_server(store_spec, tmp_path, number)
            opened = asyncio.Event()
            driver = asyncio.create_task(
                drive(server, session_ids, tally, options, rng, create=number == 0, opened=opened)
            )
            if number == 0:  # the sessions exist before the first kill (atomic create: P4)
                await asyncio.wait_for(opened.wait(), 20)
            # Any moment: while the client connects and resumes, while a run goes on.
            await asyncio.sleep(rng.uniform(0.2, 2.5))
            server.process.kill()
            server.process.wait()
            tally.kills += 1
            driver.cancel()  # what it had acknowledged is counted; nothing more will be
            async with asyncio.timeout(20):
                await asyncio.gather(driver, return_exceptions=True)
        server = start_server(store_spec, tmp_path, KILLS)
        try:
            await drain(server, session_ids, tally, options)
        finally:
            assert server.stop() == 0

    store = open_store(store_spec)
    try:
        logs = {session_id: await store.read(session_id) for session_id in session_ids}
    finally:
        await store.close()
    acknowledged = lost = duplicated = 0
    problems: list[str] = []
    for session_id, log in logs.items():
        messages, call_problems = check_log(log)
        problems += [f"{session_id}: {p}" for p in call_problems]
        counts = Counter(messages)
        duplicated += sum(n - 1 for n in counts.values() if n > 1)
        for message_id in tally.acknowledged[session_id]:
            acknowledged += 1
            lost += counts[message_id] == 0
    figures = (
        f"seed {SEED}: {tally.kills} kills, {acknowledged} acknowledged sends "
        f"({tally.queued} to a busy session), {lost} lost, {duplicated} duplicated"
    )
    print(f"P4 kill loop ({'postgres' if '://' in store_spec else 'sqlite'}), {figures}")
    assert (lost, duplicated, problems) == (0, 0, []), figures
    assert acknowledged >= 2 * KILLS, f"too few sends to judge: {figures}"
