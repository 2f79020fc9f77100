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
from trimtab.protocol.wire import SessionParams, Text, Wire

__all__ = [
    "ActivityResult",
    "ApproveAllParams",
    "ContextAttribution",
    "ContextAttributionResult",
    "ContextCategories",
    "ContextCompactions",
    "ContextEntry",
    "CurrentModelResult",
    "CursorResult",
    "EventLogReadParams",
    "EventLogReadResult",
    "ForkParams",
    "ForkResult",
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
    "NameSetParams",
    "PermissionModeResult",
    "QueueItem",
    "QueuePendingResult",
    "ReasoningEffortParams",
    "ReleaseInterestParams",
    "ReasoningEffortResult",
    "ShutdownParams",
    "SwitchModelParams",
    "SwitchModelResult",
    "UsageCodeChanges",
    "UsageMetricsResult",
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
    """A message waiting behind the run in progress."""

    id: str
    """Its message id, as `session.send` answered it."""
    message_id: str
    kind: Literal["message"] = "message"
    display_text: str
    agent_mode: SessionMode
    """The session's mode now (trimtab does not stamp a mode on a queued message)."""


class QueuePendingResult(Wire):
    """`session.queue.pendingItems`: trimtab has no steering messages."""

    items: list[QueueItem]
    steering_messages: list[str] = []


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
