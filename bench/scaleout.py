"""Scale-out: N `trimtab serve` processes sharing one PostgreSQL database, under load.

    python bench/scaleout.py [--dsn URL] [--processes 1,2,4] [--sessions 200] [--turns 5]

For each N: a fresh database (created, then dropped), N servers (`python -m trimtab.server`,
what `trimtab serve` runs) on free 127.0.0.1 ports with the fake model server as their
provider, and one driver process (this one) running `--sessions` concurrent sessions with
trimtab's own remote client (`Client.connect("tcp://...")`), spread round-robin over the
servers. Every session first runs `--warmup-turns` untimed plain turns (the servers import
their provider, open their pools, migrate the schema); then all start together and each runs
`--turns` plain turns with `send_and_wait`, one after another.

Measured per N:
- throughput: timed turns / wall time from the start signal to the last session's end;
- turn latency: `send_and_wait` call to its answer (the run's `session.idle`), p50 / p99;
- event delivery: for each `assistant.message` a subscriber receives, its receive time minus
  the event's `timestamp` (stamped by the server when the event was made; same clock), p50 / p99;
- CPU over the timed phase, in cores: this driver, the servers, the database's backends (read
  from /proc when PostgreSQL runs on this machine), the fake model, and the whole machine.
  The driver is one asyncio process: when it uses about one core, it is the bottleneck and the
  numbers measure it as much as the servers (`driver_bound` in the result).

Correctness checks (the run fails, after printing its result, if one does not hold): every
turn answered "done", every `assistant.message` was delivered exactly once, every server is
still running at the end.

The DSN is an administrative `postgresql://` URL (default: $TRIMTAB_BENCH_PG_DSN, else
$TRIMTAB_TEST_PG_DSN) whose user may create databases. Servers, fake model and databases are
torn down even on failure (SIGTERM included; servers also get SIGTERM if this process dies).
The last stdout line is the JSON result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import common
import psycopg
from procs import Server, cpu_seconds, machine_busy, percentiles
from run import PG_DSN_VARIABLES, FakeModel

from trimtab import Client, TrimtabError
from trimtab.events import Event
from trimtab.remote import RemoteClient, RemoteSession

DB_PREFIX = "bench_scaleout_"
DRIVER_BOUND = 0.85
"""Driver CPU (cores) from which the driver counts as the bottleneck."""
CONNECT_CONCURRENCY = 32
"""Connections and session creations in flight at once (the servers' accept backlog is 100)."""


def admin_dsn(explicit: str | None) -> str | None:
    """The DSN to administer databases with: `--dsn`, else the first variable that is set."""
    if explicit:
        return explicit
    return next((os.environ[name] for name in PG_DSN_VARIABLES if os.environ.get(name)), None)


# --- the database ---------------------------------------------------------------------------


def database_url(admin: str, name: str) -> str:
    """`admin` pointing at database `name` (same host, user, options)."""
    parts = urlsplit(admin)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _drop(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def drop_stale_databases(admin: str) -> None:
    """Drop the databases of bench runs that died without cleaning up (their pid is gone)."""
    with psycopg.connect(admin, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (DB_PREFIX + "%",)
        ).fetchall()
        for (name,) in rows:
            pid = name.removeprefix(DB_PREFIX).split("_")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                print(f"  dropping stale database {name}", file=sys.stderr)
                _drop(conn, name)


@contextlib.contextmanager
def fresh_database(admin: str, name: str) -> Iterator[str]:
    """A new, empty database, dropped (with any connection left to it) on the way out."""
    with psycopg.connect(admin, autocommit=True) as conn:
        _drop(conn, name)
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            _drop(conn, name)


def server_settings(admin: str) -> dict[str, str]:
    """The PostgreSQL settings that decide what a commit costs."""
    with psycopg.connect(admin, autocommit=True) as conn:
        names = ("server_version", "fsync", "synchronous_commit", "max_connections")
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in names}  # type: ignore[index]


def backend_pids(admin: str, name: str) -> list[int]:
    """The server processes of the connections to database `name`."""
    with psycopg.connect(admin, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,))
        return [pid for (pid,) in rows.fetchall()]


# --- measuring --------------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds of this process, some other processes and the machine, between two reads."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self._groups = groups
        self._start: dict[str, dict[int, float]] = {}
        self._started = 0.0
        self._machine = (0.0, 0.0)
        self._driver = 0.0

    def _read(self) -> dict[str, dict[int, float]]:
        reads: dict[str, dict[int, float]] = {}
        for name, pids in self._groups.items():
            reads[name] = {
                pid: seconds for pid in pids() if (seconds := cpu_seconds(pid)) is not None
            }
        return reads

    def start(self) -> None:
        self._start = self._read()
        self._machine = machine_busy()
        self._driver = time.process_time()
        self._started = time.perf_counter()

    def stop(self) -> dict[str, float | None]:
        wall = time.perf_counter() - self._started
        driver = time.process_time() - self._driver
        busy, total = machine_busy()
        end = self._read()
        cores: dict[str, float | None] = {"driver": driver / wall}
        for name, pids in end.items():
            before = self._start.get(name, {})
            # A process that started during the phase counts from zero.
            used = sum(seconds - before.get(pid, 0.0) for pid, seconds in pids.items())
            cores[name] = used / wall if pids else None
        ours = sum(v or 0.0 for v in cores.values())
        machine = cores["machine"] = (busy - self._machine[0]) / wall
        # PostgreSQL's background processes, the kernel, and anything else on the machine.
        cores["rest"] = machine - ours
        cores["machine_capacity"] = (total - self._machine[1]) / wall
        return cores


