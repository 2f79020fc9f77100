"""The params and results of the Copilot session RPCs beyond sending and history: the model,
the name, forks, notes in the timeline, usage metrics and activity (spec section K).

Field names follow the official clients' generated `rpc.py`; every result is a subset of the
shape those clients parse, with the fields they require.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from trimtab.events import CodeChanges, ModelMetric, SessionMode
from trimtab.protocol.wire import MAX_ATTACHMENTS, Attachment, SessionParams, Text, Wire

__all__ = [
    "ActivityResult",
    "ApproveAllParams",
    "ContextAttribution",
    "ContextAttributionResult",
    "ContextCategories",
    "ContextCompactions",
    "ContextEntry",
    "ContextInfo",
    "ContextInfoParams",
    "ContextInfoResult",
    "CurrentModelResult",
    "CursorResult",
    "EnqueueCommandParams",
    "EnqueueCommandResult",
    "EventLogReadParams",
    "EventLogReadResult",
    "ForkParams",
    "ForkResult",
    "HandoffResult",
    "HeaviestMessage",
    "HeaviestParams",
    "HeaviestResult",
    "InstructionSourcesResult",
    "InterestParams",
    "InterestResult",
    "IsProcessingResult",
    "LogParams",
    "LogResult",
    "ModeSetParams",
    "ModeSetResult",
    "ModelEntry",
    "ModelListResult",
    "NameResult",
    "NameSetAutoParams",
    "NameSetAutoResult",
    "NameSetParams",
    "PermissionModeParams",
    "PermissionModeResult",
    "PermissionModeSetResult",
    "QueueAppendSteeringParams",
    "QueueHasPendingResult",
    "QueueItem",
    "QueueItemParams",
    "QueuePendingResult",
    "QueueSendNowResult",
    "QueueRemovedResult",
    "QueuedCommandAnswer",
    "ReasoningEffortParams",
    "ReasoningEffortResult",
    "ReleaseInterestParams",
    "RespondToCommandParams",
    "ShutdownParams",
    "SwitchModelParams",
    "SwitchModelResult",
    "ToolMetadata",
    "ToolsMetadataResult",
    "UsageCodeChanges",
    "UsageMetricsResult",
    "WithdrawParams",
    "WithdrawResult",
]


# --- model ---------------------------------------------------------------------------------


class CurrentModelResult(Wire):
    """`session.model.getCurrent`: the model of the next model call."""

    model_id: str | None = None
    reasoning_effort: str | None = None


class SwitchModelParams(SessionParams):
    """`session.model.switchTo`: the model, and optionally the reasoning effort, to use."""

    model_id: Text = Field(min_length=1)
    reasoning_effort: Text | None = None


class SwitchModelResult(Wire):
    """`session.model.switchTo`: the model now in use, and the whole model state."""

    model_id: str | None = None
    model_state: CurrentModelResult
    status: Literal["applied"] = "applied"


class ReasoningEffortParams(SessionParams):
    """`session.model.setReasoningEffort`."""

    reasoning_effort: Text = Field(min_length=1)


class ReasoningEffortResult(Wire):
    """`session.model.setReasoningEffort`: the effort recorded."""

    reasoning_effort: str


class ModelEntry(Wire):
    """One model a session can use."""

    id: str
    name: str


class ModelListResult(Wire):
    """`session.model.list`."""

    models: list[ModelEntry] = Field(alias="list")


# --- name ----------------------------------------------------------------------------------


class NameSetParams(SessionParams):
    """`session.name.set` (checked by `Session.set_name`)."""

    name: Text


class NameResult(Wire):
    """`session.name.get`: None until a name is set."""

    name: str | None = None


# --- forks ---------------------------------------------------------------------------------


class ForkParams(SessionParams):
    """`sessions.fork`: copy the log before `to_event_id` (all of it when None)."""

    to_event_id: str | None = None
    name: Text | None = None


class ForkResult(Wire):
    """`sessions.fork`: the new session, at rest and not open (resume it to use it)."""

    session_id: str
    name: str | None = None


# --- notes, usage, activity ----------------------------------------------------------------


class LogParams(SessionParams):
    """`session.log`: a note in the session's timeline."""

    message: Text
    level: Literal["info", "warning", "error"] = "info"
    ephemeral: bool = False
    type: Text = "notification"
    url: Text | None = None


class LogResult(Wire):
    """`session.log`: the id of the event emitted."""

    event_id: str


class ShutdownParams(SessionParams):
    """`session.shutdown`: end the session, routinely or because of an error."""

    type: Literal["routine", "error"] = "routine"
    reason: Text | None = None


class UsageCodeChanges(CodeChanges):
    files_modified_count: int = 0


class UsageMetricsResult(Wire):
    """`session.usage.getMetrics`: what the session's log says it spent."""

    session_start_time: datetime
    total_api_duration_ms: float
    total_user_requests: int
    total_premium_request_cost: float = 0.0
    last_call_input_tokens: int
    last_call_output_tokens: int
    model_metrics: dict[str, ModelMetric]
    code_changes: UsageCodeChanges = Field(default_factory=UsageCodeChanges)
    current_model: str | None = None


