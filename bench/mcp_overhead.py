"""What a call of an MCP tool (stdio) costs above a call of a local tool, per call.

    python bench/mcp_overhead.py [--calls 200] [--rounds 5]

One session per kind, each run makes `calls` model turns that each call one tool: `add`, a
local tool, or `bench__add`, the same function served by an MCP server (the `mcp` package's
server API) over stdio through trimtab's client. The model is scripted (no network); the
server is started before the measured runs. The figure is the median over `rounds` of
(MCP run - local run) / calls: the MCP protocol, the pipes, the SDK's client and the server's
own dispatch. Needs `pip install '.[mcp]'`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trimtab import Client, PermissionHandler, Session, define_tool
from trimtab.testing import ScriptedModel, tool_call

SERVER = """
from mcp.server import MCPServer

server = MCPServer("bench")


@server.tool()
def add(a: int, b: int) -> int:
    return a + b


server.run("stdio")
"""


class AddArgs(BaseModel):
    a: int
    b: int


def add(params: AddArgs) -> str:
    return str(params.a + params.b)


async def timed_run(session: Session, model: ScriptedModel, name: str, calls: int) -> float:
    model.add(*(tool_call(name, {"a": i, "b": 1}) for i in range(calls)), "done")
    started = time.perf_counter()
    await session.send_and_wait("go")
    return time.perf_counter() - started


async def main(calls: int, rounds: int) -> None:
    local_model, mcp_model = ScriptedModel(), ScriptedModel()
    server = Path(__file__).with_name(".mcp_bench_server.py")
    server.write_text(SERVER)
    options: dict[str, Any] = {
        "on_permission_request": PermissionHandler.approve_all,
        "max_turns": calls + 1,
    }
    try:
        async with Client(store="memory") as client:
            local = await client.create_session(
                provider=local_model, tools=[define_tool("add", handler=add)], **options
            )
            mcp = await client.create_session(
                provider=mcp_model,
                mcp_servers={"bench": {"command": sys.executable, "args": [str(server)]}},
                **options,
            )
            await timed_run(local, local_model, "add", 5)  # warm up; starts the server
            await timed_run(mcp, mcp_model, "bench__add", 5)
            overheads, local_calls = [], []
            for _ in range(rounds):
                base = await timed_run(local, local_model, "add", calls)
                remote = await timed_run(mcp, mcp_model, "bench__add", calls)
                local_calls.append(base / calls * 1000)
                overheads.append((remote - base) / calls * 1000)
    finally:
        server.unlink()
    print(f"local tool call (whole turn): {statistics.median(local_calls):.2f} ms")
    print(f"MCP stdio tool call, above a local one: {statistics.median(overheads):.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))
