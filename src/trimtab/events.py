"""Session events: the vocabulary of the event log.

Every state change of a session is one of these events. The same objects are the rows of
the log, the payloads handed to `Session.on` handlers, and (dumped with `by_alias=True`) the
`session.event` notifications of the Copilot wire protocol, so type names and fields follow
the Copilot SDK's session events: snake_case in Python, camelCase on the wire.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeAlias, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.alias_generators import to_camel

__all__ = [
    "DEFAULT_MAX_TURNS",
    "AbortData",
    "AbortEvent",
    "AssistantMessageData",
    "AssistantMessageDeltaData",
    "AssistantMessageDeltaEvent",
    "AssistantMessageEvent",
    "AssistantTurnEndEvent",
    "AssistantTurnStartEvent",
    "AssistantUsageData",
    "AssistantUsageEvent",
    "CompactionCompleteData",
    "CompactionStartData",
    "ContextClearedData",
    "Event",
    "EventAdapter",
    "EVENT_TYPES",
    "EventType",
    "ExternalToolCompletedData",
    "ExternalToolCompletedEvent",
    "ExternalToolRequestedData",
    "ExternalToolRequestedEvent",
    "InfiniteSessions",
    "Message",
    "ModelLimits",
    "PermissionCompletedData",
    "PermissionCompletedEvent",
    "PermissionRequestData",
    "PermissionRequestedData",
    "PermissionRequestedEvent",
    "PermissionResultData",
    "SessionConfigData",
    "SessionCompactionCompleteEvent",
    "SessionCompactionStartEvent",
    "SessionContextClearedEvent",
    "SessionErrorData",
    "SessionErrorEvent",
    "SessionIdleData",
    "SessionIdleEvent",
    "SessionResumeData",
    "SessionResumeEvent",
    "SessionStartData",
    "SessionStartEvent",
    "SessionTruncatedEvent",
    "SessionUsageInfoEvent",
    "SessionWarningEvent",
    "ToolCall",
    "ToolDefinition",
    "ToolExecutionCompleteData",
    "ToolExecutionCompleteEvent",
    "ToolExecutionStartData",
    "ToolExecutionStartEvent",
    "ToolOutcome",
    "ToolRequest",
    "ToolSearch",
    "ToolResultContent",
    "ToolResultError",
    "TruncatedData",
    "TurnData",
    "UsageInfoData",
    "UserMessageData",
    "UserMessageEvent",
    "WarningData",
    "event_from_json",
    "new_id",
    "now",
]

ToolOutcome: TypeAlias = Literal[
    "success", "failure", "invalid_arguments", "denied", "rejected", "timeout", "cancelled"
]
"""How a tool call ended (spec section 1)."""


def new_id() -> str:
    """A fresh UUID4 string: the Copilot clients parse every event id as a UUID."""
    return str(uuid.uuid4())


def now() -> datetime:
    """The current time, timezone-aware (UTC)."""
    return datetime.now(UTC)


class WireModel(BaseModel):
    """Base of every wire-visible model: frozen, camelCase aliases, snake_case names."""

    # defer_build: the schemas are built on first use, not at import, which keeps
    # `import trimtab` and a server's start-up fast.
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        extra="ignore",
        defer_build=True,
    )


# --- data payloads -----------------------------------------------------------------------


class ToolCall(WireModel):
    """A tool call the model asked for."""

    id: str
    name: str
    arguments: str
    """The arguments exactly as the model produced them (JSON text, possibly invalid)."""


class Message(WireModel):
    """One message of the window, in a provider-neutral shape."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    """On assistant messages: the calls it requested."""
    tool_call_id: str | None = None
    """On tool messages: the call this is the result of."""


class ToolDefinition(WireModel):
    """What the model (and the log) knows of a tool: everything but its handler."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON Schema of the arguments."""
    is_terminal: bool = False
    """A successful call ends the run after its batch (spec T1)."""
    defer: Literal["auto", "never"] | None = None
    skip_permission: bool = False
    overrides_built_in_tool: bool = False
    metadata: dict[str, Any] | None = None
    timeout: float | None = None
    """Seconds the handler may run before its call ends in `timeout`."""
    idempotent: bool = False
    """Safe to run twice: a call a crash interrupted runs again on resume or takeover,
    instead of ending `cancelled` (its `tool_call_id` is the idempotency key)."""


class ModelLimits(WireModel):
    """How much a model can take and give, in tokens."""

    context_window: int = Field(default=128_000, gt=0)
    max_output_tokens: int = Field(default=4_096, gt=0)