# --- permissions and mode ------------------------------------------------------------------


class ApproveAllParams(SessionParams):
    """`session.permissions.setApproveAll`."""

    enabled: bool


class PermissionModeResult(Wire):
    """`session.permissions.getMode`: `allow-all` while approve-all is on, else `manual`."""

    mode: Literal["manual", "allow-all"]


class PermissionModeParams(SessionParams):
    """`session.permissions.setMode`: `assisted` (an LLM judge of each request) is not
    served: it is answered unapplied."""

    mode: Literal["manual", "assisted", "allow-all"]


class PermissionModeSetResult(Wire):
    """`session.permissions.setMode`: whether the mode was applied, and the mode now."""

    success: bool
    mode: Literal["manual", "allow-all"]


class ModeSetParams(SessionParams):
    """`session.mode.set`; with `expected_mode`, only from that mode."""

    mode: SessionMode
    expected_mode: SessionMode | None = None


class ModeSetResult(Wire):
    """`session.mode.set`: whether the mode was applied (trimtab's modes change no model)."""

    mode_applied: bool
    status: Literal["applied", "unchanged"]
    model_changed: bool = False


# --- queue ---------------------------------------------------------------------------------


class QueueItem(Wire):
    """A message or a command waiting behind the run in progress."""

    id: str
    """A message's id, as `session.send` answered it; a command's request id."""
    message_id: str | None = None
    """Messages only."""
    kind: Literal["message", "command"] = "message"
    display_text: str
    agent_mode: SessionMode
    """The session's mode now (trimtab does not stamp a mode on a queued item)."""


class QueuePendingResult(Wire):
    """`session.queue.pendingItems` (and `.snapshot`): the queued inputs, and the steering
    messages waiting for the running turn's next model call (spec X6)."""

    items: list[QueueItem]
    steering_messages: list[str] = []


class QueueItemParams(SessionParams):
    """`session.queue.removeAt`: the item's id (`QueueItem.id`)."""

    id: str


class QueueRemovedResult(Wire):
    """`session.queue.removeAt`, `.removeMostRecent`."""

    removed: bool


class QueueMoveParams(SessionParams):
    """`session.queue.moveItem`: past either end of the queue means that end."""

    id: str
    to_position: int


class QueueMoveResult(Wire):
    """`session.queue.moveItem`: false when the item was at that place already."""

    changed: bool


class QueueInsertMessage(Wire):
    """`session.queue.insertAt`'s message: a `session.send`'s prompt, attachments and
    headers (its other fields, the reference runtime's scheduling and provenance, are
    ignored: the position places it)."""

    prompt: Text
    attachments: list[Attachment] | None = Field(default=None, max_length=MAX_ATTACHMENTS)
    request_headers: dict[str, str] | None = None


class QueueInsertParams(SessionParams):
    """`session.queue.insertAt`."""

    position: int
    message: QueueInsertMessage


class QueueNewItemResult(Wire):
    """`session.queue.insertAt`, `.duplicateAt`: the new item's id."""

    id: str


class QueueUpdateTextParams(SessionParams):
    """`session.queue.updateText`: trimtab shows a message's prompt, so `displayPrompt` is
    ignored."""

    id: str
    prompt: Text


class QueueUpdateTextResult(Wire):
    """`session.queue.updateText`: whether the stored text changed."""

    updated: bool


class QueueSendNowResult(Wire):
    """`session.queue.sendNow` (its item by `QueueItemParams`): whether the message went
    into the steering lane of a run in progress (spec K20); false when none was."""

    steered: bool


class QueueAppendSteeringParams(SessionParams):
    """`session.queue.appendSteering` (spec K21), answered by `QueueUpdateTextResult`:
    `displayPrompt` is ignored (trimtab shows the prompt), and so is `agentMode` (trimtab
    stamps no mode on a message and runs the same in every mode, K7)."""

    message_id: str
    prompt: Text
    expected_prompt: str
    display_prompt: str = ""
    attachments: list[Attachment] = Field(default=[], max_length=MAX_ATTACHMENTS)
    agent_mode: SessionMode | None = None


class QueueHasPendingResult(Wire):
    """`session.queue.hasPending`: a message or command waits, in either lane."""

    has_pending: bool


class QueueDrainPausedParams(SessionParams):
    """`session.queue.setDrainPaused`."""

    paused: bool


class WithdrawParams(SessionParams):
    """`session.queue.withdrawMessage`: only while the message still waits, unchanged."""

    message_id: str
    expected_prompt: str


class WithdrawResult(Wire):
    """`session.queue.withdrawMessage`: trimtab never interrupts a run to withdraw."""

    removed: bool
    interrupted: bool = False


class EnqueueCommandParams(SessionParams):
    """`session.commands.enqueue`."""

    command: Text
    display_text: Text | None = None


class EnqueueCommandResult(Wire):
    """`session.commands.enqueue`: `queued: false` (and no id) on a remote session."""

    queued: bool
    queue_id: str | None


