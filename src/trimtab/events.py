"""Session events: the vocabulary of the event log.

Every state change of a session is one of these events. The same objects are the rows of
the log, the payloads handed to `Session.on` handlers, and (dumped with `by_alias=True`) the
`session.event` notifications of the Copilot wire protocol, so type names and fields follow
the Copilot SDK's session events: snake_case in Python, camelCase on the wire.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeAlias, cast, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, TypeAdapter
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass

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
    "Budget",
    "CodeChanges",
    "CommandCompletedData",
    "CommandCompletedEvent",
    "CommandQueuedData",
    "CommandQueuedEvent",
    "CompactionCompleteData",
    "CompactionStartData",
    "ContextClearedData",
    "ContextOverflow",
    "Event",
    "EventAdapter",
    "EVENT_TYPES",
    "EventType",
    "ExternalToolCompletedData",
    "ExternalToolCompletedEvent",
    "ExternalToolRequestedData",
    "ExternalToolRequestedEvent",
    "Handoff",
    "Image",
    "InfiniteSessions",
    "InfoData",
    "Message",
    "ModeChangedData",
    "ModelChangeData",
    "ModelLimits",
    "ModelMetric",
    "ModelRequests",
    "ModelTokens",
    "OutputResult",
    "OutputSpec",
    "PendingMessagesModifiedData",
    "PendingMessagesModifiedEvent",
    "PermissionCompletedData",
    "PermissionCompletedEvent",
    "PermissionRequestData",
    "PossibleUrl",
    "PermissionRequestedData",
    "PermissionRequestedEvent",
    "PermissionResultData",
    "PermissionsChangedData",
    "PlanChangedData",
    "PlanOperation",
    "PrunedBase",
    "PrunedData",
    "Recall",
    "SessionConfigData",
    "SessionCompactionCompleteEvent",
    "SessionCompactionStartEvent",
    "SessionContextClearedEvent",
    "SessionErrorData",
    "SessionErrorEvent",
    "SessionIdleData",
    "SessionIdleEvent",
    "SessionInfoEvent",
    "SessionLimits",
    "SessionLimitsChangedData",
    "SessionLimitsChangedEvent",
    "SessionModeChangedEvent",
    "SessionMode",
    "SessionModelChangeEvent",
    "SessionPermissionsChangedEvent",
    "SessionPlanChangedEvent",
    "SessionPrunedEvent",
    "SessionResumeData",
    "SessionResumeEvent",
    "SessionStartData",
    "SessionShutdownEvent",
    "SessionStartEvent",
    "SessionTitleChangedEvent",
    "SessionTruncatedEvent",
    "SessionUsageInfoEvent",
    "SessionWarningEvent",
    "SessionWorkspaceFileChangedEvent",
    "SessionWorkspacePathChangedEvent",
    "ShellCommand",
    "ToolCall",
    "ToolDefinition",
    "ToolExecutionCompleteData",
    "ToolExecutionCompleteEvent",
    "ToolExecutionStartData",
    "ToolExecutionStartEvent",
    "ToolOutcome",
    "ToolRequest",
    "ShutdownData",
    "Spending",
    "TitleChangedData",
    "ToolSearch",
    "ToolResultContent",
    "ToolResultError",
    "TruncatedData",
    "TurnData",
    "UsageInfoData",
    "UserMessageData",
    "UserMessageEvent",
    "WarningData",
    "WorkspaceFileChangedData",
    "WorkspacePathChangedData",
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
    # What `str(uuid.uuid4())` gives, without the `UUID` object made only to be printed
    # (every event needs one, a streamed delta's too).
    digits = os.urandom(16).hex()
    variant = "89ab"[int(digits[16], 16) & 3]  # RFC 4122: the top two bits are 10
    return f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{variant}{digits[17:20]}-{digits[20:]}"


def now() -> datetime:
    """The current time, timezone-aware (UTC)."""
    return datetime.now(UTC)


_WIRE_DATACLASS = ConfigDict(
    alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, defer_build=True
)
"""A wire-visible dataclass's config (`WireModel`'s, for what must be small in memory)."""


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


class Image(WireModel):
    """An image the model is shown with a user message (spec D14)."""

    mime_type: Literal["image/png", "image/jpeg", "image/gif", "image/webp"]
    """The types every provider with images takes."""
    data: str
    """Base64."""


class Message(WireModel):
    """One message of the window, in a provider-neutral shape."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str = ""
    images: tuple[Image, ...] = ()
    """On user messages: images after the text, for providers that take them (the text
    describes each, for those that do not)."""
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


