"""`SessionOptions`: what a host gives a session when it creates or resumes it, as one model.

One model serves every way in: `Client.create_session` / `resume_session`, the remote client
and the Copilot wire (`trimtab.protocol.wire` reads and writes it by its camelCase aliases). An
option is one field here, documented where it is declared; what the log keeps of the options
is `to_config`. Code (tools, the permission handler, hooks) is never dumped: it stays in the
process that gave it.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator
from pydantic.alias_generators import to_camel
from typing_extensions import TypedDict

from trimtab._hooks import SessionHooks
from trimtab._permissions import PermissionHandlerFn
from trimtab._tools import Tool
from trimtab._toolsearch import TOOL_SEARCH
from trimtab.events import (
    Budget,
    ContextOverflow,
    Handoff,
    InfiniteSessions,
    ModelLimits,
    Recall,
    SessionConfigData,
    ToolSearch,
)
from trimtab.providers import Provider

__all__ = [
    "IN_PROCESS",
    "SessionOptions",
    "SystemMessage",
    "in_process_only",
    "options_of",
    "storable",
    "system_text",
]


class SystemMessage(TypedDict, total=False):
    """The Copilot SDK's `system_message={"content": ...}` form."""

    content: str
    mode: Literal["append", "replace"]


IN_PROCESS = "in process only"
"""`Annotated[..., IN_PROCESS]` marks an option that has no wire form yet: a remote session
refuses it (`in_process_only`)."""


class SessionOptions(BaseModel):
    """Options of `create_session` and `resume_session`, in process or remote.

    ```python
    options = SessionOptions(model="gpt-4.1", max_turns=20)  # checked by type checkers
    session = await client.create_session(options)
    session = await client.create_session(model="gpt-4.1", max_turns=20)  # the same
    ```

    An option left out (or None) is not given: a new session gets the default, a resumed one
    keeps its own. Unknown names are an error that names them. On the Copilot wire each
    option is its camelCase alias (`maxTurns`).
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        frozen=True,
        arbitrary_types_allowed=True,
        # A provider config may hold a key: errors name the option, never the value.
        hide_input_in_errors=True,
        # Built on first use: a server is ready to accept connections without it.
        defer_build=True,
    )

    model: str | None = None
    """The model's name, as its provider knows it."""
    reasoning_effort: str | None = None
    """The effort asked of a reasoning model (`low`, `medium`, `high`...), sent to the
    providers whose API has it (spec D12)."""
    provider: dict[str, Any] | Provider | None = None
    """A config in the Copilot SDK's BYOK shape (`trimtab.providers.ProviderConfig`), or a
    `Provider` (in process only); None: the client's own."""
    system_message: str | SystemMessage | None = None
    """The whole system message (in process there is no default to append to)."""
    developer_messages: list[str] | None = None
    """Messages of the developer role after the system message."""
    tools: list[Tool] | None = Field(default=None, exclude=True)
    """The tools the model may call; names are unique. Code, so not logged: pass them again
    on resume."""
    on_permission_request: PermissionHandlerFn | None = Field(default=None, exclude=True)
    """Asked whether a tool call may run (`trimtab.PermissionHandler`)."""
    streaming: bool | None = None
    """Emit `assistant.message_delta` events while the model answers."""
    model_limits: ModelLimits | None = None
    """Override the built-in limits table: `{"context_window": ..., "max_output_tokens": ...}`."""
    infinite_sessions: InfiniteSessions | None = None
    """Automatic compaction: `{"enabled": True, "threshold": 0.8}` by default."""
    tool_search: ToolSearch | None = None
    """Deferred tools: `{"enabled": True, "defer_threshold": 30}` by default."""
    max_turns: Annotated[int, Strict()] | None = None  # not True, nor 2.0
    """Model calls one run may make before it ends in a `max_turns` error (default 100)."""
    context_overflow: ContextOverflow | None = None
    """A model call refused as longer than the model's context: `"compact"` (the default)
    compacts the window and retries once, `"drop"` drops its oldest turns and retries once,
    `"fail"` ends the run (spec X2)."""
    handoff: Handoff | None = None
    """Hand the work to a fresh window past a share of the context instead of compacting:
    `{"threshold": 0.6}` (spec X5). Off by default."""
    recall: Recall | None = None
    """The built-in `recall` tool, to search the session's cleared and compacted history:
    `{"enabled": True}` (spec X7). Off by default."""
    budget: Budget | None = None
    """What the whole session may spend, across its runs (spec U3): `{"cost": 1.0,
    "total_tokens": 200_000, ...}`; logged, and changed with `Session.set_budget`."""
    structured_output: Literal["tool", "native"] | None = None
    """How a run gives a typed result (`send(output_type=...)`): `tool` (the default), by
    calling the `final_result` tool; `native`, by its reply, in the provider's own
    structured output where it has one (Chat Completions, Responses, the embedded model;
    others use the tool: spec OUT6)."""
    hooks: Annotated[SessionHooks | None, IN_PROCESS] = Field(default=None, exclude=True)
    """The Copilot SDK's session hooks: `{"on_pre_tool_use": handler, ...}` (see `_hooks`)."""
    mcp_servers: dict[str, dict[str, Any]] | None = None
    """MCP servers whose tools the session gets, in the Copilot SDK's shapes (`trimtab.mcp`):
    started on the session's first run, shared by the sessions of this client. Not logged
    (their env and headers may hold secrets): pass them again on resume, as tools."""

    @field_validator("reasoning_effort")
    @classmethod
    def _effort(cls, effort: str | None) -> str | None:
        if effort is None:
            return None
        if not effort.strip():
            raise ValueError("reasoning_effort must be a non-empty string")
        return effort.strip()

    @field_validator("max_turns")
    @classmethod
    def _turns(cls, turns: int | None) -> int | None:
        if turns is not None and turns < 1:
            raise ValueError("max_turns must be at least 1")
        return turns

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools: list[Tool] | None) -> list[Tool] | None:
        names = collections.Counter(tool.name for tool in tools or ())
        if twice := sorted(name for name, count in names.items() if count > 1):
            # The model calls a tool by its name: which of two would run is not ours to guess.
            raise ValueError(f"tool names must be unique; given more than once: {', '.join(twice)}")
        search = next((tool for tool in tools or () if tool.name == TOOL_SEARCH), None)
        if search is not None and not search.definition.overrides_built_in_tool:
            raise ValueError(
                f"a tool named {TOOL_SEARCH!r} clashes with the built-in one: "
                "define it with overrides_built_in_tool=True to replace it"
            )
        return tools

    @field_validator("mcp_servers")
    @classmethod
    def _servers(cls, servers: dict[str, dict[str, Any]] | None) -> Any:
        if servers:
            from trimtab.mcp import parse_servers  # most sessions name no MCP server

            parse_servers(servers)  # the configs as given are what a fork gets again
        return servers

    def to_config(self, base: SessionConfigData) -> SessionConfigData:
        """The log's configuration: `base` with the options given here in place of its own
        (the provider apart: the client logs its public config).

        Raises:
            ValueError: The log could not store the result (`storable`).
        """
        update = {
            name: value for name in _KEPT_AS_GIVEN if (value := getattr(self, name)) is not None
        }
        if self.system_message is not None:
            update["system_message"] = system_text(self.system_message)
        if self.tools is not None:
            update["tools"] = [tool.definition for tool in self.tools]
        return storable(base.model_copy(update=update))


