"""The tools of an MCP server in a session (the README's MCP example).

The model (scripted here, so this runs offline) calls `math__add`, the `add` tool of the MCP
server in examples/mcp_server.py, which trimtab starts over stdio on the session's first run
and stops when the client exits. Run it from the checkout: `python examples/03_mcp_tools.py`
(needs `pip install '.[mcp]'`).
"""

import asyncio
import sys

from trimtab import Client, PermissionHandler
from trimtab.testing import ScriptedModel, tool_call


async def main() -> None:
    model = ScriptedModel([tool_call("math__add", {"a": 17, "b": 25}), "17 + 25 = 42"])
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=model,
            on_permission_request=PermissionHandler.approve_all,
            mcp_servers={
                "math": {
                    "type": "stdio",
                    "command": sys.executable,
                    "args": ["examples/mcp_server.py"],
                    "tools": ["*"],
                    "timeout": 30_000,
                }
            },
        )
        reply = await session.send_and_wait("What is 17 + 25?")
        print("tools:", [tool.name for tool in model.requests[0].tools])
        print("reply:", reply.data.content if reply else None)


asyncio.run(main())
