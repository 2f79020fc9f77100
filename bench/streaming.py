"""Streaming latency: how long a delta takes from the provider's bytes to the code that shows it.

    python bench/streaming.py [--turns 20] [--chunks 50] [--gap-ms 2] [--smoke]

The fake model answers `STREAM <n> <gap_ms>` with `n` text deltas `gap_ms` apart, each
stamped with the time it was written (`time.perf_counter_ns()`: CLOCK_MONOTONIC, the same
clock in every process of the machine). A streaming session sends that prompt `--turns`
times; every `assistant.message_delta` is timed where it arrives:

- in process: an `on("assistant.message_delta")` handler of a `trimtab.Client` session
  (SQLite store), against the moment the delta's bytes arrived in the process (`recv` on
  its socket returned, recorded by wrapping `socket.socket.recv` for the bench), and against
  the fake model's stamp (which adds the loopback hop and the wake-up of the event loop);
- over JSON-RPC: the `session.event` notification reaching a client of `trimtab serve`
  (TCP), against the fake model's stamp: the lean load client of the benchmarks
  (`load_client.py`), and the official Copilot Python client (`github-copilot-sdk`), when
  installed, with its handler registered by `session.on`.

The gap lets each delta travel alone, so that what is measured is latency, not a queue. The
last stdout line is the JSON result; the run fails if a delta was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import secrets
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from load_client import Connection
from procs import Server, percentiles
from run import FakeModel

from trimtab import Client

STAMP = re.compile(rb"t(\d+);")


class Arrivals:
    """When each stamp's bytes came out of `recv` in this process (the sockets to the model)."""

    def __init__(self) -> None:
        self.at: dict[int, int] = {}

    def install(self) -> None:
        arrivals = self
        recv = socket.socket.recv
        recv_into = socket.socket.recv_into

        def timed_recv(sock: socket.socket, *args: Any) -> bytes:
            data = recv(sock, *args)
            now = time.perf_counter_ns()
            for match in STAMP.finditer(data):
                arrivals.at.setdefault(int(match.group(1)), now)
            return data

        def timed_recv_into(sock: socket.socket, buffer: Any, *args: Any) -> int:
            count = recv_into(sock, buffer, *args)
            now = time.perf_counter_ns()
            for match in STAMP.finditer(bytes(memoryview(buffer)[:count])):
                arrivals.at.setdefault(int(match.group(1)), now)
            return count

        socket.socket.recv = timed_recv  # type: ignore[method-assign, assignment]
        socket.socket.recv_into = timed_recv_into  # type: ignore[method-assign, assignment]


def stamps(text: str) -> list[int]:
    return [int(m.group(1)) for m in STAMP.finditer(text.encode())]


def prompt(args: argparse.Namespace) -> str:
    return f"STREAM {args.chunks} {args.gap_ms:g}"


