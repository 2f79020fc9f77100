"""MCP server configuration in the Copilot SDK's shapes (`mcp_servers={name: config}`).

A local server is `{"type": "stdio" | "local", "command", "args", "env", "working_directory",
"tools", "timeout"}` (the wire says `cwd`), a remote one `{"type": "http" | "sse", "url",
"headers", "tools", "timeout"}`. Keys are snake_case in Python and camelCase on the wire; both
are accepted. `timeout` is in milliseconds, as in the Copilot SDK. Two trimtab keys go beyond
the Copilot shapes: `defer` (`"auto"`, the default, or `"never"`) and `terminal` (the tools
whose success ends the run).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
)
from pydantic.alias_generators import to_camel

from trimtab.providers._headers import checked_headers

__all__ = [
    "DEFAULT_TIMEOUT",
    "RemoteServerConfig",
    "ServerConfig",
    "StdioServerConfig",
    "parse_servers",
    "wire_servers",
]

DEFAULT_TIMEOUT = 60_000
"""Milliseconds a call of an MCP tool may take when its server's config sets no `timeout`:
long enough for a search or a build step, and a bound on a server that never answers."""

_SERVER_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,64}$")


class _Common(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )

    tools: list[str] = ["*"]
    """The server's tools to offer: `["*"]` (the default) all, a list of names, `[]` none."""
    timeout: StrictInt = Field(default=DEFAULT_TIMEOUT, gt=0)  # not True
    """Milliseconds a call may take before it ends `timeout`."""
    defer: Literal["auto", "never"] = "auto"
    """`auto`: the server's tools go behind `tool_search` when the session has more tools
    than the threshold; `never`: always sent."""
    terminal: list[str] = []
    """The server's tools whose successful call ends the run (spec T1): none by default,
    `["*"]` all of them."""

    def offers(self, tool: str) -> bool:
        """Whether the config lets the session see the server's tool `tool`."""
        return "*" in self.tools or tool in self.tools


class StdioServerConfig(_Common):
    """A server the runtime starts as a child process and talks to over stdin and stdout."""

    type: Literal["stdio", "local"] = "stdio"
    command: str = Field(min_length=1)
    args: list[str] = []
    env: dict[str, str] = {}
    """Set on top of the few variables every server gets: HOME, LOGNAME, PATH, SHELL, TERM,
    USER (the runtime's other variables, credentials among them, are not passed on)."""
    working_directory: str | None = Field(
        default=None, validation_alias=AliasChoices("working_directory", "workingDirectory", "cwd")
    )

    def process_key(self) -> tuple[Any, ...]:
        """What makes two configs the same server process (shared by their sessions)."""
        env = tuple(sorted(self.env.items()))
        return ("stdio", self.command, tuple(self.args), env, self.working_directory)


class RemoteServerConfig(_Common):
    """A server reached over Streamable HTTP (`http`) or HTTP with Server-Sent Events (`sse`)."""

    type: Literal["http", "sse"]
    url: str
    headers: dict[str, str] = {}

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            valid = False
        if not valid:
            raise ValueError("expected an http:// or https:// URL")
        return value

    @field_validator("headers")
    @classmethod
    def _sendable(cls, headers: dict[str, str]) -> dict[str, str]:
        return checked_headers(headers, "headers")

    def process_key(self) -> tuple[Any, ...]:
        """What makes two configs the same connection (shared by their sessions)."""
        return (self.type, self.url, tuple(sorted(self.headers.items())))


ServerConfig: TypeAlias = StdioServerConfig | RemoteServerConfig

_FIELDS = {
    key
    for model in (StdioServerConfig, RemoteServerConfig)
    for name, field in model.model_fields.items()
    for key in (name, field.alias or name, "cwd", "workingDirectory")
}


def _one(name: str, raw: Any) -> ServerConfig:
    if not isinstance(raw, Mapping):
        raise ValueError(f"MCP server {name!r}: expected an object, got {type(raw).__name__}")
    remote = raw.get("type") in ("http", "sse")
    model: type[ServerConfig] = RemoteServerConfig if remote else StdioServerConfig
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "config"
        raise ValueError(f"MCP server {name!r}: {where}: {error['msg']}") from None


def parse_servers(servers: Mapping[str, Any]) -> dict[str, ServerConfig]:
    """The validated configs of `mcp_servers`, or `ValueError` naming the server at fault."""
    if not isinstance(servers, Mapping):
        raise ValueError("mcp_servers must map server names to configs")
    parsed: dict[str, ServerConfig] = {}
    for name, raw in servers.items():
        if not isinstance(name, str) or not _SERVER_NAME.match(name):
            raise ValueError(f"MCP server name {name!r}: expected 1 to 64 printable characters")
        parsed[name] = _one(name, raw)
    return parsed


def wire_servers(servers: Mapping[str, Any]) -> dict[str, Any]:
    """`mcpServers` as a Copilot client sent it, with the keys trimtab does not know dropped
    (the protocol ignores unknown fields; the Python API refuses them)."""
    return {
        name: {k: v for k, v in raw.items() if k in _FIELDS} if isinstance(raw, Mapping) else raw
        for name, raw in servers.items()
    }
