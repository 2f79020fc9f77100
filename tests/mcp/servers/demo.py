"""An MCP server written with the `mcp` package's server API, for the tests.

    python demo.py stdio | http | sse

Over HTTP it listens on a free port of 127.0.0.1 and prints `port N`. When
`TRIMTAB_TEST_PIDS` names a directory, the server leaves a file named after its pid there,
so that tests can check it is gone. (It speaks the 2026-era protocol to the SDK's client;
`faulty.py` is an older-era server.)
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import sys
from pathlib import Path

import mcp_types as types
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("demo")
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(24)).decode()


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.tool(title="Echo", annotations=types.ToolAnnotations(read_only_hint=True))
def echo(text: str) -> str:
    """Repeat the text."""
    return text


@server.tool()
def fail(message: str) -> str:
    """Fail with the message."""
    raise ToolError(message)


@server.tool()
def picture() -> list[types.TextContent | types.ImageContent]:
    """A caption and a small image."""
    return [
        types.TextContent(type="text", text="a tiny picture"),
        types.ImageContent(type="image", data=PNG, mime_type="image/png"),
    ]


@server.tool()
async def sleep(seconds: float) -> str:
    """Wait, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Add a tool that answers with its own name, and say the list changed."""
    server.add_tool(lambda: name, name=name, description=f"Answer {name}")
    await ctx.notify_tools_changed()
    return f"added {name}"


async def _serve_http(transport: str) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # before the port is printed: a client connecting at once is queued, not refused
    app = server.sse_app() if transport == "sse" else server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    print(f"port {sock.getsockname()[1]}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    pids = os.environ.get("TRIMTAB_TEST_PIDS")
    if pids:
        Path(pids, str(os.getpid())).touch()
    transport = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if transport == "stdio":
        server.run("stdio")
    else:
        asyncio.run(_serve_http(transport))


if __name__ == "__main__":
    main()
