"""No test leaves a process running (a plugin: the root conftest loads it).

A test that starts a process ends it, also when it fails or times out; the fixtures that start
processes (`cli`, `start_server`, ...) do so in their teardown. This is the net under them:
after each test, every process of the test run's tree that the test started and that is still
running after a short grace is killed (with its process group, when it leads one) and the test
errors at teardown, naming it. Processes started by a module- or session-scoped fixture belong
to that fixture, and are checked once the whole run is over, when none may be left.

Only this process's descendants are looked at (from /proc, so Linux only): a daemon a test
starts on purpose, such as a PostgreSQL server restarted with `pg_ctl`, leaves the tree and is
never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["descendants"]

GRACE = 5.0
"""Seconds a process the test already stopped (but did not wait for) gets to exit."""


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    pgid: int
    started: int
    """Clock ticks after boot: with the pid, tells a process from a later one with its pid."""
    command: str

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.started)


def _table() -> dict[int, Process]:
    """Every live process (zombies have ended: they only wait to be reaped)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            command = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        # The command name may hold spaces and parentheses: the fields follow its last ")".
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        pid = int(entry.name)
        args = command.replace(b"\0", b" ").decode(errors="replace").strip()
        table[pid] = Process(pid, int(fields[1]), int(fields[2]), int(fields[19]), args)
    return table


def descendants(root: int | None = None) -> list[Process]:
    """The live processes under `root` (default: this one), parents before their children."""
    table = _table()
    children: dict[int, list[Process]] = {}
    for process in table.values():
        children.setdefault(process.ppid, []).append(process)
    found: list[Process] = []
    pending = [os.getpid() if root is None else root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child.pid)
    return found


def _started_since(known: set[tuple[int, int]]) -> list[Process]:
    """The processes under this one that are not in `known`, nor under one that is."""
    table = {process.pid: process for process in descendants()}
    new = []
    for process in table.values():
        ancestor: Process | None = process
        while ancestor is not None and ancestor.key not in known:
            ancestor = table.get(ancestor.ppid)
        if ancestor is None:
            new.append(process)
    return new


def _kill(processes: list[Process]) -> None:
    own_group = os.getpgid(0)
    for process in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if process.pgid == process.pid and process.pgid != own_group:
                os.killpg(process.pgid, signal.SIGKILL)
            else:
                os.kill(process.pid, signal.SIGKILL)


def _still_running(processes: list[Process], timeout: float) -> list[Process]:
    """Those of `processes` still running after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        live = {p.key for p in _table().values()}  # an orphan has left the tree, not ended
        left = [p for p in processes if p.key in live]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _describe(processes: list[Process]) -> str:
    return "; ".join(f"pid {p.pid}: {p.command[:200]}" for p in processes)


_owned_by_fixtures: set[tuple[int, int]] = set()
"""Processes started while a module- or session-scoped fixture was set up."""


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> Iterator[None]:
    if fixturedef.scope == "function":
        return (yield)
    before = {p.key for p in descendants()}
    try:
        return (yield)
    finally:
        _owned_by_fixtures.update(p.key for p in descendants() if p.key not in before)


@pytest.fixture(autouse=True)
def _no_process_left() -> Iterator[None]:
    """Set up before, and torn down after, every other function-scoped fixture of a test."""
    before = {p.key for p in descendants()}
    yield
    left = _started_since(before | _owned_by_fixtures)
    if left:
        left = _still_running(left, GRACE)
    if left:
        _kill(left)
        pytest.fail(f"the test left processes running (now killed): {_describe(left)}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    left = _still_running(descendants(), GRACE)
    if left:
        _kill(left)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"ERROR: processes left running (now killed): {_describe(left)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
