"""What one huge MCP tool result costs the runtime: peak memory and time of the call.

    python bench/mcp_large_result.py [--mb 50] [--items 1]

A stdio MCP server (standard library only, written to a temporary file) answers one call of
its tool `big` with `mb` MB of text in `items` text contents. The runtime's peak RSS (Linux:
`VmHWM`, reset just before the call) above its RSS before the call, and the call's wall time,
are printed. Linux only; needs `pip install '.[mcp]'`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from trimtab import Client, PermissionHandler
from trimtab.events import ToolExecutionCompleteEvent
from trimtab.testing import ScriptedModel, tool_call

SERVER = """
import json, sys

def send(message):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\\n")
    sys.stdout.flush()

for line in sys.stdin:
    message = json.loads(line)
    request_id, method = message.get("id"), message.get("method")
    if request_id is None:
        continue
    if method == "initialize":
        info = {"name": "big", "version": "1"}
        send({"id": request_id, "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": info}})
    elif method == "tools/list":
        tool = {"name": "big", "inputSchema": {"type": "object"}}
        send({"id": request_id, "result": {"tools": [tool]}})
    elif method == "tools/call":
        arguments = message["params"]["arguments"]
        size = arguments["chars"] // arguments["items"]
        content = [{"type": "text", "text": "y" * size}] * arguments["items"]
        send({"id": request_id, "result": {"content": content}})
"""


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def _reset_peak() -> int:
    """Reset `VmHWM` to the current RSS; that RSS, in KiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _kib("VmRSS")


async def measure(server: Path, chars: int, items: int) -> None:
    model = ScriptedModel([tool_call("big__big", {"chars": 10, "items": 1}), "warm"])
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=model,
            on_permission_request=PermissionHandler.approve_all,
            mcp_servers={"big": {"command": sys.executable, "args": [str(server)]}},
        )
        await session.send_and_wait("warm up")  # starts the server
        model.add(tool_call("big__big", {"chars": chars, "items": items}), "done")
        before = _reset_peak()
        started = time.perf_counter()
        await session.send_and_wait("go")
        elapsed = time.perf_counter() - started
        peak = _kib("VmHWM")
        events = await session.get_events()
    done = [e for e in events if isinstance(e, ToolExecutionCompleteEvent)][-1].data
    text = done.result.content if done.result else done.error.message if done.error else ""
    print(f"result of {chars / 1e6:g} MB in {items} item(s): {done.outcome}, {len(text)} chars")
    print(f"  peak RSS above the start of the call: {(peak - before) / 1024:.0f} MiB")
    print(f"  time of the turn: {elapsed:.2f} s")
    print(f"  the model sees: {text[:60]!r} ... {text[-80:]!r}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50)
    parser.add_argument("--items", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        server = Path(directory, "server.py")
        server.write_text(SERVER)
        asyncio.run(measure(server, int(args.mb * 1_000_000), args.items))