class Handoff(WireModel):
    """The handoff policy (spec X5): past `threshold` of the model's context window, the
    session hands its work to a fresh window (a note by its model and the pending request)
    instead of compacting."""

    threshold: float = Field(gt=0, le=1)
    """Hand off when the next request would use more than this share of the context window."""


class Recall(WireModel):
    """The built-in `recall` tool (spec X7): the model may search the session's earlier
    windows (cleared, compacted away) by text."""

    enabled: bool = True
    max_results: int = Field(default=5, ge=1, le=50)
    """Excerpts one search returns at most, newest first."""
    max_chars: int = Field(default=600, ge=40, le=20_000)
    """Characters of one excerpt at most."""


ContextOverflow = Literal["compact", "drop", "fail"]
"""What a model call refused as longer than the model's context does (spec X2): compact the
window and retry once, drop its oldest turns and retry once, or end the run."""

PositiveCount = Annotated[int, Strict(), Field(gt=0)]
"""A count given by a caller: an int above 0 (not True, nor 2.0)."""
PositiveAmount = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Budget(WireModel):
    """What a run, or a whole session, may spend (spec U3): each limit left out (None) is no
    limit. Token and call counts are those the provider reported (`assistant.usage`); `cost`
    is in the unit of the provider's price table (`ProviderConfig.prices`); `wall_seconds`
    is the time runs took. Spending that reaches a limit ends the run before its next model
    call (`budget_exceeded`); `warn_at` of a limit first brings one `session.warning`."""

    model_config = ConfigDict(extra="forbid")  # a misspelt limit must not be no limit

    input_tokens: PositiveCount | None = None
    output_tokens: PositiveCount | None = None
    total_tokens: PositiveCount | None = None
    """Input and output tokens together."""
    cost: PositiveAmount | None = None
    model_calls: PositiveCount | None = None
    """Answered model calls, a compaction's summary included."""
    wall_seconds: PositiveAmount | None = None
    warn_at: float | None = Field(default=0.8, gt=0, lt=1)
    """The share of a limit whose crossing warns once (`session.warning` of type
    `run_budget` or `session_budget`); None: no warning."""


@dataclass(frozen=True, slots=True, config=_WIRE_DATACLASS)
class Spending:
    """What model calls spent, summed from their `assistant.usage` events (spec U2).

    A slotted dataclass, not a model: every session holds two (its total, its epoch's), and
    an idle session's memory is budgeted (docs/performance.md)."""

    model_calls: int = 0
    input_tokens: int = 0
    """Every input token, those read from the provider's cache included."""
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cost: float = 0.0
    """The calls' cost by the provider's price table; a call of a model it has no price for
    counts 0 (and in `unpriced_calls`)."""
    unpriced_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def plus(self, usage: AssistantUsageData) -> Spending:
        """This spending and one more call's."""
        cost = usage.cost
        return Spending(
            self.model_calls + 1,
            self.input_tokens + (usage.input_tokens or 0),
            self.output_tokens + (usage.output_tokens or 0),
            self.cache_read_tokens + (usage.cache_read_tokens or 0),
            self.cost + (cost or 0.0),
            self.unpriced_calls + (cost is None),
        )


class OutputSpec(WireModel):
    """The typed result a run must end with (spec OUT1): stored with the run's message, so
    that whoever continues the run (a resume, a takeover) asks for the same."""

    tool_name: str
    """The terminal tool the model gives the result with (tool mode)."""
    json_schema: dict[str, Any]
    """The result's JSON Schema: the tool's parameters, or the reply's format (native)."""
    wrapped: bool = False
    """The result is not an object: the model gives `{"result": <value>}`."""
    max_invalid: int = Field(default=3, ge=1)
    """Invalid results the run may see; the last one ends it in `invalid_output`."""
    native: bool = False
    """The provider's own structured output (its reply is the result) instead of the tool."""


