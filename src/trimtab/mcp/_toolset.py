"""A session's MCP tools, and the servers a runtime shares between its sessions.

`McpToolset` is the session's tool source (`trimtab._tools.ToolSource`): on the first turn
of a run it starts the session's servers (through the runtime's `ServerPool`, which shares
one server between the sessions whose configs name the same process or endpoint), lists
their tools and gives each a name (`trimtab.mcp._names`); before each later turn it looks
again at the servers whose tools changed. A server that cannot start is left out, with one
`session.warning`, and tried again on a later turn once its backoff has passed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trimtab._errors import ToolError
from trimtab._tools import Tool, ToolInvocation, ToolResult
from trimtab.events import PermissionRequestData, ToolDefinition
from trimtab.mcp._config import ServerConfig
from trimtab.mcp._names import assign_names
from trimtab.mcp._results import tool_result
from trimtab.mcp._server import Backoff, McpServer, ServerError

if TYPE_CHECKING:
    import mcp_types

__all__ = ["McpTool", "McpToolset", "ServerPool"]

log = logging.getLogger("trimtab.mcp")


class ServerPool:
    """The MCP servers of one runtime, shared by sessions and closed by the last one out."""

    def __init__(self) -> None:
        self._servers: dict[tuple[Any, ...], tuple[McpServer, set[object]]] = {}

    def acquire(self, config: ServerConfig, user: object) -> McpServer:
        """The server for `config`, shared with other users of the same process or endpoint."""
        key = config.process_key()
        if key not in self._servers:
            self._servers[key] = (McpServer(config), set())
        server, users = self._servers[key]
        users.add(user)
        return server

    async def release(self, server: McpServer, user: object) -> None:
        """`user` is done with `server`; the last user out stops it."""
        key = server.config.process_key()
        entry = self._servers.get(key)
        if entry is None or entry[0] is not server:
            return
        entry[1].discard(user)
        if not entry[1]:
            del self._servers[key]
            await server.close()

    async def close(self) -> None:
        """Stop every server (the runtime is stopping)."""
        servers, self._servers = [server for server, _ in self._servers.values()], {}
        await asyncio.gather(*(server.close() for server in servers))


class McpTool(Tool):
    """A tool of an MCP server: its calls go to the server; its permission kind is `mcp`."""

    __slots__ = ("server_name", "mcp_name", "title", "read_only")

    def __init__(
        self, definition: ToolDefinition, handler: Any, *, server_name: str, tool: mcp_types.Tool
    ) -> None:
        super().__init__(definition, handler, None)
        self.server_name = server_name
        self.mcp_name = tool.name
        annotations = tool.annotations
        self.title = tool.title or (annotations.title if annotations else None) or tool.name
        self.read_only = bool(annotations and annotations.read_only_hint)

    def permission_request(
        self, arguments: Any, tool_call_id: str, request_id: str
    ) -> PermissionRequestData:
        """An `mcp` request naming the server and the tool as the server calls it."""
        return PermissionRequestData(
            kind="mcp",
            server_name=self.server_name,
            tool_name=self.mcp_name,
            tool_title=self.title,
            read_only=self.read_only,
            tool_description=self.definition.description,
            args=arguments,
            tool_call_id=tool_call_id,
            request_id=request_id,
        )


class McpToolset:
    """The tools a session gets from its MCP servers (`mcp_servers=` of `create_session`)."""

    def __init__(
        self,
        servers: Mapping[str, ServerConfig],
        pool: ServerPool,
        reserved: frozenset[str],
        *,
        raw: Mapping[str, Any],
    ) -> None:
        self.configs = dict(servers)
        self.options = dict(raw)
        """The configs as given (what a fork of the session is given again)."""
        self._pool = pool
        self._reserved = reserved
        """Names of the session's own tools, which MCP tools must not take."""
        self._servers: dict[str, McpServer] | None = None
        self._seen: dict[str, int] = {}
        """The server's `changes` when its tools were last listed for this session."""
        self._listed: dict[str, list[mcp_types.Tool]] = {}
        self._warned: dict[str, str] = {}

    async def refresh(self) -> tuple[Mapping[str, Tool] | None, list[str]]:
        """The session's MCP tools when they changed (else None), and warnings to log."""
        if self._servers is None:
            self._servers = {
                name: self._pool.acquire(config, self)
                for name, config in self.configs.items()
                if config.tools  # `tools: []`: nothing to offer, nothing to start
            }
        stale = [
            name for name, server in self._servers.items() if self._seen.get(name) != server.changes
        ]
        if not stale:
            return None, []
        outcomes = await asyncio.gather(*(self._list(name) for name in stale))
        return self._tools(), [text for texts in outcomes for text in texts]

    async def _list(self, name: str) -> list[str]:
        """List one server's tools; warnings: the first failure in a row, each tool left out."""
        assert self._servers is not None
        server, config = self._servers[name], self.configs[name]
        try:
            listing = await server.tools(config.timeout / 1000)
        except Backoff:
            return []  # it failed a moment ago (and said so then); a later turn tries again
        except ServerError as exc:
            text = f"MCP server {name!r} {exc}: its tools are not available"
            if self._warned.get(name) == str(exc).split(";")[0]:
                return []
            self._warned[name] = str(exc).split(";")[0]
            return [text]
        self._warned.pop(name, None)
        self._seen[name] = server.changes
        self._listed[name] = [tool for tool in listing.tools if config.offers(tool.name)]
        return [
            f"MCP server {name!r}: tool {tool!r} is left out: {reason}"
            for tool, reason in listing.dropped.items()
            if config.offers(tool)
        ]

    def _tools(self) -> dict[str, Tool]:
        pairs = [(server, tool.name) for server, tools in self._listed.items() for tool in tools]
        names = assign_names(pairs, self._reserved)
        return {
            names[server, tool.name]: self._tool(names[server, tool.name], server, tool)
            for server, tools in self._listed.items()
            for tool in tools
        }

    def _tool(self, name: str, server_name: str, tool: mcp_types.Tool) -> McpTool:
        config = self.configs[server_name]
        schema = {k: v for k, v in tool.input_schema.items() if k != "$schema"}
        schema.setdefault("type", "object")
        definition = ToolDefinition(
            name=name,
            description=tool.description or tool.title or "",
            parameters=schema,
            defer="never" if config.defer == "never" else None,
            timeout=config.timeout / 1000,
            is_terminal="*" in config.terminal or tool.name in config.terminal,
        )
        mcp_name = tool.name

        async def handler(arguments: dict[str, Any], invocation: ToolInvocation) -> ToolResult:
            return await self._call(server_name, mcp_name, arguments)

        return McpTool(definition, handler, server_name=server_name, tool=tool)

    async def _call(self, server_name: str, tool: str, arguments: dict[str, Any]) -> ToolResult:
        assert self._servers is not None
        try:
            timeout = self.configs[server_name].timeout / 1000
            result = await self._servers[server_name].call(tool, arguments, timeout)
        except ServerError as exc:
            raise ToolError(f"MCP server {server_name!r} {exc}.") from None
        return tool_result(result)

    async def close(self) -> None:
        """Let go of the servers (each stops when no session uses it any more)."""
        servers, self._servers = self._servers or {}, None
        for server in servers.values():
            await self._pool.release(server, self)
