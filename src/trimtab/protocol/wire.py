"""The Copilot protocol's params and results: one Pydantic model per wire shape.

Field names are snake_case in Python and camelCase on the wire (aliases). Unknown fields are
ignored, as the protocol requires: official clients send many options trimtab has no use for.
Results are serialised with `dump`, which leaves out fields that are None.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool
from pydantic.alias_generators import to_camel

from trimtab._options import SessionOptions, in_process_only, system_text
from trimtab._tools import TOOL_NAME
from trimtab.events import (
    Budget,
    Event,
    InfiniteSessions,
    OutputResult,
    SessionLimits,
    ToolDefinition,
)
from trimtab.providers import ProviderConfig
from trimtab.store import SessionRecord

__all__ = [
    "PROTOCOL_VERSION",
    "ClearContextParams",
    "ClearContextResultWire",
    "CompactParams",
    "CompactResultWire",
    "ConnectParams",
    "ConnectResult",
    "CreateParams",
    "EventsResult",
    "HandlePermissionParams",
    "HandleToolCallParams",
    "PermissionAnswer",
    "PingParams",
    "ResultType",
    "ResumeParams",
    "SendAndWaitResult",
    "Attachment",
    "BlobAttachment",
    "DirectoryAttachment",
    "FileAttachment",
    "SelectionAttachment",
    "SendParams",
    "SendResult",
    "SessionIdResult",
    "SessionListResult",
    "SessionMetadata",
    "SectionOverride",
    "SessionParams",
    "SuccessResult",
    "SystemMessage",
    "ToolResultAnswer",
    "TruncateParams",
    "TruncateResultWire",
    "UpdateOptionsParams",
    "WireTool",
    "dump",
    "event_payload",
    "metadata_of",
    "record_of",
]

PROTOCOL_VERSION = 3
"""The only Copilot SDK protocol version the official clients accept."""


def _encodable(text: str) -> str:
    # Text that reaches the event log must be valid Unicode: a lone surrogate (legal in a
    # JSON escape) would make the store refuse the event in the middle of a run.
    text.encode("utf-8")
    return text


Text = Annotated[str, AfterValidator(_encodable)]
"""A string that can be stored: valid Unicode, no lone surrogates."""

MAX_ATTACHMENTS = 20
"""Attachments one `send` may carry."""

MAX_DEPTH = 64
"""The deepest nesting of a JSON value that is stored (a tool's schema or metadata): deeper
ones are refused before anything is created, rather than failing to serialise halfway."""


def _shallow(value: Any) -> Any:
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return value


Json = Annotated[dict[str, Any], AfterValidator(_shallow)]
"""A JSON object that can be stored: at most `MAX_DEPTH` levels deep."""


class Wire(BaseModel):
    """Base of the wire models: camelCase aliases, unknown fields ignored."""

    # Schemas built on first use, as for the event models: a faster start-up.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", defer_build=True
    )


def dump(model: BaseModel) -> dict[str, Any]:
    """A result as the wire wants it: camelCase, JSON types, no null fields."""
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


# --- connection ----------------------------------------------------------------------------


class ConnectParams(Wire):
    """`connect`: the handshake; `token` is checked when the server has one."""

    token: str | None = None


class PingParams(Wire):
    """`ping`: answered with `pong: <message>`."""

    message: Any = None


# --- sessions ------------------------------------------------------------------------------


class SessionParams(Wire):
    """Params of every method that targets one session."""

    session_id: str = Field(min_length=1)


class WireTool(Wire):
    """A client-side tool as `session.create` declares it."""

    name: str = Field(pattern=f"^{TOOL_NAME}$")
    description: str = ""
    parameters: Json | None = None
    is_terminal: bool = False
    defer: Literal["auto", "never"] | None = None
    skip_permission: bool = False
    overrides_built_in_tool: bool = False
    metadata: Json | None = None

    def definition(self) -> ToolDefinition:
        """The runtime's definition of this tool: one object for every session that declares
        it alike (a client's sessions usually declare the same tools)."""
        key = self.model_dump_json(exclude_none=True)
        if (known := _DEFINITIONS.get(key)) is not None:
            return known
        fields = self.model_dump(exclude_none=True)
        parameters = fields.pop("parameters", None) or {"type": "object", "properties": {}}
        # zod-made schemas carry "$schema", which some model APIs refuse in a tool schema.
        fields["parameters"] = {k: v for k, v in parameters.items() if k != "$schema"}
        definition = _DEFINITIONS[key] = ToolDefinition.model_validate(fields)
        return definition

    @classmethod
    def of(cls, definition: ToolDefinition) -> WireTool:
        """How a client declares a tool it defined (its handler stays with the client)."""
        return cls.model_validate(definition.model_dump(include=set(cls.model_fields)))


_DEFINITIONS: weakref.WeakValueDictionary[str, ToolDefinition] = weakref.WeakValueDictionary()
"""The definitions in use, by the JSON of their declaration (frozen, so shared)."""


class SectionOverride(Wire):
    """How `customize` changes one section of the default system message."""

    action: Literal["replace", "remove", "append", "prepend", "preserve", "transform"]
    content: Text | None = None


class SystemMessage(Wire):
    """The SDKs' `systemMessage` object (how the server composes it: spec D1, D2)."""

    content: Text | None = None
    mode: Literal["append", "replace", "customize"] | None = None
    """None is `append`."""
    sections: dict[str, SectionOverride] | None = None
    """`customize` only: the overrides, by section id."""


class WireInfiniteSessions(Wire):
    """`infiniteSessions`: when to compact the context (spec D9)."""

    enabled: bool = True
    background_compaction_threshold: float | None = None
    buffer_exhaustion_threshold: float | None = None

    def options(self) -> dict[str, Any]:
        """trimtab's `infinite_sessions`: it compacts before the call that would pass the
        threshold, so the threshold at which the reference runtime starts compacting is it."""
        threshold = self.background_compaction_threshold or self.buffer_exhaustion_threshold
        return {"enabled": self.enabled} | ({"threshold": threshold} if threshold else {})

    @classmethod
    def of(cls, config: InfiniteSessions) -> WireInfiniteSessions:
        """How a client sends trimtab's `infinite_sessions` (the inverse of `options()`)."""
        return cls(enabled=config.enabled, background_compaction_threshold=config.threshold)


class DefaultAgent(Wire):
    """`defaultAgent`: what the session's (only) agent is denied."""

    excluded_tools: list[str] | None = None


_OPTION_KEYS = frozenset(
    key
    for name, field in SessionOptions.model_fields.items()
    if not field.exclude
    for key in (name, field.alias or name)
)
"""The wire's names of the `SessionOptions` that are data (code, such as tools, has none)."""


class SessionOptionsParams(SessionParams):
    """What `session.create` and `session.resume` share: the session's `SessionOptions`, each
    by its camelCase name (read by `options()`), and what only the wire has.

    The options whose wire shape is not trimtab's are fields here: the provider (the SDKs'
    BYOK quirks), tools (declared; the client runs them), the system message (the server
    composes it), hooks and permissions (whether the client answers them), infinite
    sessions and MCP servers.
    """

    # The options are kept as extra fields, for `options()` to validate as `SessionOptions`;
    # the many other fields official clients send are ignored there.
    model_config = ConfigDict(extra="allow")

    provider: dict[str, Any] | None = None
    tools: list[WireTool] | None = None
    system_message: SystemMessage | str | None = None
    creates: ClassVar[bool] = False
    """Whether the params create a session (else they resume one)."""
    client_name: str | None = None
    """Named in the User-Agent of the session's model requests (spec D9)."""
    available_tools: list[str] | None = None
    excluded_tools: list[str] | None = None
    default_agent: DefaultAgent | None = None
    infinite_sessions: WireInfiniteSessions | None = None
    request_permission: bool = False
    request_user_input: bool = False
    """The client answers `userInput.request`: the session gets `ask_user` (spec B9)."""
    working_directory: str | None = None
    """Where the session's built-in tools work (spec B8)."""
    hooks: StrictBool = False  # not "yes"
    mcp_servers: Json | None = None
    """`{name: config}` in the Copilot SDK's shapes (`cwd` for the working directory)."""
    session_limits: SessionLimits | None = None
    """Copilot's limits: `maxAiCredits` is the session budget's `cost` in AI credits (0.01
    of the price table's unit, spec U6), unless `budget` names a cost."""

    def options(self) -> SessionOptions:
        """The options for `Client.create_session` / `resume_session`, but for tools, the
        system message, hooks and the permission handler, which the server makes of the
        fields above (`SessionHub.open`).

        Raises:
            ValidationError: An option is invalid (its error names it as the wire does).
        """
        given = {k: v for k, v in (self.model_extra or {}).items() if k in _OPTION_KEYS}
        if self.provider is not None:
            provider = given["provider"] = provider_config(self.provider)
            model_id = self.provider.get("modelId")
            if given.get("model") is None and isinstance(model_id, str) and model_id:
                given["model"] = model_id  # the SDKs' fallback for the session's model
            if self.client_name:
                provider["headers"] = _with_user_agent(provider.get("headers"), self.client_name)
        if self.infinite_sessions is not None:
            given["infinite_sessions"] = self.infinite_sessions.options()
        if self.mcp_servers:
            # Imported here: most sessions name no MCP server.
            from trimtab.mcp import wire_servers

            given["mcp_servers"] = wire_servers(self.mcp_servers)
        credits = self.session_limits.max_ai_credits if self.session_limits else None
        if credits is not None:
            budget = Budget.model_validate(given.get("budget") or {})
            if budget.cost is None:
                given["budget"] = {**budget.model_dump(exclude_none=True), "cost": credits / 100}
        return SessionOptions.model_validate(given)

    def offers(self, tool_name: str) -> bool:
        """Whether the session's model is offered the tool: `availableTools` (when given)
        names it, and neither `excludedTools` nor the default agent's exclude it (spec D9)."""
        agent = self.default_agent.excluded_tools if self.default_agent is not None else None
        excluded = {*(self.excluded_tools or ()), *(agent or ())}
        allowed = self.available_tools
        return tool_name not in excluded and (allowed is None or tool_name in allowed)

    def system_message_config(self) -> SystemMessage | None:
        """The `systemMessage` in its object form (a bare string replaces the default)."""
        message = self.system_message
        if isinstance(message, str):
            return SystemMessage(content=message, mode="replace")
        return message

    @classmethod
    def of(cls, session_id: str, options: SessionOptions) -> Self:
        """The params a trimtab client sends for `options` (the inverse of `options()`): the
        options' own dump, and the wire's shapes of the others; tools go as their
        definitions, and the client answers for them and for permissions.

        Raises:
            TypeError: An option a remote session does not take, or a `Provider` object.
        """
        if local := in_process_only(options):
            raise TypeError(f"not available on a remote session (yet): {', '.join(local)}")
        wire = options.model_dump(
            mode="json",
            by_alias=True,
            exclude_none=True,
            exclude={"provider", "system_message", "infinite_sessions"},
        )
        if (provider := options.provider) is not None:
            if not isinstance(provider, Mapping):
                raise TypeError(
                    "a Provider object cannot be sent to a server: pass its config dict"
                )
            # Checked here, so that a typo fails in the caller, not as a server error.
            wire["provider"] = ProviderConfig.model_validate(provider).model_dump(
                by_alias=True, exclude_none=True
            )
        message = options.system_message
        if message is not None or cls.creates:
            # In-process sessions have no default prompt to append to: the text is all (D1).
            text = None if message is None else system_text(message)
            wire["systemMessage"] = SystemMessage(content=text or "", mode="replace")
        if options.infinite_sessions is not None:
            wire["infiniteSessions"] = WireInfiniteSessions.of(options.infinite_sessions)
        if options.tools is not None:
            wire["tools"] = [WireTool.of(tool.definition) for tool in options.tools]
        return cls.model_validate({**wire, "sessionId": session_id, "requestPermission": True})


class CreateParams(SessionOptionsParams):
    """`session.create`: the client chooses the session id."""

    creates: ClassVar[bool] = True


class ResumeParams(SessionOptionsParams):
    """`session.resume`: reopen a stored session (tools and handlers come again)."""

    continue_pending_work: bool = False
    """Re-run the tool calls a crash interrupted and continue that run (spec P3)."""


_PROVIDER_KEYS = {
    key
    for name, field in ProviderConfig.model_fields.items()
    for key in (name, field.alias or name)
}


def provider_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A BYOK `provider` object as `ProviderConfig` input.

    The Copilot SDKs send keys trimtab does not know (`transport`, ...): they are dropped.
    `azure.apiVersion`, `bearerToken` and `modelId` are mapped to their trimtab equivalents.
    """
    config = {key: value for key, value in raw.items() if key in _PROVIDER_KEYS}
    azure = raw.get("azure")
    if isinstance(azure, dict) and "apiVersion" in azure:
        config.setdefault("apiVersion", azure["apiVersion"])
    # The model named on the wire: `wireModel`, else `modelId` (the SDKs' order of fallback).
    model_id = raw.get("modelId")
    if isinstance(model_id, str) and model_id and not config.keys() & {"wireModel", "wire_model"}:
        config["wireModel"] = model_id
    token = raw.get("bearerToken")
    if isinstance(token, str):
        headers = dict(config.get("headers") or {})
        headers.setdefault("Authorization", f"Bearer {token}")
        config["headers"] = headers
    return config


def _with_user_agent(headers: dict[str, str] | None, client_name: str) -> dict[str, str]:
    """`headers` with a User-Agent naming the client, unless they have one already."""
    from trimtab import __version__  # at call time: the package imports this module

    headers = dict(headers or {})
    if not any(name.lower() == "user-agent" for name in headers):
        headers["User-Agent"] = f"{client_name} trimtab/{__version__}"
    return headers


class LineRange(Wire):
    start: int = Field(ge=1)
    end: int = Field(ge=1)


class FileAttachment(Wire):
    type: Literal["file"]
    path: str = Field(min_length=1)
    display_name: str | None = None
    line_range: LineRange | None = None


class DirectoryAttachment(Wire):
    type: Literal["directory"]
    path: str = Field(min_length=1)
    display_name: str | None = None


class Position(Wire):
    line: int = Field(ge=0)
    character: int = Field(ge=0)


class Selection(Wire):
    start: Position
    end: Position


class SelectionAttachment(Wire):
    type: Literal["selection"]
    file_path: str = Field(min_length=1)
    display_name: str | None = None
    selection: Selection | None = None
    text: Text | None = None


class BlobAttachment(Wire):
    type: Literal["blob"]
    data: str
    """Base64."""
    mime_type: str = Field(min_length=1)
    display_name: str | None = None


Attachment = Annotated[
    FileAttachment | DirectoryAttachment | SelectionAttachment | BlobAttachment,
    Field(discriminator="type"),
]
"""What a `send` may attach (spec D11); the SDKs' other kinds are refused."""


class SendParams(SessionParams):
    """`session.send` and `session.sendAndWait`."""

    prompt: Text
    mode: Literal["enqueue", "immediate"] | None = None
    """`immediate`: the run in progress takes the message at its next model call (spec X6);
    `enqueue` (the default): it waits behind the run."""
    attachments: list[Attachment] | None = Field(default=None, max_length=MAX_ATTACHMENTS)
    request_headers: dict[str, str] | None = None
    """HTTP headers for this send's model requests only (spec D9)."""
    traceparent: str | None = None
    """The sender's W3C trace context: the run's span is its child (spec OT5)."""
    tracestate: str | None = None
    output_schema: Json | None = None
    """trimtab's: the JSON Schema of the typed result the run must end with (spec OUT7)."""
    max_invalid_outputs: int | None = Field(default=None, ge=1)
    """trimtab's: invalid results the run may see (`send`'s, default 3)."""
    budget: Budget | None = None
    """trimtab's: what the run may spend (spec U3)."""

    def run_options(self) -> dict[str, Any]:
        """The `send` keywords of the typed result and the budget that were given."""
        options: dict[str, Any] = {"output_schema": self.output_schema, "budget": self.budget}
        if self.max_invalid_outputs is not None:
            options["max_invalid_outputs"] = self.max_invalid_outputs
        return options


class SendAndWaitResult(Wire):
    """What `session.sendAndWait` answers once the run is over."""

    aborted: bool
    message_id: str
    completion_event_id: str | None = None
    """The run's `session.idle`, also sent as a notification before this result."""
    response: dict[str, Any] | None = None
    """The run's last `assistant.message` event."""
    output: OutputResult | None = None
    """trimtab's: the run's typed result, when it was asked for one (spec OUT7)."""


class UpdateOptionsParams(SessionParams):
    """`session.options.update`: of the options the protocol lets a client change on an open
    session, the limits: Copilot's `sessionLimits` and trimtab's `budget` (spec U6)."""

    session_limits: SessionLimits | None = None
    budget: Budget | None = None


class SessionMetadata(Wire):
    """One entry of `session.list` (the Copilot shape, plus trimtab's `eventCount`)."""

    session_id: str
    start_time: datetime
    modified_time: datetime
    is_remote: bool
    summary: str | None = None
    event_count: int
    lease_owner: str | None = None
    """The runtime running the session, while its lease is live (spec R1)."""


# --- history -------------------------------------------------------------------------------


class ClearContextParams(SessionParams):
    """`session.history.clearContext`: the seed of the fresh window."""

    prompt: Text


class TruncateParams(SessionParams):
    """`session.history.truncate`: forget this event and everything after it."""

    event_id: str


class CompactParams(SessionParams):
    """`session.history.compact`."""

    custom_instructions: Text | None = None


# --- answers to the server's questions ---------------------------------------------------


ResultType = Literal["success", "failure", "rejected", "denied", "timeout"]
"""A tool result's `resultType` on the wire."""


class ToolResultAnswer(Wire):
    """A client tool's result object (`ToolResult` in the SDKs)."""

    text_result_for_llm: Text = ""
    result_type: ResultType | None = None
    error: Text | None = None
    tool_references: list[str] | None = None


class HandleToolCallParams(SessionParams):
    """`session.tools.handlePendingToolCall`: a result (object or text) or an error."""

    request_id: str
    result: ToolResultAnswer | Text | None = None
    error: Text | None = None


class PermissionAnswer(Wire):
    """A permission decision; `kind` is checked when it is mapped to a trimtab decision."""

    kind: str
    feedback: Text | None = None


class HandlePermissionParams(SessionParams):
    """`session.permissions.handlePendingPermissionRequest`."""

    request_id: str
    result: PermissionAnswer


# --- results ------------------------------------------------------------------------------
# What each method answers, as both ends see it: the server dumps these, `trimtab.remote`
# validates them, so the two cannot drift.


class ConnectResult(Wire):
    """`connect`."""

    ok: bool = True
    protocol_version: int = PROTOCOL_VERSION
    version: str | None = None


class SessionIdResult(Wire):
    """`session.create`, `session.resume`, `session.getLastId` (None: no session)."""

    session_id: str | None = None


class SendResult(Wire):
    """`session.send`: the id of the stored input."""

    message_id: str


class EventsResult(Wire):
    """`session.getMessages`: the persisted log, as event payloads."""

    events: list[dict[str, Any]]


class SessionListResult(Wire):
    """`session.list`."""

    sessions: list[SessionMetadata]


class SuccessResult(Wire):
    """`session.detach`, `session.delete` and the answers to the server's questions."""

    success: bool
    error: str | None = None


class ClearContextResultWire(Wire):
    """`session.history.clearContext`."""

    messages_cleared: int


class TruncateResultWire(Wire):
    """`session.history.truncate`."""

    events_removed: int


class CompactResultWire(Wire):
    """`session.history.compact`."""

    success: bool
    messages_removed: int = 0
    tokens_removed: int = 0
    summary_content: str | None = None


def record_of(metadata: SessionMetadata) -> SessionRecord:
    """A `session.list` entry as the runtime's `SessionRecord`."""
    return SessionRecord(
        session_id=metadata.session_id,
        created_at=metadata.start_time,
        updated_at=metadata.modified_time,
        event_count=metadata.event_count,
        lease_owner=metadata.lease_owner,
        summary=metadata.summary,
    )


def metadata_of(record: SessionRecord, *, is_remote: bool) -> SessionMetadata:
    """A `SessionRecord` as a `session.list` entry."""
    return SessionMetadata(
        session_id=record.session_id,
        start_time=record.created_at,
        modified_time=record.updated_at,
        is_remote=is_remote,
        summary=record.summary,
        event_count=record.event_count,
        lease_owner=record.lease_owner,
    )


def event_payload(event: Event) -> dict[str, Any]:
    """An event as it travels in `session.event` and in results."""
    return event.model_dump(by_alias=True, mode="json", exclude_none=True)