class OutputResult(WireModel):
    """A run's validated result, as JSON data (spec OUT4)."""

    value: Any = None


DEFAULT_MAX_TURNS = 100
"""Model calls per run before it is stopped: far more than a task needs, and a bound on a model
that calls tools forever (the seeded run after a clear counts afresh)."""


class SessionConfigData(WireModel):
    """The persisted part of a session's configuration (secrets are never logged)."""

    model: str | None = None
    reasoning_effort: str | None = None
    """The effort asked of a reasoning model (`low`, `medium`, `high`...); None: its default."""
    provider: dict[str, Any] | None = None
    """The provider config without its API key, or `{"type": <name>}` for an in-process provider."""
    system_message: str | None = None
    developer_messages: list[str] = Field(default_factory=list)
    start_context: str | None = None
    """What the `sessionStart` hook added to the model's context (spec D13): a user message
    after the system and developer messages."""
    tools: list[ToolDefinition] = Field(default_factory=list)
    streaming: bool = False
    model_limits: ModelLimits | None = None
    """Overrides the built-in limits table for this session's model."""
    infinite_sessions: InfiniteSessions = Field(default_factory=InfiniteSessions)
    tool_search: ToolSearch = Field(default_factory=ToolSearch)
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1)
    """The most model calls one run may make before it ends in a `max_turns` error."""
    context_overflow: ContextOverflow = "compact"
    """What a call the model refuses as too long does (spec X2)."""
    handoff: Handoff | None = None
    """The handoff policy (spec X5); None: off."""
    recall: Recall | None = None
    """The built-in `recall` tool (spec X7); None: off."""
    budget: Budget | None = None
    """What the whole session may spend (spec U3); changed by `session.session_limits_changed`."""
    structured_output: Literal["tool", "native"] = "tool"
    """How runs give a typed result: the `final_result` tool, or the provider's own structured
    output where it has one (spec OUT6)."""


class SessionStartData(WireModel):
    session_id: str
    version: int = 1
    producer: str = "trimtab"
    copilot_version: str = "0"
    start_time: datetime = Field(default_factory=now)
    selected_model: str | None = None
    reasoning_effort: str | None = None
    """The session's reasoning effort (spec D12), as the Copilot clients read it here."""
    config: SessionConfigData = Field(default_factory=SessionConfigData)
    forked_from: str | None = None
    """For a fork: the id of the session it was copied from."""
    owner: str | None = None
    """Who the session belongs to: on a server with several connection tokens, the name of
    the token that created it (a fork keeps its source's); None otherwise (spec S16)."""


class SessionResumeData(WireModel):
    event_count: int
    resume_time: datetime = Field(default_factory=now)
    selected_model: str | None = None
    reasoning_effort: str | None = None
    """The session's reasoning effort from this point on (spec D12)."""
    config: SessionConfigData | None = None
    """The configuration from this point on, when the resume changed it."""
    continue_pending_work: bool | None = None
    """Whether the resume asked to run again what a crash interrupted (spec P3)."""


class UserMessageData(WireModel):
    content: str
    message_id: str | None = None
    attachments: list[dict[str, Any]] | None = None
    """What the sender attached, in the Copilot protocol's shapes, for clients to show
    (spec D14); the model reads `content` and `images`."""
    images: list[Image] | None = None
    """The images the model is shown after `content` (spec D14)."""
    source: str | None = None
    """`"user"`, `"context_cleared"` for the seed of a cleared window (spec C8),
    `"agent_stop"` for what an `agentStop` hook made the run go on with (spec D10), or
    `"hook"` for what a tool call's hooks added to the conversation (spec D13), or `"output"`
    for what the run tells a model whose result was not valid (spec OUT3): the last three
    belong to the run in progress."""
    output: OutputSpec | None = None
    """The typed result this run must end with (spec OUT1)."""
    budget: Budget | None = None
    """What this run may spend (spec U3)."""


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
    output: OutputResult | None = None
    """The run's validated result, when the reply is it (native structured output, OUT6)."""


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
    reasoning_effort: str | None = None
    """The effort the call asked of the model (spec D12); None: the model's default."""
    estimated_tokens: int | None = None
    """The request's size by the window's estimate, uncalibrated: set beside
    `input_tokens`, it calibrates the estimate for this model (spec X1)."""
    cache_read_tokens: int | None = None
    """Of the input tokens, those the provider read from its prompt cache."""
    cost: float | None = None
    """The call's cost by the provider's price table (spec U1); None when it has no price
    for the model."""


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
    output: OutputResult | None = None
    """The run's validated result, given by this call of its output tool (spec OUT4)."""


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


