"""Server mode: the official Copilot Python client (`github-copilot-sdk`) driving a runtime
over JSON-RPC: `trimtab serve`, or the Copilot CLI itself, against the fake model server.

    python bench/server_mode.py --target trimtab --transport stdio --base-url URL
    python bench/server_mode.py --target copilot --cli PATH --base-url URL

Reports the time until the client is connected (spawn, start-up, `connect` handshake), the
median and p90 of plain and one-tool turns in one session (BYOK provider, one tool), and the
resident memory of the server's process tree after start and as the turns go on.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from copilot import CopilotClient, RuntimeConnection
from copilot.session import PermissionHandler
from copilot.tools import define_tool
from pydantic import BaseModel


class EchoArgs(BaseModel):
    text: str


def echo(params: EchoArgs, invocation: Any) -> str:
    return common.echo(params.text)


def tree_rss(pid: int) -> int:
    """RSS of a process and all its descendants (a runtime may spawn helpers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # The command name may hold spaces: the fields after it start after ") ".
                parent = int(stat.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += common.rss_bytes(current)
        except OSError:
            continue
        todo += children.get(current, [])
    return total


def connection(args: argparse.Namespace, home: Path) -> RuntimeConnection:
    if args.target == "copilot":
        path, extra = args.cli, []
    else:
        # The interpreter itself rather than the `trimtab` console script: the same code,
        # without the shims some installations put in front of scripts.
        path, extra = sys.executable, ["-m", "trimtab.server", "--store", str(home / "t.db")]
    if args.transport == "stdio":
        return RuntimeConnection.for_stdio(path=path, args=extra)
    return RuntimeConnection.for_tcp(path=path, args=extra)


async def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", choices=["trimtab", "copilot"], required=True)
    parser.add_argument("--transport", choices=["stdio", "tcp"], default="stdio")
    parser.add_argument("--cli", help="the Copilot CLI executable (target copilot)")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--nodelay",
        action="store_true",
        help="set TCP_NODELAY on the client's socket (the official client leaves it off)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        client = CopilotClient(
            connection=connection(args, home),
            use_logged_in_user=False,
            base_directory=str(home / "copilot-home"),  # keeps ~/.copilot untouched
            log_level="error",
        )
        started = time.perf_counter()
        await client.start()
        ready_s = time.perf_counter() - started
        if args.nodelay and args.transport == "tcp":
            # The client writes a frame's header and body in two sends: with Nagle on, the
            # body waits for the server's delayed ACK of the header (~40 ms per request).
            client._process._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The spawned runtime (for TCP, `_process` is the socket and `_cli_process` the child).
        pid = (getattr(client, "_cli_process", None) or client._process).pid
        rss_start = tree_rss(pid)
        try:
            session = await client.create_session(
                on_permission_request=PermissionHandler.approve_all,
                model=common.MODEL,
                provider={"type": "openai", "base_url": args.base_url, "api_key": common.API_KEY},
                system_message={"mode": "append", "content": common.SYSTEM},
                tools=[
                    define_tool(
                        "echo",
                        description=common.TOOL_DESCRIPTION,
                        handler=echo,
                        params_type=EchoArgs,
                    )
                ],
            )
            rss_session = tree_rss(pid)
            rss_curve: list[tuple[int, int]] = []
            done = 0

            def turn(prompt: str) -> common.Turn:
                async def run() -> object:
                    nonlocal done
                    reply = await session.send_and_wait(prompt, timeout=60)
                    done += 1
                    if done in (1, 10, 50) or done % 100 == 0:
                        rss_curve.append((done, tree_rss(pid)))
                    return reply

                return run

            times = await common.interleaved(
                {"plain": turn(common.PLAIN_PROMPT), "tool": turn(common.TOOL_PROMPT)},
                args.runs,
                args.warmup,
            )
            rss_end = tree_rss(pid)
        finally:
            await client.stop()
    return {
        "target": args.target,
        "transport": args.transport + (" (client TCP_NODELAY)" if args.nodelay else ""),
        "ready_s": ready_s,
        "plain": common.summary(times["plain"]),
        "tool": common.summary(times["tool"]),
        "turns": done,
        "rss_start": rss_start,
        "rss_session": rss_session,
        "rss_end": rss_end,
        "rss_curve": rss_curve,
    }


if __name__ == "__main__":
    common.run_worker(main)