async def in_process(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    arrivals = Arrivals()
    arrivals.install()
    to_handler: list[float] = []
    from_stamp: list[float] = []
    lost = 0

    def on_delta(event: Any) -> None:
        nonlocal lost
        now = time.perf_counter_ns()
        for stamp in stamps(event.data.delta_content):
            from_stamp.append((now - stamp) / 1e6)
            arrived = arrivals.at.pop(stamp, None)
            if arrived is None:
                lost += 1
            else:
                to_handler.append((now - arrived) / 1e6)

    provider = {"type": "openai", "base_url": base_url, "api_key": common.API_KEY}
    with tempfile.TemporaryDirectory() as tmp:
        async with Client(store=Path(tmp) / "stream.db") as client:
            session = await client.create_session(
                provider=provider, model=common.MODEL, streaming=True
            )
            session.on("assistant.message_delta", on_delta)
            await session.send_and_wait(prompt(args))  # warm-up
            to_handler.clear()
            from_stamp.clear()
            for _ in range(args.turns):
                await session.send_and_wait(prompt(args))
    return {
        "deltas": len(from_stamp),
        "expected": args.turns * args.chunks,
        "unmatched": lost,
        "arrival_to_handler_ms": percentiles(to_handler),
        "stamp_to_handler_ms": percentiles(from_stamp),
    }


async def lean_client(args: argparse.Namespace, port: int, token: str) -> dict[str, Any]:
    conn = await Connection.open(port, token)
    try:
        session = await conn.create_session(streaming=True)
        lags: list[float] = []

        def listener(event: dict[str, Any], arrived: float) -> None:
            if event["type"] == "assistant.message_delta":
                now = time.perf_counter_ns()
                lags.extend((now - s) / 1e6 for s in stamps(event["data"]["deltaContent"]))

        session.listener = listener
        await session.turn(prompt(args))  # warm-up
        lags.clear()
        for _ in range(args.turns):
            await session.turn(prompt(args))
    finally:
        await conn.close()
    return {"deltas": len(lags), "stamp_to_event_ms": percentiles(lags)}


async def official_client(args: argparse.Namespace, port: int, token: str) -> dict[str, Any]:
    from copilot import CopilotClient, RuntimeConnection
    from copilot.session import PermissionHandler

    with tempfile.TemporaryDirectory() as tmp:
        client = CopilotClient(
            connection=RuntimeConnection.for_uri(f"127.0.0.1:{port}", connection_token=token),
            use_logged_in_user=False,
            base_directory=str(Path(tmp) / "copilot-home"),
            log_level="error",
        )
        await client.start()
        try:
            session = await client.create_session(
                on_permission_request=PermissionHandler.approve_all,
                model=common.MODEL,
                streaming=True,
            )
            lags: list[float] = []

            def handler(event: Any) -> None:
                if getattr(event.type, "value", event.type) == "assistant.message_delta":
                    now = time.perf_counter_ns()
                    content = getattr(event.data, "delta_content", "") or ""
                    lags.extend((now - s) / 1e6 for s in stamps(content))

            session.on(handler)
            await session.send_and_wait(prompt(args), timeout=60)  # warm-up
            lags.clear()
            for _ in range(args.turns):
                await session.send_and_wait(prompt(args), timeout=60)
        finally:
            await client.stop()
    return {"deltas": len(lags), "stamp_to_event_ms": percentiles(lags)}


async def over_json_rpc(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    provider = {"type": "openai", "base_url": base_url, "api_key": common.API_KEY}
    token = secrets.token_hex(16)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = await Server.start(
            str(Path(tmp) / "serve.db"), provider, token, Path(tmp) / "server.log"
        )
        try:
            result["lean"] = await lean_client(args, server.port, token)
            try:
                result["official"] = await official_client(args, server.port, token)
            except ImportError:
                result["official"] = None  # github-copilot-sdk is not installed
        except BaseException:
            print(f"--- server stderr:\n{server.log_tail()}", file=sys.stderr)
            raise
        finally:
            await server.stop()
    return result


async def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=50)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--smoke", action="store_true", help="3 turns of 20 deltas")
    args = parser.parse_args()
    if args.smoke:
        args.turns, args.chunks = 3, 20
    with FakeModel() as base_url:
        result = {"turns": args.turns, "chunks": args.chunks, "gap_ms": args.gap_ms}
        result["json_rpc"] = await over_json_rpc(args, base_url)
        result["in_process"] = await in_process(args, base_url)
    return result


if __name__ == "__main__":
    outcome = asyncio.run(main())
    common.report(outcome)
    expected = outcome["turns"] * outcome["chunks"]
    counts = [outcome["in_process"]["deltas"], outcome["json_rpc"]["lean"]["deltas"]]
    if outcome["json_rpc"]["official"] is not None:
        counts.append(outcome["json_rpc"]["official"]["deltas"])
    if any(count != expected for count in counts):
        print(f"streaming: deltas lost: {counts} of {expected}", file=sys.stderr)
        sys.exit(1)
