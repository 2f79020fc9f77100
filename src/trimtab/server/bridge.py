"""What the runtime waits for from clients: tool results, permission decisions, run ends.

A tool declared over the wire becomes a `trimtab.Tool` whose handler hands the call to the
clients (`external_tool.requested`), waits for one of them to answer
(`session.tools.handlePendingToolCall`) and says it is settled (`external_tool.completed`).
Permission requests wait the same way for `handlePendingPermissionRequest`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trimtab import PermissionDecision, Tool, ToolInvocation, ToolResult
from trimtab._runs import RunLedger
from trimtab.events import (
    Event,
    ExternalToolCompletedData,
    ExternalToolCompletedEvent,
    ExternalToolRequestedData,
    ExternalToolRequestedEvent,
    PermissionRequestData,
    PermissionRequestedEvent,
    ToolDefinition,
    new_id,
)
from trimtab.protocol.wire import HandleToolCallParams, ToolResultAnswer
from trimtab.server.hooks import Hooks

__all__ = ["Bridge", "tool_result"]


def tool_result(answer: HandleToolCallParams, name: str, arguments: Any) -> ToolResult:
    """The trimtab result of a client's answer (protocol sections 4.2 and 6e).

    A client's `error` text is never shown to the model: it sees the generic failure text the
    official runtime uses, so recordings made against it still match.
    """
    result = answer.result
    if isinstance(result, str):
        return ToolResult(text_result_for_llm=result)
    if isinstance(result, ToolResultAnswer):
        return _from_object(result)
    if answer.error is not None:
        shown = json.dumps(arguments, separators=(",", ":"))
        text = (
            f"Failed to execute `{name}` tool with arguments: {shown} "
            "due to error: Error: Tool execution failed"
        )
        return ToolResult(text_result_for_llm=text, result_type="failure", error=answer.error)
    return ToolResult(text_result_for_llm="")


def _from_object(result: ToolResultAnswer) -> ToolResult:
    kind = result.result_type or ("failure" if result.error is not None else "success")
    return ToolResult(
        text_result_for_llm=result.text_result_for_llm,
        # trimtab has no client-reported timeout outcome: it is a failure the model can read.
        result_type="failure" if kind == "timeout" else kind,
        error=result.error,
        tool_references=result.tool_references or [],
    )


@dataclass
class _PendingCall:
    tool_name: str
    future: asyncio.Future[HandleToolCallParams] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Bridge:
    """A session's open questions to its clients: external tool calls and permissions."""

    def __init__(self, session_id: str, hooks: Hooks) -> None:
        self.session_id = session_id
        self.hooks = hooks
        self.ledger = RunLedger()
        self.provided: Callable[[str], bool] = lambda name: True
        """Whether some attached client declared the tool (set by the session's owner)."""
        self._calls: dict[str, _PendingCall] = {}
        self._permissions: dict[str, asyncio.Future[PermissionDecision]] = {}

    # --- tools ---------------------------------------------------------------------------

    def tool(self, definition: ToolDefinition) -> Tool:
        """A tool whose calls are answered by a client."""

        async def handler(arguments: dict[str, Any], invocation: ToolInvocation) -> ToolResult:
            return await self._call_external(definition.name, arguments, invocation)

        return Tool(definition, handler, None)

    async def _call_external(
        self, name: str, arguments: dict[str, Any], invocation: ToolInvocation
    ) -> ToolResult:
        if not self.provided(name):
            # Its client left: nobody would ever answer.
            text = f"No connected client provides the tool '{name}'."
            return ToolResult(text_result_for_llm=text, result_type="failure")
        pre = await self.hooks.pre_tool_use(name, arguments)
        if pre.denied is not None:
            return ToolResult(text_result_for_llm=pre.denied, result_type="denied")
        arguments = pre.arguments
        request_id = new_id()
        call = self._calls[request_id] = _PendingCall(name)
        session = invocation.session
        try:
            await session.emit(
                ExternalToolRequestedEvent(
                    data=ExternalToolRequestedData(
                        request_id=request_id,
                        session_id=self.session_id,
                        tool_call_id=invocation.tool_call_id,
                        tool_name=name,
                        arguments=arguments,
                    )
                )
            )
            answer = await call.future
        finally:
            # Also on abort: the event tells clients to cancel the handler and not answer.
            del self._calls[request_id]
            completed = ExternalToolCompletedData(request_id=request_id)
            await session.emit(ExternalToolCompletedEvent(data=completed))
        return await self.hooks.post_tool_use(name, arguments, tool_result(answer, name, arguments))

    def abandon_unprovided(self) -> None:
        """Fail the pending calls of tools no attached client declares any more."""
        for request_id, call in self._calls.items():
            if not call.future.done() and not self.provided(call.tool_name):
                error = "the client that provides this tool disconnected"
                answer = HandleToolCallParams(
                    session_id=self.session_id, request_id=request_id, error=error
                )
                call.future.set_result(answer)

    def answer_tool(self, answer: HandleToolCallParams) -> bool:
        """Settle a pending external call; False if it is unknown or already settled."""
        call = self._calls.get(answer.request_id)
        if call is None or call.future.done():
            return False
        call.future.set_result(answer)
        return True

    # --- permissions ---------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """Open a pending permission request when the loop announces one."""
        if isinstance(event, PermissionRequestedEvent):
            future: asyncio.Future[PermissionDecision] = asyncio.get_running_loop().create_future()
            self._permissions[event.data.request_id] = future
        self.ledger.observe(event)

    async def ask_permission(
        self, request: PermissionRequestData, invocation: ToolInvocation
    ) -> PermissionDecision:
        """The session's permission handler: wait for a client's decision on the request the
        loop announced (`observe` saw its `permission.requested`, of the same request id)."""
        future = self._permissions.get(request.request_id or "")
        if future is None:
            return PermissionDecision(kind="user-not-available")
        try:
            return await future
        finally:
            self._permissions.pop(request.request_id or "", None)

    def answer_permission(self, request_id: str, decision: PermissionDecision) -> bool:
        """Settle a pending permission request; False if it is unknown or already settled."""
        future = self._permissions.get(request_id)
        if future is None or future.done():
            return False
        future.set_result(decision)
        return True

    def close(self, reason: Exception) -> None:
        """The session is gone: nobody may wait for it any more."""
        self.ledger.close(reason)
