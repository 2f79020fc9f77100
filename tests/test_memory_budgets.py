"""Memory budgets of docs/performance.md, held by tests rather than by comments in the code.

tracemalloc counts the Python allocations a session keeps, which is the same on every
machine and under any load (unlike time), so these run with the suite. Each is measured in
a fresh interpreter (what earlier tests left running would be counted too) and per session,
over enough sessions that one-off allocations (caches, pools) do not count."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from trimtab import Client, PermissionHandler, Session, define_tool
from trimtab.testing import ScriptedModel, tool_call

pytestmark = pytest.mark.budget

SESSIONS = 200

IDLE_SESSION_BUDGET = 3 * 1024
"""docs/performance.md: memory per idle session (SQLite store), tracemalloc, <= 3 KB."""

CALL_IN_FLIGHT_BUDGET = 20 * 1024
"""docs/performance.md: what a run holds while its tool call waits (a client's tool, a
person's approval), on top of its idle session, <= 20 KB."""


class Args(BaseModel):
    text: str


async def _traced_per_item(count: int, step: Callable[[int], Awaitable[Any]]) -> float:
    """Bytes tracemalloc sees kept per `step(i)`, after one warm-up step."""
    await step(-1)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for index in range(count):
            await step(index)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename")) / count


async def idle_session(directory: Path) -> float:
    """Bytes kept per session left after one plain turn."""
    kept: list[Session] = []
    async with Client(store=directory / "trimtab.db") as client:
        model = ScriptedModel(then=lambda request: "done")

        async def step(index: int) -> None:
            session = await client.create_session(provider=model, system_message="SYSTEM")
            await session.send_and_wait("hello")
            kept.append(session)

        return await _traced_per_item(SESSIONS, step)


async def call_in_flight(directory: Path) -> float:
    """Bytes a run keeps, beyond its idle session, while its tool call waits."""
    release = asyncio.Event()
    started = asyncio.Semaphore(0)

    async def wait(params: Args) -> str:
        started.release()
        await release.wait()
        return params.text

    tool = define_tool("wait", params_type=Args, handler=wait)
    async with Client(store=directory / "trimtab.db") as client:
        model = ScriptedModel(
            then=lambda request: (
                "done"
                if request.messages[-1].role == "tool"
                else tool_call("wait", {"text": "x" * 100})
            )
        )
        sessions = [
            await client.create_session(
                provider=model,
                tools=[tool],
                on_permission_request=PermissionHandler.approve_all,
                system_message="SYSTEM",
            )
            for _ in range(SESSIONS + 1)
        ]

        async def step(index: int) -> None:
            await sessions[index + 1].send("go")
            await started.acquire()  # its handler runs: the run waits for it

        per_call = await _traced_per_item(SESSIONS, step)
        release.set()
        for session in sessions:
            await session.wait_idle()
        return per_call


def _measured(what: str) -> float:
    """`what` measured in a fresh interpreter, which coverage does not trace (under `--cov`
    its subprocesses are, and a tracer's data is allocated as the code runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE_", "COV_CORE_"))}
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_memory_budgets", what],
        cwd=Path(__file__).parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return float(json.loads(done.stdout.splitlines()[-1]))


def test_memory_per_idle_session_holds_its_budget() -> None:
    per_session = _measured("idle_session")
    assert per_session / IDLE_SESSION_BUDGET <= 1, f"{per_session:.0f} bytes per idle session"


def test_memory_per_call_in_flight_holds_its_budget() -> None:
    per_call = _measured("call_in_flight")
    assert per_call / CALL_IN_FLIGHT_BUDGET <= 1, f"{per_call:.0f} bytes per call in flight"


if __name__ == "__main__":
    measure = {"idle_session": idle_session, "call_in_flight": call_in_flight}[sys.argv[1]]
    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps(asyncio.run(measure(Path(folder)))))
