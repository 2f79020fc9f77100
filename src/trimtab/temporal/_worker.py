"""`Worker`: a process that runs sessions' runs for Temporal (spec EN2).

It serves the engine's task queue with the session workflow and the run activity. A run
executes here with this worker's tools (the ones a session declared that it holds) and the
session's provider, built as a resume by this worker's `Client` would build it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal

from temporalio.worker import Worker as TemporalWorker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from trimtab import Client, Tool
from trimtab.providers import Provider
from trimtab.store import Store
from trimtab.temporal._activity import Runs
from trimtab.temporal._engine import TemporalEngine
from trimtab.temporal._workflow import SessionWorkflow

__all__ = ["Worker"]

_STICKY_TIMEOUT = timedelta(seconds=1)
"""How long a workflow task waits for the worker that ran the workflow last before any
worker takes it: Temporal's default (10 s) would hold a session whose worker died that long."""


class Worker:
    """Runs sessions' runs for an engine, as an async context manager (or `run()`).

    ```python
    async with Worker(TemporalEngine("temporal-host:7233"), store=dsn, tools=[...]) as worker:
        await worker.wait()
    ```

    Args:
        engine: The engine whose task queue this worker serves (started here if needed).
        store: The sessions' store, as `Client(store=...)` takes it: the one the engine's
            clients use.
        tools: The tools this worker holds. A session's run calls those it declared (by
            name); the others it declared are answered by a process that has it open.
        provider: The provider of sessions whose log names none (as `Client(provider=...)`).
        lease_ttl: Seconds the lease of a session this worker runs lasts without renewal.
        graceful_timeout: Seconds a stopping worker lets its runs go on before it lets go
            of them, to be taken over elsewhere.
        max_runs: Attempts this worker runs at once.
    """

    def __init__(
        self,
        engine: TemporalEngine,
        *,
        store: Store | str | None = None,
        tools: Sequence[Tool] = (),
        provider: dict[str, Any] | Provider | Literal["auto"] | None = "auto",
        lease_ttl: float = 30.0,
        graceful_timeout: float = 10.0,
        max_runs: int = 100,
    ) -> None:
        self.engine = engine
        self.client = Client(store=store, provider=provider)
        self.runs = Runs(self.client, tools, lease_ttl=lease_ttl)
        self._graceful = timedelta(seconds=graceful_timeout)
        self._max_runs = max_runs
        self._worker: TemporalWorker | None = None
        self._running: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect, and begin serving the engine's task queue."""
        temporal = await self.engine.connect()
        await self.client.start()
        self._worker = TemporalWorker(
            temporal,
            task_queue=self.engine.task_queue,
            workflows=[SessionWorkflow],
            activities=[self.runs.run],
            # trimtab's modules are deterministic to import: the sandbox passes them
            # through rather than importing them again for every workflow run.
            workflow_runner=SandboxedWorkflowRunner(
                restrictions=SandboxRestrictions.default.with_passthrough_modules("trimtab")
            ),
            sticky_queue_schedule_to_start_timeout=_STICKY_TIMEOUT,
            graceful_shutdown_timeout=self._graceful,
            max_concurrent_activities=self._max_runs,
        )
        self._running = asyncio.get_running_loop().create_task(self._worker.run())

    async def wait(self) -> None:
        """Return when the worker stopped (it failed, or `stop` was called)."""
        if self._running is not None:
            await asyncio.shield(self._running)

    async def stop(self) -> None:
        """Stop taking work; runs in progress go on up to `graceful_timeout`, then are let
        go of (their sessions are taken over by another worker)."""
        if self._worker is not None and self._running is not None:
            if not self._running.done():
                await self._worker.shutdown()
            await asyncio.gather(self._running, return_exceptions=True)
        self._worker = self._running = None
        await self.client.stop()