class QueuedCommandAnswer(Wire):
    """A host's answer to `command.queued`: whether it ran the command."""

    handled: bool
    stop_processing_queue: bool | None = None
    """Not honoured: the queue goes on (spec K13)."""


class RespondToCommandParams(SessionParams):
    """`session.commands.respondToQueuedCommand`."""

    request_id: str
    result: QueuedCommandAnswer


# --- event log -----------------------------------------------------------------------------


class EventLogReadParams(SessionParams):
    """`session.eventLog.read`: stored events after `cursor`, waiting up to `wait_ms` for one
    when there is none yet; `types` keeps only those types (`*` or None: all)."""

    cursor: str | None = None
    max: int = Field(default=100, ge=1, le=1000)
    wait_ms: int = Field(default=0, ge=0)
    types: list[str] | Literal["*"] | None = None
    direction: Literal["forward"] = "forward"


class EventLogReadResult(Wire):
    """`session.eventLog.read`."""

    events: list[dict[str, Any]]
    cursor: str
    cursor_status: Literal["ok"] = "ok"
    has_more: bool


class CursorResult(Wire):
    """`session.eventLog.tail`: the cursor of the log's end."""

    cursor: str


class InterestParams(SessionParams):
    """`session.eventLog.registerInterest`."""

    event_type: Text = Field(min_length=1, max_length=200)


class InterestResult(Wire):
    handle: str


class ReleaseInterestParams(SessionParams):
    """`session.eventLog.releaseInterest`."""

    handle: str


# --- metadata ------------------------------------------------------------------------------


class ContextCategories(Wire):
    """Where the window's tokens go, by kind (estimates, as `Session.get_context()`'s)."""

    system_prompt: int
    custom_instructions: int
    """The developer messages."""
    system_tools: int
    mcp_tools: int
    messages: int
    free_space: int
    buffer: int = 0


class ContextEntry(Wire):
    """One source of tokens; `parent_id` nests it under another entry."""

    id: str
    kind: str
    label: str
    tokens: int
    parent_id: str | None = None


class ContextCompactions(Wire):
    count: int


class ContextAttribution(Wire):
    """What the next model call's window spends its tokens on."""

    model_id: str
    model_source: Literal["selected", "default"]
    limit: int
    prompt_token_limit: int
    total_tokens: int
    compaction_threshold: int
    buffer_tokens: int = 0
    categories: ContextCategories
    compactions: ContextCompactions
    entries: list[ContextEntry]


class ContextAttributionResult(Wire):
    """`session.metadata.getContextAttribution`."""

    context_attribution: ContextAttribution


class IsProcessingResult(Wire):
    """`session.metadata.isProcessing`."""

    processing: bool


class ActivityResult(Wire):
    """`session.metadata.activity`."""

    abortable: bool
    has_active_work: bool


class ContextInfoParams(SessionParams):
    """`session.metadata.contextInfo`: 0 for a limit means the session's own."""

    prompt_token_limit: int = Field(default=0, ge=0)
    output_token_limit: int = Field(default=0, ge=0)
    selected_model: Text | None = None


class ContextInfo(Wire):
    """The window's tokens in three parts: instructions, conversation, tool schemas."""

    model_name: str
    limit: int
    prompt_token_limit: int
    total_tokens: int
    system_tokens: int
    """The system message and the developer messages."""
    conversation_tokens: int
    tool_definitions_tokens: int
    mcp_tools_tokens: int
    compaction_threshold: int
    buffer_tokens: int = 0


class ContextInfoResult(Wire):
    """`session.metadata.contextInfo`."""

    context_info: ContextInfo


class HeaviestParams(SessionParams):
    """`session.metadata.getContextHeaviestMessages`."""

    limit: int = Field(default=10, ge=1, le=1000)


class HeaviestMessage(Wire):
    id: str
    """The message's place in the window (`message-<n>`, from 0): stable within one answer."""
    label: str
    role: str
    tokens: int


class HeaviestResult(Wire):
    """`session.metadata.getContextHeaviestMessages`: most tokens first."""

    messages: list[HeaviestMessage]
    total_tokens: int


class InstructionSourcesResult(Wire):
    """`session.instructions.getSources`: trimtab discovers no instruction files."""

    sources: list[dict[str, Any]] = []


class ToolMetadata(Wire):
    """One tool the model may call."""

    name: str
    description: str
    input_schema: dict[str, Any] | None = Field(default=None, alias="input_schema")
    """snake_case on the wire, as the protocol has it."""
    defer_loading: bool | None = None
    mcp_server_name: str | None = None
    mcp_tool_name: str | None = None
    namespaced_name: str | None = None


class ToolsMetadataResult(Wire):
    """`session.tools.getCurrentMetadata`."""

    tools: list[ToolMetadata]


class NameSetAutoParams(SessionParams):
    """`session.name.setAuto`."""

    summary: str


class NameSetAutoResult(Wire):
    applied: bool


class HandoffResult(Wire):
    """`session.history.summarizeForHandoff`: empty when there is nothing to summarise."""

    summary: str