_KEPT_AS_GIVEN = (
    frozenset(SessionOptions.model_fields) & frozenset(SessionConfigData.model_fields)
) - {
    "provider",
    "system_message",
    "tools",
}
"""The options the log keeps as they are given: those `SessionConfigData` has a field of the
same name for (an option the log should keep is added there too); the others it keeps in
another form, or not at all."""


def options_of(options: SessionOptions | None, keywords: Mapping[str, Any]) -> SessionOptions:
    """What `create_session` or `resume_session` was given: `options` with `keywords` (by
    their Python names) in place of its fields.

    Raises:
        ValueError: An unknown name, or an invalid value (the error names the option).
        TypeError: `options` is not a `SessionOptions`.
    """
    if options is not None and not isinstance(options, SessionOptions):
        raise TypeError(
            f"options must be a SessionOptions, not {type(options).__name__}: "
            "pass a dict as keywords (**options)"
        )
    if options is not None and not keywords:
        return options
    given = {} if options is None else _given(options)
    try:
        return SessionOptions.model_validate({**given, **keywords}, by_alias=False, by_name=True)
    except ValidationError as exc:
        raise ValueError(f"invalid session options: {exc}") from None


def _given(options: SessionOptions) -> dict[str, Any]:
    return {
        name: value
        for name in type(options).model_fields
        if (value := getattr(options, name)) is not None
    }


def in_process_only(options: SessionOptions) -> list[str]:
    """The options given that have no wire form (`IN_PROCESS`): a remote session refuses them."""
    return [
        name
        for name, field in SessionOptions.model_fields.items()
        if IN_PROCESS in field.metadata and getattr(options, name) is not None
    ]


def system_text(message: str | SystemMessage) -> str | None:
    """The text of a system message: the Copilot form's `content` (its `mode` does not apply
    in process, where there is no default message to append to)."""
    return message if isinstance(message, str) else message.get("content")


def storable(config: SessionConfigData) -> SessionConfigData:
    """`config` if the log can store it (valid Unicode, not nested too deep), else
    `ValueError`: checked before anything is stored, so a bad option leaves nothing behind."""
    try:
        config.model_dump_json()
    except ValueError as exc:  # PydanticSerializationError is one
        raise ValueError(f"the session configuration cannot be stored: {exc}") from None
    if not _finite(config.model_dump()):
        # pydantic writes them as null: the log would not give back what was configured.
        raise ValueError(
            "the session configuration cannot be stored: it holds a number JSON cannot"
            " (NaN or infinity), in a tool's schema or metadata perhaps"
        )
    return config


def _finite(value: Any) -> bool:
    """No float in `value` (JSON data, any depth) is NaN or infinite."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return True