class Delivered:
    """All sessions' `assistant.message` count, and an event set once all have arrived."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.all = asyncio.Event()

    def add(self) -> None:
        self.count += 1
        if self.count >= self.expected:
            self.all.set()


@dataclass
class Probe:
    """One session's turns and the `assistant.message` events its subscriber received."""

    session: RemoteSession
    delivered: Delivered
    timed: bool = False
    received: int = 0
    answered: int = 0
    late: int = 0
    """Turns whose `assistant.message` had not arrived when `send_and_wait` returned."""
    turn_ms: list[float] = field(default_factory=list)
    delivery_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.session.on("assistant.message", self._on_message)

    def _on_message(self, event: Event) -> None:
        lag = time.time() - event.timestamp.timestamp()
        self.received += 1
        self.delivered.add()
        if self.timed:
            self.delivery_ms.append(lag * 1000)

    async def turn(self, timeout: float) -> None:
        started = time.perf_counter()
        try:
            reply = await self.session.send_and_wait(common.PLAIN_PROMPT, timeout=timeout)
        except (TrimtabError, TimeoutError, ConnectionError, ValueError) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return
        elapsed = (time.perf_counter() - started) * 1000
        self.answered += 1
        if reply is None or reply.data.content != "done":
            self.errors.append(f"unexpected reply {reply!r}")
        if self.received < self.answered:
            self.late += 1
        if self.timed:
            self.turn_ms.append(elapsed)


async def _bounded(limit: asyncio.Semaphore, work: Any) -> Any:
    async with limit:
        return await work


