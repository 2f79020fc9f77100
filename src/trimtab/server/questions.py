"""What the runtime waits for from clients: tool results, permission decisions, run ends.

A tool declared over the wire becomes an `ExternalTool`: the loop announces each call
(`external_tool.requested`), its handler here waits for a client to answer
(`session.tools.handlePendingToolCall`), and the loop settles it (`external_tool.completed`).
Permission requests wait the same way for `handlePendingPermissionRequest`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from trimtab import PermissionDecision, ToolError, ToolInvocation, ToolResult
from trimtab._runs import RunLedger
from trimtab._tools import ExternalTool
from trimtab.events import (
    Event,
    ExternalToolRequestedEvent,
    PermissionRequestData,
    PermissionRequestedEvent,
    ToolDefinition,
)
from trimtab.protocol.jsonrpc import Connection, RpcError
from trimtab.protocol.wire import HandleToolCallParams, ToolResultAnswer

__all__ = ["USER_INPUT_TIMEOUT", "ClientQuestions", "tool_result"]

USER_INPUT_TIMEOUT = 1800.0
"""Seconds `ask_user` waits for the user's answer (the run's abort ends it sooner)."""


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


class ClientQuestions:
    """A session's open questions to its clients: external tool calls and permissions."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.ledger = RunLedger()
        self.provided: Callable[[str], bool] = lambda name: True
        """Whether some attached client declared the tool (set by the session's owner)."""
        self._calls: dict[str, tuple[str, asyncio.Future[HandleToolCallParams]]] = {}
        self._requests: dict[str, ExternalToolRequestedEvent] = {}
        """The announcement of each pending call, for a client that attaches later."""
        self._permissions: dict[str, asyncio.Future[PermissionDecision]] = {}
        self.asker: Connection | None = None
        """The attached client that answers `userInput.request` (`ask_user`), if one does."""

    # --- tools ---------------------------------------------------------------------------

    def tool(self, definition: ToolDefinition) -> ExternalTool:
        """A tool whose calls a client answers (the loop announces and settles each call)."""
        name = definition.name

        async def handler(arguments: dict[str, Any], invocation: ToolInvocation) -> ToolResult:
            request_id = invocation.request_id or ""
            pending = self._calls.get(request_id)
            if pending is None:  # not announced here: nobody could answer it
                return ToolResult(text_result_for_llm="", result_type="failure")
            try:
                return tool_result(await pending[1], name, arguments)
            finally:
                self._calls.pop(request_id, None)
                self._requests.pop(request_id, None)

        return ExternalTool(definition, handler, provided=lambda: self.provided(name))

    def abandon_unprovided(self) -> None:
        """Fail the pending calls of tools no attached client declares any more."""
        for request_id, (name, answer) in self._calls.items():
            if not answer.done() and not self.provided(name):
                error = "the client that provides this tool disconnected"
                answer.set_result(
                    HandleToolCallParams(
                        session_id=self.session_id, request_id=request_id, error=error
                    )
                )

    def unanswered_tool_requests(self) -> list[ExternalToolRequestedEvent]:
        """The announcements of the external calls no client has answered yet, in order."""
        return [
            event
            for request_id, event in self._requests.items()
            if request_id in self._calls and not self._calls[request_id][1].done()
        ]

    def answer_tool(self, answer: HandleToolCallParams) -> bool:
        """Settle a pending external call; False if it is unknown or already settled."""
        pending = self._calls.get(answer.request_id)
        if pending is None or pending[1].done():
            return False
        pending[1].set_result(answer)
        return True

    # --- permissions ---------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """Open a pending question when the loop announces one: before any client hears of
        it, so that no answer can come first."""
        loop = asyncio.get_running_loop()
        if isinstance(event, PermissionRequestedEvent):
            self._permissions[event.data.request_id] = loop.create_future()
        elif isinstance(event, ExternalToolRequestedEvent):
            self._calls[event.data.request_id] = (event.data.tool_name, loop.create_future())
            self._requests[event.data.request_id] = event
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

    def abandon_permissions(self) -> None:
        """Answer every pending permission request `user-not-available` (no client is left
        to decide it)."""
        for future in self._permissions.values():
            if not future.done():
                future.set_result(PermissionDecision(kind="user-not-available"))

    # --- questions to the user ------------------------------------------------------------

    async def ask_user(
        self, question: str, choices: list[str], allow_freeform: bool
    ) -> tuple[str, bool]:
        """A client's user's answer to the model's question (`ask_user`, spec B9)."""
        peer = self.asker
        if peer is None:
            raise ToolError("No connected client answers questions to the user.")
        params = {
            "sessionId": self.session_id,
            "question": question,
            "choices": choices,
            "allowFreeform": allow_freeform,
        }
        try:
            answer = await peer.request("userInput.request", params, timeout=USER_INPUT_TIMEOUT)
        except TimeoutError:
            raise ToolError(
                f"The user did not answer within {USER_INPUT_TIMEOUT:g} seconds."
            ) from None
        except (ConnectionError, RpcError):
            raise ToolError("The client could not ask the user.") from None
        text = answer.get("answer") if isinstance(answer, dict) else None
        if not isinstance(text, str):
            raise ToolError("The client answered the question without an answer.")
        return text, bool(answer.get("wasFreeform", False))

    def close(self, reason: Exception) -> None:
        """The session is gone: nobody may wait for it any more."""
        self.ledger.close(reason)