class InfiniteSessions(WireModel):
    """Automatic compaction before a model call that would overflow the window."""

    enabled: bool = True
    threshold: float = Field(default=0.8, gt=0, le=1)
    """Compact when the next request would use more than this share of the context window."""


class ToolSearch(WireModel):
    """Deferred tools: with more than `defer_threshold` tools, the `defer="auto"` ones are
    left out of the model's tool list until found with `tool_search`."""

    enabled: bool = True
    defer_threshold: int = Field(default=30, ge=0)


DEFAULT_MAX_TURNS = 100
"""Model calls per run before it is stopped: far more than a task needs, and a bound on a model
that calls tools forever (the seeded run after a clear counts afresh)."""


class SessionConfigData(WireModel):
    """The persisted part of a session's configuration (secrets are never logged)."""

    model: str | None = None
    provider: dict[str, Any] | None = None
    """The provider config without its API key, or `{"type": <name>}` for an in-process provider."""
    system_message: str | None = None
    developer_messages: list[str] = Field(default_factory=list)
    tools: list[ToolDefinition] = Field(default_factory=list)
    streaming: bool = False
    model_limits: ModelLimits | None = None
    """Overrides the built-in limits table for this session's model."""
    infinite_sessions: InfiniteSessions = Field(default_factory=InfiniteSessions)
    tool_search: ToolSearch = Field(default_factory=ToolSearch)
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1)
    """The most model calls one run may make before it ends in a `max_turns` error."""


class SessionStartData(WireModel):
    session_id: str
    version: int = 1
    producer: str = "trimtab"
    copilot_version: str = "0"
    start_time: datetime = Field(default_factory=now)
    selected_model: str | None = None
    config: SessionConfigData = Field(default_factory=SessionConfigData)
    forked_from: str | None = None
    """For a fork: the id of the session it was copied from."""


class SessionResumeData(WireModel):
    event_count: int
    resume_time: datetime = Field(default_factory=now)
    selected_model: str | None = None
    config: SessionConfigData | None = None
    """The configuration from this point on, when the resume changed it."""


class UserMessageData(WireModel):
    content: str
    message_id: str | None = None
    source: str | None = None
    """`"user"`, or `"context_cleared"` for the seed of a cleared window (spec C8)."""


class TurnData(WireModel):
    turn_id: str
    model: str | None = None


class ToolRequest(WireModel):
    tool_call_id: str
    name: str
    arguments: Any = None
    """The parsed arguments (a dict), or the raw text when it is not valid JSON."""
    type: Literal["function", "custom"] = "function"


class AssistantMessageData(WireModel):
    message_id: str
    content: str = ""
    tool_requests: list[ToolRequest] | None = None
    originating_message_id: str | None = None
    turn_id: str | None = None
    model: str | None = None
    reasoning_text: str | None = None


class AssistantMessageDeltaData(WireModel):
    message_id: str
    delta_content: str


class AssistantUsageData(WireModel):
    model: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    duration: float | None = None
    """Milliseconds the model call took."""
    finish_reason: str | None = None


class ToolExecutionStartData(WireModel):
    tool_call_id: str
    tool_name: str
    arguments: Any = None
    turn_id: str | None = None
    is_terminal: bool | None = None
    """The called tool was terminal (spec T1): logged with the call, so that the log alone
    tells whether its success ends the run, whatever the tool's source (None: it was not)."""


class ToolResultContent(WireModel):
    content: str


class ToolResultError(WireModel):
    message: str
    code: str | None = None


class ToolExecutionCompleteData(WireModel):
    tool_call_id: str
    success: bool
    outcome: ToolOutcome
    result: ToolResultContent | None = None
    """What the model sees of a successful call."""
    error: ToolResultError | None = None
    """What the model sees of any other outcome (`code` is the outcome)."""
    tool_name: str | None = None
    turn_id: str | None = None


class ExternalToolRequestedData(WireModel):
    """A tool call handed to a client that runs the tool (the Copilot protocol's broadcast)."""

    request_id: str
    """What the client answers with (`session.tools.handlePendingToolCall`)."""
    session_id: str
    tool_call_id: str
    tool_name: str
    arguments: Any = None
    traceparent: str | None = None
    """The W3C trace context of the call's span, for the client's handler (spec OT5)."""
    tracestate: str | None = None


class ExternalToolCompletedData(WireModel):
    """The external call was settled (answered, or cancelled by an abort): clients stop its
    handler and drop any late answer."""

    request_id: str


