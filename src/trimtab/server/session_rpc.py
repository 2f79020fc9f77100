"""The Copilot session RPCs beyond sending and history (spec section K): the model, the name,
forks, notes in the timeline, usage metrics and activity.

Each method maps onto one `Session` call, as `copilot` does for the core methods; this module
only adds entries to a connection's method table (`session_methods`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from trimtab import QueuedCommand, QueuedMessage, Session, SessionNotFoundError
from trimtab.events import Budget, SessionCompactionCompleteEvent
from trimtab.mcp import McpTool
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
    ContextInfo,
    ContextInfoParams,
    ContextInfoResult,
    CurrentModelResult,
    EnqueueCommandParams,
    EnqueueCommandResult,
    ForkParams,
    ForkResult,
    HandoffResult,
    HeaviestMessage,
    HeaviestParams,
    HeaviestResult,
    InstructionSourcesResult,
    IsProcessingResult,
    LogParams,
    LogResult,
    ModelEntry,
    ModelListResult,
    ModeSetParams,
    ModeSetResult,
    NameResult,
    NameSetAutoParams,
    NameSetAutoResult,
    NameSetParams,
    PermissionModeParams,
    PermissionModeResult,
    PermissionModeSetResult,
    QueueAppendSteeringParams,
    QueueDrainPausedParams,
    QueueHasPendingResult,
    QueueInsertParams,
    QueueItem,
    QueueItemParams,
    QueueMoveParams,
    QueueMoveResult,
    QueueNewItemResult,
    QueuePendingResult,
    QueueRemovedResult,
    QueueSendNowResult,
    QueueUpdateTextParams,
    QueueUpdateTextResult,
    ReasoningEffortParams,
    ReasoningEffortResult,
    RespondToCommandParams,
    ShutdownParams,
    SwitchModelParams,
    SwitchModelResult,
    ToolMetadata,
    ToolsMetadataResult,
    UsageMetricsResult,
    WithdrawParams,
    WithdrawResult,
)
from trimtab.protocol.wire import SessionParams, SuccessResult, UpdateOptionsParams
from trimtab.server.attachments import with_attachments
from trimtab.server.event_log import EventLogRpc
from trimtab.server.hub import SessionHub, SharedSession
from trimtab.server.workspace_rpc import workspace_methods

__all__ = ["session_methods"]

Method = Callable[[dict[str, Any]], Awaitable[BaseModel | dict[str, Any] | str | None]]


def session_methods(hub: SessionHub, conn: Connection) -> dict[str, Method]:
    """The session RPCs of section K, for one connection."""
    rpc = _SessionRpc(hub, conn)
    log = EventLogRpc(hub, conn)
    return workspace_methods(hub, conn) | {
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
        "session.name.setAuto": rpc.set_auto_name,
        "session.history.summarizeForHandoff": rpc.summarize_for_handoff,
        "session.instructions.getSources": rpc.instruction_sources,
        "session.instructions.reload": rpc.instruction_sources,
        "session.tools.getCurrentMetadata": rpc.tools_metadata,
        "session.commands.enqueue": rpc.enqueue_command,
        "session.commands.respondToQueuedCommand": rpc.respond_to_command,
        "session.queue.removeAt": rpc.remove_at,
        "session.queue.removeMostRecent": rpc.remove_most_recent,
        "session.queue.withdrawMessage": rpc.withdraw_message,
        "session.queue.moveItem": rpc.move_item,
        "session.queue.insertAt": rpc.insert_at,
        "session.queue.updateText": rpc.update_text,
        "session.queue.duplicateAt": rpc.duplicate_at,
        "session.queue.setDrainPaused": rpc.set_drain_paused,
        "session.queue.sendNow": rpc.send_now,
        "session.queue.appendSteering": rpc.append_steering,
        "session.queue.hasPending": rpc.has_pending,
        "session.queue.snapshot": rpc.pending_items,
        "session.permissions.setMode": rpc.set_permission_mode,
        "session.metadata.contextInfo": rpc.context_info,
        "session.metadata.getContextHeaviestMessages": rpc.heaviest_messages,
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
        "session.options.update": rpc.update_options,
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

    # --- options ---------------------------------------------------------------------------

    async def update_options(self, params: dict[str, Any]) -> SuccessResult:
        """The session's budget (spec U6): trimtab's `budget` as given (null: none), else
        its `cost` set from Copilot's `sessionLimits` (`maxAiCredits` or the limits null: no
        cost limit). The protocol's other options of an open session are not served: a
        request with neither is answered `success: false`."""
        request = UpdateOptionsParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        if "budget" not in params and "sessionLimits" not in params:
            return SuccessResult(success=False, error="trimtab changes only the session's limits")
        budget = request.budget
        if "budget" not in params:
            credits = request.session_limits.max_ai_credits if request.session_limits else None
            kept = session.budget.model_dump(exclude_none=True) if session.budget else {}
            kept.pop("cost", None)
            cost = {} if credits is None else {"cost": credits / 100}
            budget = Budget.model_validate({**kept, **cost}) if kept or cost else None
        await session.set_budget(budget)
        return SuccessResult(success=True)

    # --- name ------------------------------------------------------------------------------

    async def get_name(self, params: dict[str, Any]) -> NameResult:
        return NameResult(name=self._shared(params).session.name)

    async def set_name(self, params: dict[str, Any]) -> dict[str, Any]:
        request = NameSetParams.model_validate(params)
        await self._hub.get(self._conn, request.session_id).session.set_name(request.name)
        return {}

    async def set_auto_name(self, params: dict[str, Any]) -> NameSetAutoResult:
        request = NameSetAutoParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        return NameSetAutoResult(applied=await session.set_auto_name(request.summary))

    # --- what the session holds ------------------------------------------------------------

    async def summarize_for_handoff(self, params: dict[str, Any]) -> HandoffResult:
        session = self._shared(params).session
        return HandoffResult(summary=await session.history.summarize_for_handoff())

    async def instruction_sources(self, params: dict[str, Any]) -> InstructionSourcesResult:
        # trimtab reads no instruction files (a repository's, a home directory's, plugins'):
        # a session's instructions are its system and developer messages (spec K14).
        self._shared(params)
        return InstructionSourcesResult()

    async def tools_metadata(self, params: dict[str, Any]) -> ToolsMetadataResult:
        session = self._shared(params).session
        deferred = session.deferred_tools
        tools = []
        for name, tool in session.tools.items():
            definition = tool.definition
            entry = ToolMetadata(
                name=name,
                description=definition.description,
                input_schema=definition.parameters,
                defer_loading=name in deferred,
            )
            if isinstance(tool, McpTool):
                entry.mcp_server_name, entry.mcp_tool_name = tool.server_name, tool.mcp_name
            tools.append(entry)
        return ToolsMetadataResult(tools=tools)

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
        pending = await session.pending_items()
        items = [
            QueueItem(id=i.request_id, kind="command", display_text=i.display_text, agent_mode=mode)
            if isinstance(i, QueuedCommand)
            else QueueItem(
                id=i.message_id, message_id=i.message_id, display_text=i.prompt, agent_mode=mode
            )
            for i in pending
            if not (isinstance(i, QueuedMessage) and i.immediate)
        ]
        # (Steering messages the run took are in the log already: none waits "in flight".)
        steering = [m.prompt for m in pending if isinstance(m, QueuedMessage) and m.immediate]
        return QueuePendingResult(items=items, steering_messages=steering)

    async def clear_queue(self, params: dict[str, Any]) -> dict[str, Any]:
        await self._shared(params).session.clear_pending_messages()
        return {}

    async def remove_at(self, params: dict[str, Any]) -> QueueRemovedResult:
        request = QueueItemParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        return QueueRemovedResult(removed=bool(await session.remove_pending([request.id])))

    async def remove_most_recent(self, params: dict[str, Any]) -> QueueRemovedResult:
        session = self._shared(params).session
        # The newest waiting item is removed, or none when it began to run meanwhile (a
        # removal never takes an older one instead).
        items = await session.pending_items()
        if not items:
            return QueueRemovedResult(removed=False)
        last = items[-1]
        newest = last.request_id if isinstance(last, QueuedCommand) else last.message_id
        return QueueRemovedResult(removed=bool(await session.remove_pending([newest])))

    async def withdraw_message(self, params: dict[str, Any]) -> WithdrawResult:
        request = WithdrawParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        waiting = {m.message_id: m.prompt for m in await session.pending_messages()}.get(
            request.message_id
        )
        if waiting is None or waiting != request.expected_prompt:
            return WithdrawResult(removed=False)
        return WithdrawResult(removed=bool(await session.remove_pending([request.message_id])))

    async def move_item(self, params: dict[str, Any]) -> QueueMoveResult:
        request = QueueMoveParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        return QueueMoveResult(changed=await session.move_pending(request.id, request.to_position))

    async def insert_at(self, params: dict[str, Any]) -> QueueNewItemResult:
        request = QueueInsertParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        message = request.message
        composed = await with_attachments(
            message.prompt, message.attachments or [], opener=self._hub.policy.open
        )
        message_id = await session.insert_pending(
            request.position,
            composed.prompt,
            request_headers=message.request_headers,
            images=composed.images,
            attachments=composed.attachments,
        )
        return QueueNewItemResult(id=message_id)

    async def update_text(self, params: dict[str, Any]) -> QueueUpdateTextResult:
        request = QueueUpdateTextParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        return QueueUpdateTextResult(
            updated=await session.update_pending(request.id, request.prompt)
        )

    async def duplicate_at(self, params: dict[str, Any]) -> QueueNewItemResult:
        request = QueueItemParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        return QueueNewItemResult(id=await session.duplicate_pending(request.id))

    async def send_now(self, params: dict[str, Any]) -> QueueSendNowResult:
        request = QueueItemParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        return QueueSendNowResult(steered=await session.steer_pending(request.id))

    async def append_steering(self, params: dict[str, Any]) -> QueueUpdateTextResult:
        request = QueueAppendSteeringParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        composed = await with_attachments(
            request.prompt, request.attachments, opener=self._hub.policy.open
        )
        appended = await session.append_steering(
            request.message_id,
            composed.prompt,
            expected_prompt=request.expected_prompt,
            images=composed.images,
            attachments=composed.attachments,
        )
        return QueueUpdateTextResult(updated=appended)

    async def has_pending(self, params: dict[str, Any]) -> QueueHasPendingResult:
        pending = await self._shared(params).session.pending_items()
        return QueueHasPendingResult(has_pending=bool(pending))

    async def set_drain_paused(self, params: dict[str, Any]) -> dict[str, Any]:
        request = QueueDrainPausedParams.model_validate(params)
        await self._hub.get(self._conn, request.session_id).session.set_drain_paused(request.paused)
        return {}

    async def enqueue_command(self, params: dict[str, Any]) -> EnqueueCommandResult:
        request = EnqueueCommandParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        if session.is_remote:  # its owner runs its queue (the protocol's answer for that)
            return EnqueueCommandResult(queued=False, queue_id=None)
        queue_id = await session.enqueue_command(request.command, display_text=request.display_text)
        return EnqueueCommandResult(queued=True, queue_id=queue_id)

    async def respond_to_command(self, params: dict[str, Any]) -> SuccessResult:
        request = RespondToCommandParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        answered = session.respond_to_command(request.request_id, handled=request.result.handled)
        return SuccessResult(success=answered)

    # --- permissions and mode --------------------------------------------------------------

    async def set_approve_all(self, params: dict[str, Any]) -> SuccessResult:
        request = ApproveAllParams.model_validate(params)
        self._hub.get(self._conn, request.session_id).session.approve_all = request.enabled
        return SuccessResult(success=True)

    async def set_permission_mode(self, params: dict[str, Any]) -> PermissionModeSetResult:
        request = PermissionModeParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        if request.mode != "assisted":  # (no judge model: answered unapplied, spec K6)
            session.approve_all = request.mode == "allow-all"
        mode = "allow-all" if session.approve_all else "manual"
        return PermissionModeSetResult(success=request.mode == mode, mode=mode)

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

    async def context_info(self, params: dict[str, Any]) -> ContextInfoResult:
        request = ContextInfoParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        return ContextInfoResult(context_info=context_info(session, request))

    async def heaviest_messages(self, params: dict[str, Any]) -> HeaviestResult:
        request = HeaviestParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        return heaviest(session, request.limit)

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


_INSTRUCTIONS = frozenset({"system", "developer"})


def context_info(session: Session, request: ContextInfoParams) -> ContextInfo:
    """`session.get_context()` in three parts (spec K8): the instructions (system and
    developer messages), the conversation and the tool schemas. A limit given replaces the
    session's model's context window (0: the session's)."""
    context = session.get_context()
    config = session.config
    instructions = sum(m.tokens for m in context.messages if m.message.role in _INSTRUCTIONS)
    conversation = sum(m.tokens for m in context.messages if m.message.role not in _INSTRUCTIONS)
    limit = request.prompt_token_limit or context.token_limit
    share = config.infinite_sessions.threshold if config.infinite_sessions.enabled else 1.0
    mcp = sum(
        len(t.definition.model_dump_json()) // 4
        for n, t in session.tools.items()
        if isinstance(t, McpTool) and n not in session.deferred_tools
    )
    return ContextInfo(
        model_name=request.selected_model or config.model or "default",
        limit=limit,
        prompt_token_limit=limit,
        total_tokens=instructions + conversation + context.tools_tokens,
        system_tokens=instructions,
        conversation_tokens=conversation,
        tool_definitions_tokens=context.tools_tokens,
        mcp_tools_tokens=min(mcp, context.tools_tokens),
        compaction_threshold=int(limit * share),
    )


def heaviest(session: Session, limit: int) -> HeaviestResult:
    """The window's largest messages but its instructions, most tokens first (the first in
    the window first among equals), labelled by role, and a tool result by its tool."""
    context = session.get_context()
    names: dict[str, str] = {}
    entries: list[HeaviestMessage] = []
    for index, sized in enumerate(context.messages):
        message = sized.message
        names.update((c.id, c.name) for c in message.tool_calls)
        if message.role in _INSTRUCTIONS:
            continue
        label: str = message.role
        if message.role == "tool":
            label = f"tool: {names.get(message.tool_call_id or '', 'unknown')}"
        entries.append(
            HeaviestMessage(
                id=f"message-{index}", label=label, role=message.role, tokens=sized.tokens
            )
        )
    entries.sort(key=lambda entry: -entry.tokens)  # stable: equals keep the window's order
    return HeaviestResult(messages=entries[:limit], total_tokens=context.total_tokens)
