"""Fixtures of the built-in tools' tests: a runtime, a working directory, and a way to run
calls the model makes through a real session (permission flow included)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Recorder
from trimtab import Client, PermissionDecision, Tool
from trimtab.events import PermissionRequestData
from trimtab.testing import ScriptedModel, tool_call


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with Client(store="memory") as runtime:
        yield runtime


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The working directory, with a sibling `outside/` the tools must not reach."""
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET\n")
    return work


@dataclass
class Calls:
    """What a run of model calls did: each call's outcome and text, and what was asked."""

    outcomes: list[tuple[str, str]] = field(default_factory=list)
    asked: list[PermissionRequestData] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return self.outcomes[0][0]

    @property
    def text(self) -> str:
        return self.outcomes[0][1]


Decide = Callable[[PermissionRequestData], Any]


async def run_calls(
    client: Client,
    tools: list[Tool],
    *calls: tuple[str, dict[str, Any]],
    decide: Decide = lambda request: PermissionDecision(kind="approve-once"),
    answers: bool = True,
) -> Calls:
    """One run in which the model makes `calls` (one per turn), then answers "done" (unless
    the run ends before: `answers=False`)."""
    result = Calls()

    def handler(request: PermissionRequestData, invocation: Any) -> Any:
        result.asked.append(request)
        return decide(request)

    script: list[Any] = [tool_call(name, json.dumps(args)) for name, args in calls]
    model = ScriptedModel([*script, *(["done"] if answers else [])])
    session = await client.create_session(
        provider=model, tools=tools, on_permission_request=handler
    )
    recorder = Recorder(session)
    await session.send_and_wait("go", timeout=60)
    for event in recorder.of("tool.execution_complete"):
        data = event.data
        text = data.result.content if data.result is not None else data.error.message
        result.outcomes.append((data.outcome, text))
    await session.disconnect()
    return result


def processes_in_group(group: int) -> list[int]:
    """The live (not zombie) processes of a process group, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(entry))
    return found


def processes_running(text: str) -> list[int]:
    """The live processes whose command line contains `text`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in argv:  # a zombie's command line is empty
            found.append(int(entry))
    return found


async def none_running(text: str, within: float = 10.0) -> bool:
    """Whether no process whose command line contains `text` is left, waiting up to `within`
    seconds (a killed process takes a moment to die)."""
    deadline = time.monotonic() + within
    while processes_running(text):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def written_pid(pid_file: Path, within: float = 30.0) -> int:
    """The process id a command wrote to `pid_file` (another process writes it: there is
    no event to wait on)."""
    async with asyncio.timeout(within):
        while (pid := _read_pid(pid_file)) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    return pid


def _read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text else None


async def gone(group: int, within: float = 10.0) -> bool:
    """Whether no process of the group is left, waiting up to `within` seconds (a killed
    process takes a moment to die)."""
    deadline = time.monotonic() + within
    while processes_in_group(group):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True