class PermissionRequestData(WireModel):
    kind: Literal["custom-tool", "mcp"] = "custom-tool"
    """`mcp` for a tool of an MCP server, whose request also names the server."""
    tool_name: str
    """The tool's name; for `mcp`, as its server names it (not the session-wide name)."""
    tool_description: str = ""
    args: Any = None
    tool_call_id: str | None = None
    server_name: str | None = None
    """`mcp`: the server's name in the session's `mcp_servers`."""
    tool_title: str | None = None
    """`mcp`: the tool's title (its name when it has none)."""
    read_only: bool | None = None
    """`mcp`: the server says the tool changes nothing (`readOnlyHint`)."""
    request_id: str | None = None
    """The id of the `permission.requested` event that asks it: what an answer names."""


class PermissionRequestedData(WireModel):
    request_id: str
    permission_request: PermissionRequestData


class PermissionResultData(WireModel):
    kind: str
    """`approved`, `approved-for-session`, `denied-interactively-by-user`,
    `denied-no-approval-rule-and-could-not-request-from-user`, or `cancelled` (the run was
    aborted while the request was open)."""


class PermissionCompletedData(WireModel):
    request_id: str
    result: PermissionResultData
    tool_call_id: str | None = None


class ContextClearedData(WireModel):
    messages_cleared: int
    initial_message: str


class SessionErrorData(WireModel):
    error_type: str
    message: str
    status_code: int | None = None
    retryable: bool = False
    originating_message_id: str | None = None


class CompactionStartData(WireModel):
    trigger: Literal["manual", "auto"] = "manual"


class CompactionCompleteData(WireModel):
    success: bool
    trigger: Literal["manual", "auto"] = "manual"
    messages_removed: int = 0
    tokens_removed: int = 0
    summary_content: str | None = None
    base: list[Message] = Field(default_factory=list)
    """The window's new conversation start: the summary, then the messages kept verbatim.
    Later events add to it, so the window never needs the log before this event."""
    error: str | None = None


class TruncatedData(WireModel):
    event_id: str
    """The event the window forgot, with everything after it."""
    events_removed: int
    base: list[Message] = Field(default_factory=list)
    """The conversation as it was just before `event_id`."""


class WarningData(WireModel):
    warning_type: str
    message: str


class UsageInfoData(WireModel):
    token_limit: int
    current_tokens: int
    messages_length: int


class AbortData(WireModel):
    reason: str = "user_initiated"


class SessionIdleData(WireModel):
    aborted: bool | None = None


# --- events ------------------------------------------------------------------------------


class EventBase(WireModel):
    """Fields every event carries."""

    id: str = Field(default_factory=new_id)
    timestamp: datetime = Field(default_factory=now)
    parent_id: str | None = None
    """The previous persisted event of the session (None for the first)."""
    context_epoch: int = 0
    """How many clears the session had committed when this event was appended (spec C9)."""
    ephemeral: bool = False
    """Delivered live, never persisted nor replayed (spec E2)."""


class SessionStartEvent(EventBase):
    type: Literal["session.start"] = "session.start"
    data: SessionStartData


class SessionResumeEvent(EventBase):
    type: Literal["session.resume"] = "session.resume"
    data: SessionResumeData


class UserMessageEvent(EventBase):
    type: Literal["user.message"] = "user.message"
    data: UserMessageData


class AssistantTurnStartEvent(EventBase):
    type: Literal["assistant.turn_start"] = "assistant.turn_start"
    data: TurnData


class AssistantMessageDeltaEvent(EventBase):
    type: Literal["assistant.message_delta"] = "assistant.message_delta"
    data: AssistantMessageDeltaData
    ephemeral: bool = True


class AssistantMessageEvent(EventBase):
    type: Literal["assistant.message"] = "assistant.message"
    data: AssistantMessageData


class AssistantUsageEvent(EventBase):
    type: Literal["assistant.usage"] = "assistant.usage"
    data: AssistantUsageData


class AssistantTurnEndEvent(EventBase):
    type: Literal["assistant.turn_end"] = "assistant.turn_end"
    data: TurnData


class ToolExecutionStartEvent(EventBase):
    type: Literal["tool.execution_start"] = "tool.execution_start"
    data: ToolExecutionStartData


class ToolExecutionCompleteEvent(EventBase):
    type: Literal["tool.execution_complete"] = "tool.execution_complete"
    data: ToolExecutionCompleteData