class ShellCommand(WireModel):
    """A command a `shell` permission request names (the Copilot protocol's shape)."""

    identifier: str
    """The command's name, as the command line spells it (`git`, `./run.sh`)."""
    read_only: bool = False
    """trimtab claims no command read-only: always false (spec B7)."""


class PossibleUrl(WireModel):
    url: str


class PermissionRequestData(WireModel):
    kind: Literal["custom-tool", "mcp", "read", "write", "shell"] = "custom-tool"
    """`mcp` for a tool of an MCP server, whose request also names the server; `read`,
    `write` and `shell` for the built-in tools (spec B7), in the Copilot CLI's shapes."""
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
    intention: str | None = None
    """`read`, `write`, `shell`: what the call is for, in a few words."""
    path: str | None = None
    """`read`: the file or directory read."""
    file_name: str | None = None
    """`write`: the file written."""
    diff: str | None = None
    """`write`: the change, as a unified diff."""
    new_file_contents: str | None = None
    """`write`: a created file's whole text."""
    full_command_text: str | None = None
    """`shell`: the command line as the model wrote it."""
    commands: list[ShellCommand] | None = None
    """`shell`: the commands the command line runs."""
    possible_paths: list[str] | None = None
    """`shell`: words of the command line that look like paths."""
    possible_urls: list[PossibleUrl] | None = None
    """`shell`: words of the command line that look like URLs."""
    has_write_file_redirection: bool | None = None
    """`shell`: the command line redirects output into a file."""
    can_offer_session_approval: bool | None = None
    """`write`, `shell`: whether a client may offer to approve the tool for the session."""


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
    logged: bool | None = None
    """Written by `Session.log` (a note at error level): it ends no run."""


def _threshold(value: Any) -> Any:
    return "threshold" if value == "auto" else value  # what older logs call it


CompactionTrigger = Annotated[Literal["manual", "threshold"], BeforeValidator(_threshold)]
"""Asked for (`manual`), or the window passed the `infinite_sessions` threshold: the Copilot
protocol's names, which its clients parse strictly (spec D9)."""


class CompactionStartData(WireModel):
    trigger: CompactionTrigger = "manual"


class CompactionCompleteData(WireModel):
    success: bool
    trigger: CompactionTrigger = "manual"
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


class PrunedBase(WireModel):
    """A window base (clear, compaction, truncation) a prune removed, as the marker keeps it."""

    event_id: str
    type: str
    timestamp: datetime
    context_epoch: int


class PrunedData(WireModel):
    """What `session.pruned` stands for: the events a prune removed (spec X8)."""

    events_pruned: int
    """How many events of the log this one replaced: those from the second (the first is
    the session's start, kept) through its own position."""
    position: int
    """Its position in the log (1-based): the last position it stands for."""
    state: dict[str, Any]
    """The session's state after those events (a `StateSnapshot`, without the window's
    conversation, which the next event sets): what replaying them gave."""
    metrics: dict[str, Any] = Field(default_factory=dict)
    """What those events spent (a `SessionMetrics`), so that `session.metrics()` stays whole."""
    bases: list[PrunedBase] = Field(default_factory=list)
    """The epochs' markers among them (clears, compactions, truncations), oldest first."""
    pruned_at: datetime = Field(default_factory=now)


