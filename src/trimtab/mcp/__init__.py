"""MCP servers as tool sources: `create_session(mcp_servers={name: config})`.

The configs take the Copilot SDK's shapes (`trimtab.mcp._config`); the servers' tools become
ordinary tools of the session (`trimtab.mcp._toolset`), called through the official `mcp`
SDK (the `mcp` extra: `pip install '.[mcp]'` in trimtab's checkout). Nothing here imports
that SDK until a server starts, so `import trimtab` costs the same with or without it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from trimtab.mcp._config import (
    DEFAULT_TIMEOUT,
    RemoteServerConfig,
    ServerConfig,
    StdioServerConfig,
    parse_servers,
    wire_servers,
)
from trimtab.mcp._names import MAX_NAME, assign_names
from trimtab.mcp._toolset import McpTool, McpToolset, ServerPool
from trimtab.providers._install import install_command

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_NAME",
    "McpTool",
    "McpToolset",
    "RemoteServerConfig",
    "ServerConfig",
    "ServerPool",
    "StdioServerConfig",
    "assign_names",
    "check",
    "parse_servers",
    "toolset",
    "wire_servers",
]


def check(servers: Mapping[str, Any]) -> dict[str, ServerConfig]:
    """The validated configs of `mcp_servers`.

    Raises:
        ValueError: A config is invalid (the message names the server).
        ImportError: The `mcp` package is not installed.
    """
    configs = parse_servers(servers)
    if configs and importlib.util.find_spec("mcp") is None:
        raise ImportError(f"MCP servers need the mcp package: {install_command('mcp')}", name="mcp")
    return configs


def toolset(
    servers: Mapping[str, Any], pool: ServerPool, reserved: frozenset[str]
) -> McpToolset | None:
    """A session's toolset for `mcp_servers` (see `check`), None when it names none."""
    configs = check(servers)
    return McpToolset(configs, pool, reserved, raw=servers) if configs else None