async def drive(
    ports: list[int], token: str, args: argparse.Namespace, meter: CpuMeter
) -> dict[str, Any]:
    """Open the sessions, warm them up, then time their turns all at once."""
    limit = asyncio.Semaphore(CONNECT_CONCURRENCY)
    if args.connections == "per-session":
        urls = [f"tcp://127.0.0.1:{ports[i % len(ports)]}" for i in range(args.sessions)]
    else:
        urls = [f"tcp://127.0.0.1:{port}" for port in ports]
    clients: list[RemoteClient] = [Client.connect(url, token=token) for url in urls]
    try:
        await asyncio.gather(*(_bounded(limit, client.start()) for client in clients))
        sessions = await asyncio.gather(
            *(
                _bounded(
                    limit,
                    clients[i % len(clients)].create_session(
                        model=common.MODEL, system_message=common.SYSTEM
                    ),
                )
                for i in range(args.sessions)
            )
        )
        expected = args.sessions * (args.warmup_turns + args.turns)
        delivered = Delivered(expected)
        probes = [Probe(session, delivered) for session in sessions]
        warm = 0
        all_warm, go = asyncio.Event(), asyncio.Event()

        async def run(probe: Probe) -> None:
            nonlocal warm
            try:
                for _ in range(args.warmup_turns):
                    await probe.turn(args.timeout)
            finally:
                warm += 1
                if warm == len(probes):
                    all_warm.set()
            await go.wait()
            probe.timed = True
            for _ in range(args.turns):
                await probe.turn(args.timeout)

        tasks = [asyncio.ensure_future(run(probe)) for probe in probes]
        await all_warm.wait()
        meter.start()
        started = time.perf_counter()
        go.set()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - started
        cpu = meter.stop()
        # Events still on their way (a correct server sends them before the answer).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(delivered.all.wait(), 5)
    finally:
        results = await asyncio.gather(
            *(asyncio.wait_for(client.stop(), 30) for client in clients), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                print(f"  a client did not stop cleanly: {result!r}", file=sys.stderr)
    turn_ms = [ms for probe in probes for ms in probe.turn_ms]
    delivery_ms = [ms for probe in probes for ms in probe.delivery_ms]
    errors = [error for probe in probes for error in probe.errors]
    driver = cpu["driver"] or 0.0
    return {
        "turns": len(turn_ms),
        "wall_s": wall,
        "turns_per_s": len(turn_ms) / wall,
        "turn_ms": percentiles(turn_ms),
        "delivery_ms": percentiles(delivery_ms),
        "cpu_cores": cpu,
        # What one turn costs each party: comparable across N even when the machine is full.
        "cpu_ms_per_turn": {
            name: cores * wall / len(turn_ms) * 1000
            for name in ("driver", "servers", "postgres")
            if (cores := cpu.get(name)) is not None and turn_ms
        },
        "driver_bound": driver >= DRIVER_BOUND,
        "errors": len(errors),
        "first_errors": errors[:5],
        "events_expected": expected,
        "events_received": sum(p.received for p in probes),
        "events_after_answer": sum(p.late for p in probes),
    }


async def measure(
    processes: int, admin: str, base_url: str, fake_pid: int | None, args: argparse.Namespace
) -> dict[str, Any]:
    """One N: a fresh database, N servers, the load, and everything torn down again."""
    name = f"{DB_PREFIX}{os.getpid()}_{processes}"
    provider = {"type": "openai", "base_url": base_url, "api_key": common.API_KEY}
    token = secrets.token_hex(16)
    servers: list[Server] = []
    with tempfile.TemporaryDirectory() as logs, fresh_database(admin, name) as url:
        try:
            started = time.perf_counter()
            for i in range(processes):
                log = Path(logs) / f"server{i}.log"
                servers.append(await Server.start(url, provider, token, log))
            ready_s = time.perf_counter() - started
            groups: dict[str, Callable[[], list[int]]] = {
                "servers": lambda: [server.pid for server in servers],
                "postgres": lambda: backend_pids(admin, name),
            }
            if fake_pid is not None:
                groups["fake_model"] = lambda: [fake_pid]
            meter = CpuMeter(groups)
            try:
                result = await asyncio.wait_for(
                    drive([s.port for s in servers], token, args, meter), args.deadline
                )
            except TimeoutError:
                raise RuntimeError(f"N={processes}: no result after {args.deadline} s") from None
            result["servers_rss_mb"] = [round(common.rss_bytes(s.pid) / 2**20) for s in servers]
            result["servers_alive"] = all(server.alive for server in servers)
            result["processes"] = processes
            result["servers_ready_s"] = ready_s
            return result
        except BaseException:
            for i, server in enumerate(servers):
                if tail := server.log_tail():
                    print(f"--- server {i} (pid {server.pid}) stderr:\n{tail}", file=sys.stderr)
            raise
        finally:
            await asyncio.gather(*(server.stop() for server in servers))


def failures(row: dict[str, Any]) -> list[str]:
    """What went wrong in one N's run (empty: all checks hold)."""
    problems = []
    if row["errors"]:
        problems.append(f"{row['errors']} turns failed, e.g. {row['first_errors'][0]}")
    if row["events_received"] != row["events_expected"]:
        problems.append(
            f"{row['events_received']} assistant.message events delivered,"
            f" {row['events_expected']} expected"
        )
    if not row["servers_alive"]:
        problems.append("a server exited during the run")
    return problems


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help=f"admin postgresql:// URL (default: ${PG_DSN_VARIABLES[0]})")
    parser.add_argument("--processes", default="1,2,4", help="server counts to measure")
    parser.add_argument("--sessions", type=int, default=200, help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=5, help="timed plain turns per session")
    parser.add_argument("--warmup-turns", type=int, default=1, help="untimed turns first")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per turn")
    parser.add_argument("--deadline", type=float, default=600, help="seconds per N, in all")
    parser.add_argument(
        "--connections",
        choices=["per-session", "per-server"],
        default="per-session",
        help="one client connection per session (default), or one per server shared by "
        "its sessions",
    )
    parser.add_argument("--base-url", help="a running fake model server (default: start one)")
    return parser.parse_args()


async def main() -> dict[str, Any]:
    args = _parse()
    admin = admin_dsn(args.dsn)
    if admin is None:
        raise SystemExit(f"scaleout: no PostgreSQL DSN; set {' or '.join(PG_DSN_VARIABLES)}")
    if not admin.startswith(("postgresql://", "postgres://")):
        raise SystemExit("scaleout: the DSN must be a postgresql:// URL")
    # SIGTERM (run.py's timeout, a CI cancel) unwinds like an error: everything is torn down.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    drop_stale_databases(admin)
    settings = server_settings(admin)
    counts = [int(n) for n in args.processes.split(",")]
    rows = []
    with contextlib.ExitStack() as stack:
        fake_pid = None
        base_url = args.base_url
        if base_url is None:
            fake = FakeModel()
            base_url = stack.enter_context(fake)
            fake_pid = fake.process.pid
        for n in counts:
            print(f"  scaleout: {n} server process(es), {args.sessions} sessions", file=sys.stderr)
            row = await measure(n, admin, base_url, fake_pid, args)
            print(f"  ... {row['turns_per_s']:.0f} turns/s", file=sys.stderr, flush=True)
            rows.append(row)
    problems = {str(row["processes"]): failures(row) for row in rows}
    return {
        "sessions": args.sessions,
        "turns_per_session": args.turns,
        "warmup_turns": args.warmup_turns,
        "connections": args.connections,
        "cores": os.cpu_count(),
        "postgres": settings,
        "rows": rows,
        "problems": {n: p for n, p in problems.items() if p},
    }


if __name__ == "__main__":
    result = asyncio.run(main())
    common.report(result)
    if result["problems"]:
        print(f"scaleout: checks failed: {result['problems']}", file=sys.stderr)
        sys.exit(1)