class WarningData(WireModel):
    warning_type: str
    message: str
    model: str | None = None
    """A `context_length` warning's model (spec X2), with the refused request's
    `estimated_tokens` (uncalibrated) and the model's `token_limit`: what calibrates the
    estimate from a refusal (X1)."""
    estimated_tokens: int | None = None
    token_limit: int | None = None


class InfoData(WireModel):
    info_type: str
    message: str
    url: str | None = None


class ModelChangeData(WireModel):
    """The model (and reasoning effort) of the session's next model calls."""

    new_model: str
    previous_model: str | None = None
    reasoning_effort: str | None = None
    previous_reasoning_effort: str | None = None


SessionMode: TypeAlias = Literal["interactive", "plan", "autopilot"]
"""How the host says the agent works: answering, planning, or on its own (spec K7)."""


class ModeChangedData(WireModel):
    new_mode: SessionMode
    previous_mode: SessionMode


class PendingMessagesModifiedData(WireModel):
    """The queue of inputs changed (one was queued, or left it to run, or was removed)."""

    removed: list[str] | None = None
    """The message ids taken off the queue without running (a clear): their senders stop
    waiting for them. The Copilot clients read no field of this event."""


class TitleChangedData(WireModel):
    title: str
    auto: bool | None = None
    """Set from a summary (`Session.set_auto_name`), not chosen by the user: a later summary
    may replace it, never a name the user chose (spec K12)."""


PlanOperation: TypeAlias = Literal["create", "update", "delete"]


class PlanChangedData(WireModel):
    """The session's plan was written or deleted (spec K16)."""

    operation: PlanOperation
    content: str | None = None
    """The plan's text after the change (None once deleted): the log is the plan's store."""


class WorkspaceFileChangedData(WireModel):
    """A file of the session's workspace was written (spec K16)."""

    operation: Literal["create", "update"]
    path: str
    """Slash-separated, relative to the workspace's files."""
    content: str
    """The file's text after the change: the log is the workspace's store."""


class WorkspacePathChangedData(WireModel):
    """A directory of the workspace was made, or a path removed or renamed (spec K16)."""

    operation: Literal["create_directory", "remove", "rename"]
    path: str
    destination: str | None = None
    """`rename`: the new path."""


class PermissionsChangedData(WireModel):
    """The open session's permission mode changed (spec K6)."""

    mode: Literal["manual", "allow-all"]
    previous_mode: Literal["manual", "allow-all"]


class CommandQueuedData(WireModel):
    """A queued slash command's turn came: a host runs it and answers by `request_id`
    (`Session.respond_to_command`, spec K13)."""

    request_id: str
    command: str


class CommandCompletedData(WireModel):
    """The queued command was answered (or its wait ended): hosts dismiss it."""

    request_id: str


class ModelRequests(WireModel):
    count: int = 0
    cost: float = 0.0
    """The calls' cost by the provider's price table (spec U1); 0 without prices."""


