"""Helpers of the MCP tests: real servers (`servers/`), started by trimtab for real, and the
checks that none of their processes outlives what should have stopped it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.requirements import unmet
from tests.server.conftest import start_server  # noqa: F401 (a fixture of the wire tests)

SERVERS = Path(__file__).parent / "servers"
DEMO = SERVERS / "demo.py"
FAULTY = SERVERS / "faulty.py"
REPO = Path(__file__).resolve().parents[2]
EVERYTHING_VERSION = "2026.8.31"
"""The pinned `@modelcontextprotocol/server-everything` that `.ci/run` installs."""
EVERYTHING = REPO / ".cache/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"


def stdio(script: Path, *args: str, pids: Path | None = None, **config: Any) -> dict[str, Any]:
    """A stdio server config running `script` with this Python; `pids` collects its pids."""
    env = {"TRIMTAB_TEST_PIDS": str(pids)} if pids is not None else {}
    return {
        "type": "stdio",
        "command": sys.executable,
        "args": [str(script), *args],
        "env": env,
        "tools": ["*"],
        **config,
    }


@pytest.fixture
def pids(tmp_path: Path) -> Path:
    """A directory where the test servers leave a file named after each pid they start."""
    path = tmp_path / "pids"
    path.mkdir()
    return path


def started(pids: Path) -> list[int]:
    return sorted(int(p.name) for p in pids.iterdir())


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def guards(runtime_pid: int) -> list[int]:
    """The guard processes a runtime started (`_guard.py RUNTIME_PID -- ...`) still alive."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"_guard.py") for a in argv) and str(runtime_pid).encode() in argv:
            if alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def wait_gone(processes: list[int], timeout: float = 15.0) -> list[int]:
    """Wait for the processes to end; those still alive after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in processes if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def assert_no_orphans(pids: Path, runtime_pid: int | None = None) -> None:
    """Every server process recorded in `pids` has ended, and so has every guard."""
    assert started(pids), "no server process was recorded"
    assert wait_gone(started(pids)) == []
    assert wait_gone(guards(runtime_pid or os.getpid())) == []


def require_everything() -> Path:
    """The pinned npm server's entry point; skips without it (or node)."""
    problem = None
    if not _has_node():
        problem = "node is not installed"
    elif not EVERYTHING.is_file():
        problem = f"{EVERYTHING} is missing (bash .ci/run installs it)"
    if problem is not None:
        unmet(problem)
    return EVERYTHING


def _has_node() -> bool:
    try:
        return subprocess.run(["node", "--version"], capture_output=True).returncode == 0
    except OSError:
        return False


class HttpServer:
    """`demo.py http|sse` in a subprocess on a free port of 127.0.0.1."""

    def __init__(self, transport: str, pids: Path) -> None:
        env = {**os.environ, "TRIMTAB_TEST_PIDS": str(pids)}
        self.process = subprocess.Popen(
            [sys.executable, str(DEMO), transport],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        assert line.startswith("port "), line
        port = int(line.split()[1])
        path = "/sse" if transport == "sse" else "/mcp"
        self.url = f"http://127.0.0.1:{port}{path}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def http_server(pids: Path) -> Iterator[Any]:
    servers: list[HttpServer] = []

    def start(transport: str) -> HttpServer:
        server = HttpServer(transport, pids)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
