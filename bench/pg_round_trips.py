"""PostgreSQL per turn: database round trips, commits and NOTIFYs of a turn, in process.

    python bench/pg_round_trips.py [--turns 100] [--chunks 20] [--dsn postgresql://...]

Needs a PostgreSQL server ($TRIMTAB_BENCH_PG_DSN or $TRIMTAB_TEST_PG_DSN, or --dsn): the bench
works in a fresh database of its own, dropped at the end. A `trimtab.Client` on that database
runs turns against the fake model, one at a time: plain turns, one-tool turns, and streaming
turns of `--chunks` deltas. psycopg is wrapped to count, per turn (over as many turns again
as the timed ones: the wrapping costs CPU of its own):

- statements: every `execute` (each one round trip to the server), by kind: appends (the
  statements that write), NOTIFYs alone (`SELECT pg_notify(...)`), and the rest (reads,
  lease renewals, the pool's connection checks);
- transactions (`BEGIN` ... `COMMIT`: two more round trips each);
- commits that write: a writing statement in autocommit, or a transaction holding one. Each
  is a durable commit (a WAL flush, with `synchronous_commit` on) unless trimtab made it
  asynchronous (an append with `durable=False`, spec P5: its `sync` parameter is 'off'),
  which is counted apart; a NOTIFY alone writes no WAL.

A step is one model call: a plain turn has one, a one-tool turn two. Server CPU per turn is
this process's CPU over the turns (the model is a process of its own), with the database's
backends' CPU beside it, and the same turns' CPU on the memory store (no database at all),
measured in the same process, as the reference. The last stdout line is the JSON result.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
from collections import Counter
from typing import Any

import common
import psycopg
from procs import cpu_seconds
from run import FakeModel
from scaleout import DB_PREFIX, admin_dsn, backend_pids, fresh_database, server_settings
from trimtab_inproc import session_options

from trimtab import Client

WARMUP = 5
"""Untimed turns of each kind before the timed ones."""

WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
NOTIFY_ONLY = re.compile(r"^\s*SELECT\s+pg_notify\(", re.IGNORECASE)


class Counts:
    """psycopg's statements and transactions in this process, counted by kind."""

    def __init__(self) -> None:
        self.counter: Counter[str] = Counter()
        self._open: dict[int, bool] = {}
        """Connections inside a transaction: whether it wrote yet."""
        self._execute = psycopg.AsyncCursor.execute
        self._transaction = psycopg.AsyncConnection.transaction

    def install(self) -> None:
        """Count from now on (the wrappers cost CPU of their own: not while CPU is timed)."""
        counts = self
        execute = self._execute
        transaction = self._transaction

        async def counted_execute(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            text = query if isinstance(query, str) else str(query)
            params = args[0] if args else kwargs.get("params")
            asynchronous = isinstance(params, dict) and params.get("sync") == "off"
            counts.statement(id(cursor.connection), text, asynchronous)
            return await execute(cursor, query, *args, **kwargs)

        def counted_transaction(conn: Any, *args: Any, **kwargs: Any) -> Any:
            return counts.transaction(conn, transaction(conn, *args, **kwargs))

        psycopg.AsyncCursor.execute = counted_execute  # type: ignore[method-assign, assignment]
        psycopg.AsyncConnection.transaction = counted_transaction  # type: ignore[method-assign, assignment]

    def uninstall(self) -> None:
        psycopg.AsyncCursor.execute = self._execute  # type: ignore[method-assign]
        psycopg.AsyncConnection.transaction = self._transaction  # type: ignore[method-assign]

    def statement(self, conn: int, text: str, asynchronous: bool) -> None:
        self.counter["statements"] += 1
        if NOTIFY_ONLY.match(text):
            self.counter["notify"] += 1
        elif WRITES.search(text):
            self.counter["writes"] += 1
            if conn in self._open:
                self._open[conn] = True
            else:
                self.counter["async_commits" if asynchronous else "commits"] += 1
        else:
            self.counter["other"] += 1

    def transaction(self, conn: Any, inner: Any) -> Any:
        counts = self

        class Counted:
            async def __aenter__(self) -> Any:
                counts.counter["transactions"] += 1
                counts._open[id(conn)] = False
                return await inner.__aenter__()

            async def __aexit__(self, *exc: Any) -> Any:
                wrote = counts._open.pop(id(conn), False)
                if wrote and exc[0] is None:
                    counts.counter["commits"] += 1
                return await inner.__aexit__(*exc)

        return Counted()

    def snapshot(self) -> Counter[str]:
        return Counter(self.counter)


async def measure(args: argparse.Namespace, base_url: str, url: str, name: str) -> dict[str, Any]:
    counts = Counts()
    provider = {"type": "openai", "base_url": base_url, "api_key": common.API_KEY}
    admin = admin_dsn(args.dsn)
    assert admin is not None
    result: dict[str, Any] = {}
    async with Client(store=url) as client:
        kinds = (
            ("plain", common.PLAIN_PROMPT, False, 1),
            ("tool", common.TOOL_PROMPT, False, 2),
            ("streaming", f"STREAM {args.chunks} 0", True, 1),
        )
        for kind, prompt, streaming, steps in kinds:
            session = await client.create_session(**session_options(provider), streaming=streaming)
            # Warm-up: connections, first-use costs, and psycopg's prepared statements (it
            # prepares a statement at its fifth execution on a connection).
            for _ in range(WARMUP):
                await session.send_and_wait(prompt)
            backends = backend_pids(admin, name)
            cpu = time.process_time()
            backend_cpu = [cpu_seconds(pid) or 0.0 for pid in backends]
            for _ in range(args.turns):
                await turn(session, prompt)
            cpu = time.process_time() - cpu
            backend_cpu = [
                (cpu_seconds(p) or 0.0) - c for p, c in zip(backends, backend_cpu, strict=True)
            ]
            # The statements: counted over as many turns again, apart from the timed ones.
            counts.install()
            before = counts.snapshot()
            for _ in range(args.turns):
                await turn(session, prompt)
            counted = counts.snapshot() - before
            counts.uninstall()
            per_turn = {key: counted[key] / args.turns for key in sorted(counted)}
            per_turn["round_trips"] = per_turn.get("statements", 0) + 2 * per_turn.get(
                "transactions", 0
            )
            result[kind] = {
                "turns": args.turns,
                "steps_per_turn": steps,
                "per_turn": per_turn,
                "commits_per_step": per_turn.get("commits", 0) / steps,
                "cpu_ms_per_turn": cpu / args.turns * 1000,
                "postgres_cpu_ms_per_turn": sum(backend_cpu) / args.turns * 1000,
            }
            await session.disconnect()
    result["memory_cpu_ms_per_turn"] = await memory_cpu(args, provider)
    return result


async def turn(session: Any, prompt: str) -> None:
    reply = await session.send_and_wait(prompt)
    if reply is None or not reply.data.content:
        raise AssertionError(f"unexpected reply {reply!r}")


async def memory_cpu(args: argparse.Namespace, provider: dict[str, Any]) -> dict[str, float]:
    """trimtab's CPU per turn of each kind on the memory store: what a turn costs without a
    database, for the PostgreSQL figures to be read against."""
    cpu_ms: dict[str, float] = {}
    async with Client(store="memory") as client:
        for kind, prompt in (("plain", common.PLAIN_PROMPT), ("tool", common.TOOL_PROMPT)):
            session = await client.create_session(**session_options(provider))
            for _ in range(WARMUP):
                await session.send_and_wait(prompt)
            cpu = time.process_time()
            for _ in range(args.turns):
                await session.send_and_wait(prompt)
            cpu_ms[kind] = (time.process_time() - cpu) / args.turns * 1000
            await session.disconnect()
    return cpu_ms


async def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--dsn", help="an administrative DSN (default: the variables above)")
    parser.add_argument("--smoke", action="store_true", help="3 turns of each kind")
    args = parser.parse_args()
    if args.smoke:
        args.turns = 3
    admin = admin_dsn(args.dsn)
    if admin is None:
        raise SystemExit("no PostgreSQL server: set TRIMTAB_BENCH_PG_DSN or TRIMTAB_TEST_PG_DSN")
    name = f"{DB_PREFIX}{os.getpid()}_trips"
    with FakeModel() as base_url, fresh_database(admin, name) as url:
        result = await measure(args, base_url, url, name)
    result["chunks"] = args.chunks
    result["postgres"] = server_settings(admin)
    return result


if __name__ == "__main__":
    common.report(asyncio.run(main()))
