"""The Copilot session RPCs beyond sending and history (spec section K): the model, the name,
forks, notes in the timeline, usage metrics and activity.

Each method maps onto one `Session` call, as `copilot` does for the core methods; this module
only adds entries to a connection's method table (`session_methods`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from trimtab import Session, SessionNotFoundError
from trimtab.events import SessionCompactionCompleteEvent
from trimtab.protocol.errors import SESSION_NOT_FOUND
from trimtab.protocol.jsonrpc import Connection, RpcError
from trimtab.protocol.session_wire import (
    ActivityResult,
    ApproveAllParams,
    ContextAttribution,
    ContextAttributionResult,
    ContextCategories,
    ContextCompactions,
    ContextEntry,
    CurrentModelResult,
    ForkParams,
    ForkResult,
    IsProcessingResult,
    LogParams,
    LogResult,
    ModelEntry,
    ModelListResult,
    ModeSetParams,
    ModeSetResult,
    NameResult,
    NameSetParams,
    PermissionModeResult,
    QueueItem,
    QueuePendingResult,
    ReasoningEffortParams,
    ReasoningEffortResult,
    ShutdownParams,
    SwitchModelParams,
    SwitchModelResult,
    UsageMetricsResult,
)
from trimtab.protocol.wire import SessionParams, SuccessResult
from trimtab.server.event_log import EventLogRpc
from trimtab.server.hub import SessionHub, SharedSession

__all__ = ["session_methods"]

Method = Callable[[dict[str, Any]], Awaitable[BaseModel | dict[str, Any] | str | None]]


def session_methods(hub: SessionHub, conn: Connection) -> dict[str, Method]:
    """The session RPCs of section K, for one connection."""
    rpc = _SessionRpc(hub, conn)
    log = EventLogRpc(hub, conn)
    return {
        "session.eventLog.tail": log.tail,
        "session.eventLog.read": log.read,
        "session.eventLog.registerInterest": log.register_interest,
        "session.eventLog.releaseInterest": log.release_interest,
        "session.model.getCurrent": rpc.current_model,
        "session.model.switchTo": rpc.switch_model,
        "session.model.setReasoningEffort": rpc.set_reasoning_effort,
        "session.model.list": rpc.list_models,
        "session.name.get": rpc.get_name,
        "session.name.set": rpc.set_name,
        "sessions.fork": rpc.fork,
        "session.log": rpc.log,
        "session.usage.getMetrics": rpc.usage_metrics,
        "session.shutdown": rpc.shutdown,
        "session.permissions.setApproveAll": rpc.set_approve_all,
        "session.permissions.getMode": rpc.permission_mode,
        "session.mode.get": rpc.get_mode,
        "session.mode.set": rpc.set_mode,
        "session.queue.pendingItems": rpc.pending_items,
        "session.queue.clear": rpc.clear_queue,
        "session.metadata.getContextAttribution": rpc.context_attribution,
        "session.metadata.isProcessing": rpc.is_processing,
        "session.metadata.activity": rpc.activity,
    }


class _SessionRpc:
    def __init__(self, hub: SessionHub, conn: Connection) -> None:
        self._hub = hub
        self._conn = conn

    def _shared(self, params: dict[str, Any]) -> SharedSession:
        return self._hub.get(self._conn, SessionParams.model_validate(params).session_id)

    # --- model -----------------------------------------------------------------------------

    async def current_model(self, params: dict[str, Any]) -> CurrentModelResult:
        config = self._shared(params).session.config
        return CurrentModelResult(model_id=config.model, reasoning_effort=config.reasoning_effort)

    async def switch_model(self, params: dict[str, Any]) -> SwitchModelResult:
        request = SwitchModelParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        await session.switch_model(request.model_id, request.reasoning_effort)
        config = session.config
        state = CurrentModelResult(model_id=config.model, reasoning_effort=config.reasoning_effort)
        return SwitchModelResult(model_id=config.model, model_state=state)

    async def set_reasoning_effort(self, params: dict[str, Any]) -> ReasoningEffortResult:
        request = ReasoningEffortParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        await session.set_reasoning_effort(request.reasoning_effort)
        return ReasoningEffortResult(reasoning_effort=session.config.reasoning_effort or "")

    async def list_models(self, params: dict[str, Any]) -> ModelListResult:
        # A session brings its own (BYOK) provider, whose catalogue trimtab does not fetch:
        # the model it uses is the one it knows (spec K1).
        model = self._shared(params).session.config.model
        entries = [] if model is None else [ModelEntry(id=model, name=model)]
        return ModelListResult(list=entries)

    # --- name ------------------------------------------------------------------------------

    async def get_name(self, params: dict[str, Any]) -> NameResult:
        return NameResult(name=self._shared(params).session.name)

    async def set_name(self, params: dict[str, Any]) -> dict[str, Any]:
        request = NameSetParams.model_validate(params)
        await self._hub.get(self._conn, request.session_id).session.set_name(request.name)
        return {}

    # --- forks -----------------------------------------------------------------------------

    async def fork(self, params: dict[str, Any]) -> ForkResult:
        request = ForkParams.model_validate(params)
        try:
            source = self._hub.get(self._conn, request.session_id).session
        except RpcError:
            if not await self._stored(request.session_id):
                message = f"Session {request.session_id} not found or has no persisted events"
                raise RpcError(SESSION_NOT_FOUND, message, {"code": "session_not_found"}) from None
            raise
        fork = await source.history.fork(request.to_event_id)
        try:
            if request.name is not None:
                await fork.set_name(request.name)
        finally:
            # Let go of it here: the client resumes it to use it, on this server or another.
            await fork.disconnect()
        return ForkResult(session_id=fork.session_id, name=fork.name)

    async def _stored(self, session_id: str) -> bool:
        """Whether the session is stored, for this client (another's is not, spec S16)."""
        try:
            record = await self._hub.client.get_session_record(session_id)
        except SessionNotFoundError:
            return False
        return self._hub.sees(self._conn, record.owner)

    # --- notes, usage, activity ------------------------------------------------------------

    async def log(self, params: dict[str, Any]) -> LogResult:
        request = LogParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        event = await session.log(
            request.message,
            level=request.level,
            ephemeral=request.ephemeral,
            kind=request.type,
            url=request.url,
        )
        return LogResult(event_id=event.id)

    async def usage_metrics(self, params: dict[str, Any]) -> UsageMetricsResult:
        session = self._shared(params).session
        metrics = await session.metrics()
        return UsageMetricsResult(
            session_start_time=metrics.start_time,
            total_api_duration_ms=metrics.api_duration_ms,
            total_user_requests=metrics.user_requests,
            last_call_input_tokens=metrics.last_call_tokens[0],
            last_call_output_tokens=metrics.last_call_tokens[1],
            model_metrics=metrics.models,
            current_model=session.config.model,
        )

    async def shutdown(self, params: dict[str, Any]) -> dict[str, Any]:
        request = ShutdownParams.model_validate(params)
        self._hub.get(self._conn, request.session_id)  # open on this connection, else refused

        async def shut(session: Session) -> None:
            await session.shutdown(request.type, request.reason)

        await self._hub.shut_down(request.session_id, shut)
        return {}

    # --- queue -----------------------------------------------------------------------------

    async def pending_items(self, params: dict[str, Any]) -> QueuePendingResult:
        session = self._shared(params).session
        mode = session.mode
        items = [
            QueueItem(
                id=m.message_id, message_id=m.message_id, display_text=m.prompt, agent_mode=mode
            )
            for m in await session.pending_messages()
        ]
        return QueuePendingResult(items=items)

    async def clear_queue(self, params: dict[str, Any]) -> dict[str, Any]:
        await self._shared(params).session.clear_pending_messages()
        return {}

    # --- permissions and mode --------------------------------------------------------------

    async def set_approve_all(self, params: dict[str, Any]) -> SuccessResult:
        request = ApproveAllParams.model_validate(params)
        self._hub.get(self._conn, request.session_id).session.approve_all = request.enabled
        return SuccessResult(success=True)

    async def permission_mode(self, params: dict[str, Any]) -> PermissionModeResult:
        approve_all = self._shared(params).session.approve_all
        return PermissionModeResult(mode="allow-all" if approve_all else "manual")

    async def get_mode(self, params: dict[str, Any]) -> str:
        return self._shared(params).session.mode  # the result is the bare mode

    async def set_mode(self, params: dict[str, Any]) -> ModeSetResult:
        request = ModeSetParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        if request.expected_mode is not None and session.mode != request.expected_mode:
            return ModeSetResult(mode_applied=False, status="unchanged")
        await session.set_mode(request.mode)
        return ModeSetResult(mode_applied=True, status="applied")

    async def context_attribution(self, params: dict[str, Any]) -> ContextAttributionResult:
        session = self._shared(params).session
        compactions = sum(
            1
            for e in await session.get_events()
            if isinstance(e, SessionCompactionCompleteEvent) and e.data.success
        )
        return ContextAttributionResult(
            context_attribution=attribution(session, compactions),
        )

    async def is_processing(self, params: dict[str, Any]) -> IsProcessingResult:
        return IsProcessingResult(processing=self._shared(params).session.busy)

    async def activity(self, params: dict[str, Any]) -> ActivityResult:
        busy = self._shared(params).session.busy
        return ActivityResult(abortable=busy, has_active_work=busy)


def attribution(session: Session, compactions: int) -> ContextAttribution:
    """`session.get_context()` by source, in the Copilot clients' categories (spec K8): the
    system message, the developer messages (custom instructions), the tool schemas (MCP
    tools counted with the others) and the conversation."""
    context = session.get_context()
    config = session.config
    by_role: dict[str, int] = {}
    for sized in context.messages:
        by_role[sized.message.role] = by_role.get(sized.message.role, 0) + sized.tokens
    system, developer = by_role.pop("system", 0), by_role.pop("developer", 0)
    messages = sum(by_role.values())
    limit = context.token_limit
    share = config.infinite_sessions.threshold if config.infinite_sessions.enabled else 1.0
    entries = [
        ContextEntry(id="system", kind="systemPrompt", label="System message", tokens=system),
        ContextEntry(
            id="developer", kind="customInstructions", label="Developer messages", tokens=developer
        ),
        ContextEntry(id="tools", kind="systemTools", label="Tools", tokens=context.tools_tokens),
        ContextEntry(id="messages", kind="messages", label="Conversation", tokens=messages),
    ]
    return ContextAttribution(
        model_id=config.model or "default",
        model_source="default" if config.model is None else "selected",
        limit=limit,
        prompt_token_limit=limit,
        total_tokens=context.total_tokens,
        compaction_threshold=int(limit * share),
        categories=ContextCategories(
            system_prompt=system,
            custom_instructions=developer,
            system_tools=context.tools_tokens,
            mcp_tools=0,
            messages=messages,
            free_space=max(limit - context.total_tokens, 0),
        ),
        compactions=ContextCompactions(count=compactions),
        entries=entries,
    )