class ExternalToolRequestedEvent(EventBase):
    type: Literal["external_tool.requested"] = "external_tool.requested"
    data: ExternalToolRequestedData


class ExternalToolCompletedEvent(EventBase):
    type: Literal["external_tool.completed"] = "external_tool.completed"
    data: ExternalToolCompletedData


class PermissionRequestedEvent(EventBase):
    type: Literal["permission.requested"] = "permission.requested"
    data: PermissionRequestedData


class PermissionCompletedEvent(EventBase):
    type: Literal["permission.completed"] = "permission.completed"
    data: PermissionCompletedData


class SessionContextClearedEvent(EventBase):
    type: Literal["session.context_cleared"] = "session.context_cleared"
    data: ContextClearedData


class SessionErrorEvent(EventBase):
    type: Literal["session.error"] = "session.error"
    data: SessionErrorData


class SessionCompactionStartEvent(EventBase):
    type: Literal["session.compaction_start"] = "session.compaction_start"
    data: CompactionStartData = Field(default_factory=CompactionStartData)


class SessionCompactionCompleteEvent(EventBase):
    type: Literal["session.compaction_complete"] = "session.compaction_complete"
    data: CompactionCompleteData


class SessionTruncatedEvent(EventBase):
    type: Literal["session.truncated"] = "session.truncated"
    data: TruncatedData


class SessionWarningEvent(EventBase):
    type: Literal["session.warning"] = "session.warning"
    data: WarningData


class SessionUsageInfoEvent(EventBase):
    type: Literal["session.usage_info"] = "session.usage_info"
    data: UsageInfoData
    ephemeral: bool = True


class AbortEvent(EventBase):
    type: Literal["abort"] = "abort"
    data: AbortData = Field(default_factory=AbortData)


class SessionIdleEvent(EventBase):
    type: Literal["session.idle"] = "session.idle"
    data: SessionIdleData = Field(default_factory=SessionIdleData)
    ephemeral: bool = True


Event: TypeAlias = Annotated[
    SessionStartEvent
    | SessionResumeEvent
    | UserMessageEvent
    | AssistantTurnStartEvent
    | AssistantMessageDeltaEvent
    | AssistantMessageEvent
    | AssistantUsageEvent
    | AssistantTurnEndEvent
    | ToolExecutionStartEvent
    | ToolExecutionCompleteEvent
    | ExternalToolRequestedEvent
    | ExternalToolCompletedEvent
    | PermissionRequestedEvent
    | PermissionCompletedEvent
    | SessionContextClearedEvent
    | SessionCompactionStartEvent
    | SessionCompactionCompleteEvent
    | SessionTruncatedEvent
    | SessionWarningEvent
    | SessionUsageInfoEvent
    | SessionErrorEvent
    | AbortEvent
    | SessionIdleEvent,
    Field(discriminator="type"),
]
"""Any session event; `event.type` tells which."""

EventType: TypeAlias = Literal[
    "session.start",
    "session.resume",
    "user.message",
    "assistant.turn_start",
    "assistant.message_delta",
    "assistant.message",
    "assistant.usage",
    "assistant.turn_end",
    "tool.execution_start",
    "tool.execution_complete",
    "external_tool.requested",
    "external_tool.completed",
    "permission.requested",
    "permission.completed",
    "session.context_cleared",
    "session.compaction_start",
    "session.compaction_complete",
    "session.truncated",
    "session.warning",
    "session.usage_info",
    "session.error",
    "abort",
    "session.idle",
]
"""An event's `type`, for `Session.on(type, handler)`."""

EventAdapter: TypeAdapter[Event] = TypeAdapter(Event, config=ConfigDict(defer_build=True))
"""Validates and serialises any event (log rows, wire payloads)."""

EVENT_TYPES: frozenset[str] = frozenset(get_args(EventType))

_MODELS: dict[str, type[BaseModel]] = {
    model.model_fields["type"].default: model for model in get_args(get_args(Event)[0])
}


def event_from_json(data: str | bytes, event_type: str | None = None) -> Event:
    """The event whose JSON is `data`, as `EventAdapter.validate_json` would give it.

    With `event_type` (stores keep it beside the JSON), only that event's model validates it:
    a process that reads events never builds the union's schema, half a megabyte of it.
    """
    model = _MODELS.get(event_type) if event_type is not None else None
    if model is None:  # not told, or a type this version does not know: the union decides
        return EventAdapter.validate_json(data)
    return cast("Event", model.model_validate_json(data))
