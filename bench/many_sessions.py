"""Many sessions on one server process: `trimtab serve` under 1,000 concurrent sessions.

    python bench/many_sessions.py [--sessions 1000] [--connections 50] [--turns 3]
                                  [--store sqlite|postgresql://...] [--smoke] [--profile DIR]

One `trimtab serve` process (`python -m trimtab.server`, TCP, a fresh SQLite file by default,
or a PostgreSQL URL) with the fake model server as its provider, driven by the lean JSON-RPC
load client (`load_client.py`): `--sessions` sessions over `--connections` connections, each
session declaring the client-side tool `echo`. A *plain turn* is `session.sendAndWait` of a
prompt the model answers at once; a *one-tool turn* makes the model call `echo`, which the
client approves (`permission.requested`) and runs (`external_tool.requested`), then answer.

Phases, after every session's untimed first turn:

1. burst: every session runs `--turns` plain turns back to back, all at once (the most the
   server does: turns/s), then one one-tool turn each. The server's CPU over each burst,
   from /proc, gives CPU per turn and turns per second per server core.
2. paced: turns arrive at half the burst's rate (open loop, spread over the idle sessions)
   for `--paced-seconds`; the latency of each turn, `sendAndWait` to its answer, p50/p99.
   The fake model answers at once, so that is the latency above the model (its HTTP round
   trip included).
3. in process: a subprocess runs the same turns with `trimtab.Client` on a store of the same
   kind, one at a time, against the same fake model: its CPU per turn is what the server's
   is compared with.

RSS of the server: after the sessions are created, and at the end. `--profile DIR` records
the server with py-spy (if installed) during the bursts. The last stdout line is the JSON
result; the run fails if a turn failed or answered anything but "done".
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import common
from load_client import Connection, Session
from procs import Server, cpu_seconds, percentiles
from run import FakeModel

CONNECT_CONCURRENCY = 32
"""Connections and session creations in flight at once (the server's accept backlog is 100)."""


async def bounded(limit: asyncio.Semaphore, work: Awaitable[Any]) -> Any:
    async with limit:
        return await work


class Burst:
    """Turns of every session at once; CPU of the server over them."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.errors: list[str] = []

    async def run(self, sessions: list[Session], prompt: str, turns: int) -> dict[str, Any]:
        async def one(session: Session) -> list[float]:
            times = []
            for _ in range(turns):
                started = time.perf_counter()
                try:
                    reply = await session.turn(prompt)
                except Exception as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                times.append((time.perf_counter() - started) * 1000)
                if reply != "done":
                    self.errors.append(f"unexpected reply {reply!r}")
            return times

        cpu_before = cpu_seconds(self.pid) or 0.0
        started = time.perf_counter()
        results = await asyncio.gather(*(one(session) for session in sessions))
        wall = time.perf_counter() - started
        cpu = (cpu_seconds(self.pid) or 0.0) - cpu_before
        done = sum(len(r) for r in results)
        return {
            "turns": done,
            "wall_s": wall,
            "turns_per_s": done / wall,
            "server_cpu_s": cpu,
            "server_cores": cpu / wall,
            "server_cpu_ms_per_turn": cpu / done * 1000 if done else None,
            "turns_per_server_core_s": done / cpu if cpu else None,
            "turn_ms": percentiles([ms for r in results for ms in r]),
        }


async def paced(
    sessions: list[Session], prompt: str, rate: float, seconds: float, pid: int
) -> dict[str, Any]:
    """Turns arriving at `rate` per second (open loop) on whichever sessions are idle."""
    loop = asyncio.get_running_loop()
    idle = collections.deque(sessions)
    latencies: list[float] = []
    errors: list[str] = []
    skipped = 0
    tasks: set[asyncio.Task[None]] = set()

    async def one(session: Session) -> None:
        started = time.perf_counter()
        try:
            reply = await session.turn(prompt)
            if reply != "done":
                errors.append(f"unexpected reply {reply!r}")
            latencies.append((time.perf_counter() - started) * 1000)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            idle.append(session)

    count = max(1, int(rate * seconds))
    cpu_before = cpu_seconds(pid) or 0.0
    start = loop.time()
    for i in range(count):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if not idle:
            skipped += 1  # every session busy: the server fell behind
            continue
        task = loop.create_task(one(idle.popleft()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    wall = loop.time() - start
    cpu = (cpu_seconds(pid) or 0.0) - cpu_before
    return {
        "rate": rate,
        "turns": len(latencies),
        "skipped": skipped,
        "errors": errors[:5],
        "error_count": len(errors),
        "server_cores": cpu / wall,
        "server_cpu_ms_per_turn": cpu / len(latencies) * 1000 if latencies else None,
        "turn_ms": percentiles(latencies),
    }


class Profiler:
    """py-spy recording the server while a phase runs (when py-spy is installed)."""

    def __init__(self, directory: Path | None, pid: int) -> None:
        self.directory = directory
        self.pid = pid
        self.process: subprocess.Popen[bytes] | None = None

    @contextlib.contextmanager
    def record(self, name: str) -> Any:
        spy = shutil.which("py-spy")
        if self.directory is None or spy is None:
            yield
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        out = self.directory / f"{name}.txt"
        process = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(self.pid),
                "--rate",
                "250",
                "--format",
                "raw",
                "--output",
                str(out),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # attached before the phase starts
        try:
            yield
        finally:
            process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def in_process(base_url: str, store: str, sessions: int, turns: int) -> dict[str, Any]:
    """The same turns with `trimtab.Client`, one at a time, in a process of their own."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--in-process",
        "--base-url",
        base_url,
        "--store",
        store,
        "--sessions",
        str(sessions),
        "--turns",
        str(turns),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the in-process part failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def in_process_turns(args: argparse.Namespace) -> dict[str, Any]:
    """CPU per turn of `trimtab.Client` in process, one turn at a time (the comparison)."""
    from trimtab_inproc import session_options

    from trimtab import Client

    provider = {"type": "openai", "base_url": args.base_url, "api_key": common.API_KEY}
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "inproc.db") if args.store == "sqlite" else args.store
        async with Client(store=store) as client:
            sessions = [
                await client.create_session(**session_options(provider))
                for _ in range(args.sessions)
            ]
            for session in sessions:  # as in the server bench: one untimed turn first
                await session.send_and_wait(common.PLAIN_PROMPT)
            result = {}
            for kind, prompt, turns in (
                ("plain", common.PLAIN_PROMPT, args.turns),
                ("tool", common.TOOL_PROMPT, 1),
            ):
                cpu: list[float] = []
                wall: list[float] = []
                for session in sessions:
                    for _ in range(turns):
                        cpu_started, started = time.process_time(), time.perf_counter()
                        reply = await session.send_and_wait(prompt)
                        cpu.append((time.process_time() - cpu_started) * 1000)
                        wall.append((time.perf_counter() - started) * 1000)
                        if reply is None or reply.data.content != "done":
                            raise AssertionError(f"unexpected reply {reply!r}")
                result[kind] = {
                    "turns": len(cpu),
                    "cpu_ms_per_turn": sum(cpu) / len(cpu),
                    "turn_ms": percentiles(wall),
                }
    return result


