"""`RemoteSession`: a session that a `trimtab serve` process runs, driven over JSON-RPC.

It offers the in-process `Session` API. Events arrive as `session.event` notifications and are
parsed back into `trimtab.events` models; tools and the permission handler run here, in the
caller's process, answering the server's `external_tool.requested` and
`permission.requested` events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast, overload

from pydantic import ValidationError

from trimtab import (
    ClearContextError,
    ClearContextResult,
    CompactResult,
    PermissionDecision,
    SessionError,
    SessionNotFoundError,
    Tool,
    ToolInvocation,
    TrimtabError,
    TruncateResult,
)
from trimtab._errors import ClearContextErrorCode
from trimtab._permissions import PermissionHandlerFn, decide
from trimtab._subscribers import EventHandler, Subscribers
from trimtab._tools import CallOutcome
from trimtab.events import (
    AssistantMessageEvent,
    Event,
    EventAdapter,
    EventType,
    ExternalToolCompletedEvent,
    ExternalToolRequestedEvent,
    PermissionRequestedEvent,
    ToolOutcome,
)
from trimtab.server.rpc import INVALID_PARAMS, Connection, RpcError

__all__ = ["RemoteHistory", "RemoteSession"]

log = logging.getLogger("trimtab.remote")


_CLEAR_CODES: frozenset[str] = frozenset(
    {"no_tool_call_in_flight", "empty_prompt", "clear_pending", "remote_session"}
)
_RESULT_TYPES: dict[ToolOutcome, str] = {
    "success": "success",
    "failure": "failure",
    "invalid_arguments": "failure",
    "denied": "denied",
    "rejected": "rejected",
    "timeout": "timeout",
    "cancelled": "failure",
}
"""How a local tool outcome travels (the wire has no `invalid_arguments` nor `cancelled`)."""


def error_from_rpc(exc: RpcError) -> Exception:
    """The trimtab exception for a JSON-RPC error the server answered with."""
    data = exc.data if isinstance(exc.data, dict) else {}
    code = data.get("code")
    if code in _CLEAR_CODES:
        return ClearContextError(cast(ClearContextErrorCode, code), exc.message)
    if code == "session_not_found":
        return SessionNotFoundError(exc.message)
    if "errorType" in data:
        message = str(data.get("message", exc.message))
        return SessionError(str(data["errorType"]), message, status_code=data.get("statusCode"))
    if exc.code == INVALID_PARAMS:
        return ValueError(exc.message)
    return TrimtabError(exc.message)


class RemoteHistory:
    """`session.history` of a remote session."""

    __slots__ = ("_session",)

    def __init__(self, session: RemoteSession) -> None:
        self._session = session

    async def clear_context(self, prompt: str) -> ClearContextResult:
        """Stage a clear from a tool handler, as `History.clear_context` (spec C1-C11).

        Over the wire this is a coroutine: `await` it (the in-process result is awaitable too,
        so `await session.history.clear_context(...)` works with either).
        """
        result = await self._session._call("session.history.clearContext", {"prompt": prompt})
        return ClearContextResult(messages_cleared=result["messagesCleared"])

    async def compact(self, custom_instructions: str | None = None) -> CompactResult:
        """Summarise the older conversation, as `History.compact`."""
        params = {} if custom_instructions is None else {"customInstructions": custom_instructions}
        result = await self._session._call("session.history.compact", params)
        return CompactResult(
            success=result["success"],
            summary=result.get("summaryContent"),
            messages_removed=result.get("messagesRemoved", 0),
            tokens_removed=result.get("tokensRemoved", 0),
        )

    async def truncate(self, event_id: str) -> TruncateResult:
        """Make the window forget `event_id` and what follows, as `History.truncate`."""
        result = await self._session._call("session.history.truncate", {"eventId": event_id})
        return TruncateResult(events_removed=result["eventsRemoved"])


class _Rpc:
    __slots__ = ("history",)

    def __init__(self, history: RemoteHistory) -> None:
        self.history = history


class RemoteSession:
    """A session run by a server; create one with `RemoteClient.create_session`."""

    def __init__(
        self,
        session_id: str,
        conn: Connection,
        *,
        tools: Mapping[str, Tool],
        permission_handler: PermissionHandlerFn | None,
        on_close: Callable[[RemoteSession], None],
    ) -> None:
        self.session_id = session_id
        self.history = RemoteHistory(self)
        self.rpc = _Rpc(self.history)
        """`session.rpc.history.*`: the Copilot SDK's spelling of `session.history.*`."""
        self._conn = conn
        self._tools = dict(tools)
        self._permission_handler = permission_handler
        self._on_close = on_close
        self._subscribers = Subscribers()
        self._work: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"RemoteSession({self.session_id!r})"

    # --- public API ----------------------------------------------------------------------

    @overload
    def on(self, handler: EventHandler, /) -> Callable[[], None]: ...
    @overload
    def on(self, event_type: EventType, handler: EventHandler, /) -> Callable[[], None]: ...
    def on(
        self, first: EventType | EventHandler, handler: EventHandler | None = None, /
    ) -> Callable[[], None]:
        """Subscribe to events (all, or one type); returns a function that unsubscribes."""
        return self._subscribers.add(first, handler)

    async def send(self, prompt: str) -> str:
        """Queue `prompt` and return its message id at once, as `Session.send`."""
        result = await self._call("session.send", {"prompt": prompt})
        return str(result["messageId"])

    async def send_and_wait(
        self, prompt: str, *, timeout: float | None = None
    ) -> AssistantMessageEvent | None:
        """Send `prompt` and wait for its run to end, as `Session.send_and_wait`.

        Raises `SessionError` if the run ended in `session.error`, and `TimeoutError` after
        `timeout` seconds (the run goes on).
        """
        result = await self._call("session.sendAndWait", {"prompt": prompt}, timeout=timeout)
        response = result.get("response")
        if response is None:
            return None
        event = EventAdapter.validate_python(response)
        if not isinstance(event, AssistantMessageEvent):
            raise TrimtabError(f"the server answered with a {event.type} event")
        return event

    async def abort(self) -> None:
        """Stop the current run; its tool handlers here are cancelled too."""
        await self._call("session.abort", {})

    async def get_events(self) -> list[Event]:
        """The persisted log, oldest first."""
        result = await self._call("session.getMessages", {})
        return [EventAdapter.validate_python(event) for event in result["events"]]

    async def disconnect(self) -> None:
        """Let go of the session: the server disconnects it once no client holds it."""
        if self._closed:
            return
        try:
            if not self._conn.closed:
                await self._call("session.detach", {})
        finally:
            self._close()

    # --- from the connection -------------------------------------------------------------

    async def _call(
        self, method: str, params: dict[str, Any], *, timeout: float | None = None
    ) -> dict[str, Any]:
        try:
            result = await self._conn.request(
                method, {"sessionId": self.session_id, **params}, timeout=timeout
            )
        except RpcError as exc:
            raise error_from_rpc(exc) from None
        return result if isinstance(result, dict) else {}

    def _close(self) -> None:
        self._closed = True
        for task in self._work.values():
            task.cancel()
        self._work.clear()
        self._on_close(self)

    def _deliver(self, payload: Any) -> None:
        """One `session.event` notification: handle what is ours, then tell subscribers."""
        try:
            event = EventAdapter.validate_python(payload)
        except ValidationError:
            log.warning("skipping an event this client cannot read: %.200r", payload)
            return
        if isinstance(event, ExternalToolRequestedEvent) and event.data.tool_name in self._tools:
            self._start(event.data.request_id, self._run_tool(event))
        elif isinstance(event, ExternalToolCompletedEvent):
            task = self._work.pop(event.data.request_id, None)
            if task is not None:
                task.cancel()  # answered elsewhere, or aborted
        elif isinstance(event, PermissionRequestedEvent):
            self._start(event.data.request_id, self._decide(event))
        self._subscribers.deliver(event)

    def _start(self, request_id: str, work: Any) -> None:
        if self._closed or request_id in self._work:
            work.close()
            return
        task = asyncio.ensure_future(work)
        self._work[request_id] = task
        task.add_done_callback(lambda done: self._finished(request_id, done))

    def _finished(self, request_id: str, task: asyncio.Task[None]) -> None:
        if self._work.get(request_id) is task:
            del self._work[request_id]
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("answering %s failed: %s", request_id, exc)

    async def _run_tool(self, event: ExternalToolRequestedEvent) -> None:
        data = event.data
        tool = self._tools[data.tool_name]
        params = tool.validate(data.arguments)
        if isinstance(params, CallOutcome):  # the arguments did not validate
            outcome = params
        else:
            invocation = self._invocation(data.tool_call_id, data.tool_name, data.arguments)
            outcome = await tool.run(params, invocation)
        result: dict[str, Any] = {
            "textResultForLlm": outcome.text,
            "resultType": _RESULT_TYPES[outcome.outcome],
        }
        if outcome.references:
            result["toolReferences"] = list(outcome.references)
        await self._answer(
            "session.tools.handlePendingToolCall", {"requestId": data.request_id, "result": result}
        )

    async def _decide(self, event: PermissionRequestedEvent) -> None:
        request = event.data.permission_request
        decision = None
        if (handler := self._permission_handler) is not None:
            invocation = self._invocation(
                request.tool_call_id or "", request.tool_name, request.args
            )
            decision = await decide(handler, request, invocation)
        # Deny by default, as in process.
        decision = decision or PermissionDecision(kind="user-not-available")
        await self._answer(
            "session.permissions.handlePendingPermissionRequest",
            {
                "requestId": event.data.request_id,
                "result": decision.model_dump(exclude_none=True),
            },
        )

    async def _answer(self, method: str, params: dict[str, Any]) -> None:
        try:
            await self._call(method, params)
        except (TrimtabError, ValueError, ConnectionError) as exc:
            log.warning("%s was not accepted: %s", method, exc)

    def _invocation(self, tool_call_id: str, tool_name: str, arguments: Any) -> ToolInvocation:
        # ToolInvocation names the in-process Session; this object offers the same API
        # (history.clear_context, send, get_events...), which is all a handler uses.
        session = cast(Any, self)
        return ToolInvocation(
            session_id=self.session_id,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            arguments=arguments,
            session=session,
        )
