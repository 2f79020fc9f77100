"""A small MCP server, written with the `mcp` package's server API: `add` and `shout`.

Run by examples/03_mcp_tools.py (and the README's MCP example) over stdio.
"""

from mcp.server import MCPServer

server = MCPServer("math")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()


if __name__ == "__main__":
    server.run("stdio")