class ModelTokens(WireModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class ModelMetric(WireModel):
    """Model calls made with one model, and their tokens."""

    requests: ModelRequests = Field(default_factory=ModelRequests)
    usage: ModelTokens = Field(default_factory=ModelTokens)


class CodeChanges(WireModel):
    """Files the session changed: trimtab's runtime edits none itself (its tools might)."""

    files_modified: list[str] = Field(default_factory=list)
    lines_added: int = 0
    lines_removed: int = 0


class ShutdownData(WireModel):
    """The session was shut down: why, and what it spent (from its log)."""

    shutdown_type: Literal["routine", "error"] = "routine"
    error_reason: str | None = None
    session_start_time: int
    """Milliseconds since the epoch."""
    total_api_duration_ms: float = 0.0
    code_changes: CodeChanges = Field(default_factory=CodeChanges)
    model_metrics: dict[str, ModelMetric] = Field(default_factory=dict)
    current_model: str | None = None


class UsageInfoData(WireModel):
    token_limit: int
    current_tokens: int
    messages_length: int
    run_spending: Spending | None = None
    """What the run has spent, this call included (spec U2)."""
    epoch_spending: Spending | None = None
    """What the session has spent since its latest clear."""
    session_spending: Spending | None = None
    """What the session has spent in all."""


class SessionLimits(WireModel):
    """The Copilot protocol's `sessionLimits` (1 AI credit is 0.01 of the price table's
    unit, USD by convention: spec U6)."""

    max_ai_credits: float | None = None


class SessionLimitsChangedData(WireModel):
    """The session's budget was set (`Session.set_budget`); None: no budget."""

    session_limits: SessionLimits | None = None
    """The budget's cost in AI credits, as Copilot clients read it."""
    budget: Budget | None = None


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


class SessionPrunedEvent(EventBase):
    """The events before the window's base, removed from the store by a prune (spec X8): it
    takes the place (position and id) of the last of them, so positions and the `parent_id`
    chain after it stay as they were."""

    type: Literal["session.pruned"] = "session.pruned"
    data: PrunedData


class SessionWarningEvent(EventBase):
    type: Literal["session.warning"] = "session.warning"
    data: WarningData


class SessionInfoEvent(EventBase):
    type: Literal["session.info"] = "session.info"
    data: InfoData


class SessionModelChangeEvent(EventBase):
    type: Literal["session.model_change"] = "session.model_change"
    data: ModelChangeData


class SessionModeChangedEvent(EventBase):
    type: Literal["session.mode_changed"] = "session.mode_changed"
    data: ModeChangedData


class SessionLimitsChangedEvent(EventBase):
    type: Literal["session.session_limits_changed"] = "session.session_limits_changed"
    data: SessionLimitsChangedData


class SessionTitleChangedEvent(EventBase):
    type: Literal["session.title_changed"] = "session.title_changed"
    data: TitleChangedData


class SessionPlanChangedEvent(EventBase):
    type: Literal["session.plan_changed"] = "session.plan_changed"
    data: PlanChangedData


class SessionWorkspaceFileChangedEvent(EventBase):
    type: Literal["session.workspace_file_changed"] = "session.workspace_file_changed"
    data: WorkspaceFileChangedData


class SessionWorkspacePathChangedEvent(EventBase):
    """trimtab's own: the Copilot protocol names file writes only (the clients ignore it)."""

    type: Literal["session.workspace_path_changed"] = "session.workspace_path_changed"
    data: WorkspacePathChangedData


class SessionPermissionsChangedEvent(EventBase):
    type: Literal["session.permissions_changed"] = "session.permissions_changed"
    data: PermissionsChangedData
    ephemeral: bool = True


class CommandQueuedEvent(EventBase):
    type: Literal["command.queued"] = "command.queued"
    data: CommandQueuedData
    ephemeral: bool = True


class CommandCompletedEvent(EventBase):
    type: Literal["command.completed"] = "command.completed"
    data: CommandCompletedData
    ephemeral: bool = True


class PendingMessagesModifiedEvent(EventBase):
    """The queue of inputs waiting behind the run changed (`Session.pending_messages`)."""

    type: Literal["pending_messages.modified"] = "pending_messages.modified"
    data: PendingMessagesModifiedData = Field(default_factory=lambda: PendingMessagesModifiedData())
    ephemeral: bool = True


class SessionShutdownEvent(EventBase):
    type: Literal["session.shutdown"] = "session.shutdown"
    data: ShutdownData


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
    | SessionPrunedEvent
    | SessionWarningEvent
    | SessionInfoEvent
    | SessionModelChangeEvent
    | SessionModeChangedEvent
    | SessionTitleChangedEvent
    | SessionPlanChangedEvent
    | SessionWorkspaceFileChangedEvent
    | SessionWorkspacePathChangedEvent
    | SessionPermissionsChangedEvent
    | CommandQueuedEvent
    | CommandCompletedEvent
    | SessionLimitsChangedEvent
    | PendingMessagesModifiedEvent
    | SessionShutdownEvent
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
    "session.pruned",
    "session.warning",
    "session.info",
    "session.model_change",
    "session.mode_changed",
    "session.title_changed",
    "session.plan_changed",
    "session.workspace_file_changed",
    "session.workspace_path_changed",
    "session.permissions_changed",
    "command.queued",
    "command.completed",
    "session.session_limits_changed",
    "pending_messages.modified",
    "session.shutdown",
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