async def drive(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    provider = {"type": "openai", "base_url": base_url, "api_key": common.API_KEY}
    token = secrets.token_hex(16)
    result: dict[str, Any] = {
        "sessions": args.sessions,
        "connections": args.connections,
        "turns_per_session": args.turns,
        "cores": os.cpu_count(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "serve.db") if args.store == "sqlite" else args.store
        result["store"] = "sqlite" if args.store == "sqlite" else "postgresql"
        server = await Server.start(store, provider, token, Path(tmp) / "server.log")
        profiler = Profiler(args.profile, server.pid)
        conns: list[Connection] = []
        try:
            limit = asyncio.Semaphore(CONNECT_CONCURRENCY)
            result["server_rss_start"] = common.rss_bytes(server.pid)
            conns = await asyncio.gather(
                *(
                    bounded(limit, Connection.open(server.port, token))
                    for _ in range(args.connections)
                )
            )
            started = time.perf_counter()
            sessions = await asyncio.gather(
                *(
                    bounded(limit, conns[i % len(conns)].create_session(tools=True))
                    for i in range(args.sessions)
                )
            )
            result["create_s"] = time.perf_counter() - started
            result["server_rss_created"] = common.rss_bytes(server.pid)
            burst = Burst(server.pid)
            await burst.run(sessions, common.PLAIN_PROMPT, 1)  # warm-up: untimed
            with profiler.record("burst-plain"):
                result["burst_plain"] = await burst.run(sessions, common.PLAIN_PROMPT, args.turns)
            with profiler.record("burst-tool"):
                result["burst_tool"] = await burst.run(sessions, common.TOOL_PROMPT, 1)
            result["server_rss_after_bursts"] = common.rss_bytes(server.pid)
            for kind, prompt in (("plain", common.PLAIN_PROMPT), ("tool", common.TOOL_PROMPT)):
                rate = result[f"burst_{kind}"]["turns_per_s"] / 2
                with profiler.record(f"paced-{kind}"):
                    result[f"paced_{kind}"] = await paced(
                        sessions, prompt, rate, args.paced_seconds, server.pid
                    )
            result["server_rss_end"] = common.rss_bytes(server.pid)
            result["errors"] = burst.errors[:5]
            result["error_count"] = len(burst.errors) + sum(
                result[f"paced_{kind}"]["error_count"] for kind in ("plain", "tool")
            )
            result["server_alive"] = server.alive
        except BaseException:
            if tail := server.log_tail():
                print(f"--- server stderr:\n{tail}", file=sys.stderr)
            raise
        finally:
            await asyncio.gather(*(conn.close() for conn in conns), return_exceptions=True)
            await server.stop()
    return result


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--turns", type=int, default=3, help="plain turns per session per burst")
    parser.add_argument("--paced-seconds", type=float, default=10.0)
    parser.add_argument("--inproc-sessions", type=int, default=200)
    parser.add_argument("--store", default="sqlite", help="sqlite, or a postgresql:// URL")
    parser.add_argument("--smoke", action="store_true", help="50 sessions, short phases")
    parser.add_argument("--profile", type=Path, help="py-spy recordings of the server here")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.sessions, args.connections, args.paced_seconds = 50, 5, 1.0
        args.inproc_sessions = 20
    return args


async def main() -> dict[str, Any]:
    args = _parse()
    if args.in_process:
        return await in_process_turns(args)
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with FakeModel() as base_url:
        result = await drive(args, base_url)
        result["in_process"] = in_process(base_url, args.store, args.inproc_sessions, args.turns)
    plain = result["burst_plain"]["server_cpu_ms_per_turn"]
    result["cpu_ratio"] = plain / result["in_process"]["plain"]["cpu_ms_per_turn"]
    return result


if __name__ == "__main__":
    outcome = asyncio.run(main())
    common.report(outcome)
    if outcome.get("error_count") or outcome.get("server_alive") is False:
        print(f"many_sessions: checks failed: {outcome.get('errors')}", file=sys.stderr)
        sys.exit(1)
