"""`RemoteSession`: a session that a `trimtab serve` process runs, driven over JSON-RPC.

It offers the in-process `Session` API. Events arrive as `session.event` notifications and are
parsed back into `trimtab.events` models; tools and the permission handler run here, in the
caller's process, answering the server's `external_tool.requested` and
`permission.requested` events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, Unpack, cast, overload

from pydantic import BaseModel, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from trimtab import (
    ClearContextResult,
    CompactResult,
    PermissionDecision,
    Tool,
    ToolInvocation,
    TrimtabError,
    TruncateResult,
)
from trimtab._durations import check_seconds
from trimtab._output import value_of
from trimtab._permissions import PermissionHandlerFn, decide
from trimtab._runs import results_of
from trimtab._subscribers import EventHandler, Subscribers
from trimtab._tools import CallOutcome
from trimtab._tracing import outgoing, remote_parent
from trimtab.events import (
    AssistantMessageEvent,
    Budget,
    Event,
    EventAdapter,
    EventType,
    ExternalToolCompletedEvent,
    ExternalToolRequestedEvent,
    Image,
    PermissionRequestedEvent,
    ToolOutcome,
)
from trimtab.protocol.errors import error_from_rpc
from trimtab.protocol.jsonrpc import Connection, RpcError
from trimtab.protocol.wire import (
    BlobAttachment,
    ClearContextParams,
    ClearContextResultWire,
    CompactParams,
    CompactResultWire,
    EventsResult,
    HandlePermissionParams,
    HandleToolCallParams,
    PermissionAnswer,
    ResultType,
    SendAndWaitResult,
    SendParams,
    SendResult,
    SessionParams,
    SuccessResult,
    ToolResultAnswer,
    TruncateParams,
    TruncateResultWire,
    UpdateOptionsParams,
    dump,
)

__all__ = ["RemoteHistory", "RemoteSession"]

log = logging.getLogger("trimtab.remote")

_Result = TypeVar("_Result", bound=BaseModel)
_T = TypeVar("_T")

_RESULT_TYPES: dict[ToolOutcome, ResultType] = {
    "success": "success",
    "failure": "failure",
    "invalid_arguments": "failure",
    "denied": "denied",
    "rejected": "rejected",
    "timeout": "timeout",
    "cancelled": "failure",
}
"""How a local tool outcome travels (the wire has no `invalid_arguments` nor `cancelled`)."""


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
        session = self._session
        params = ClearContextParams(session_id=session.session_id, prompt=prompt)
        result = await session._call("session.history.clearContext", params, ClearContextResultWire)
        return ClearContextResult(messages_cleared=result.messages_cleared)

    async def compact(self, custom_instructions: str | None = None) -> CompactResult:
        """Summarise the older conversation, as `History.compact`."""
        session = self._session
        params = CompactParams(
            session_id=session.session_id, custom_instructions=custom_instructions
        )
        result = await session._call("session.history.compact", params, CompactResultWire)
        return CompactResult(
            success=result.success,
            summary=result.summary_content,
            messages_removed=result.messages_removed,
            tokens_removed=result.tokens_removed,
        )

    async def truncate(self, event_id: str) -> TruncateResult:
        """Make the window forget `event_id` and what follows, as `History.truncate`."""
        session = self._session
        params = TruncateParams(session_id=session.session_id, event_id=event_id)
        result = await session._call("session.history.truncate", params, TruncateResultWire)
        return TruncateResult(events_removed=result.events_removed)


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

    async def send(
        self,
        prompt: str,
        *,
        request_headers: Mapping[str, str] | None = None,
        images: Sequence[Image | Mapping[str, str]] = (),
        attachments: Sequence[Mapping[str, Any]] = (),
        mode: Literal["enqueue", "immediate"] = "enqueue",
        output_type: Any = None,
        output_schema: Mapping[str, Any] | None = None,
        max_invalid_outputs: int | None = None,
        budget: Budget | Mapping[str, Any] | None = None,
    ) -> str:
        """Queue `prompt` and return its message id at once, as `Session.send` (`mode`:
        spec X6).

        `attachments` are the Copilot protocol's (`{"type": "file", "path": ...}`, a
        `directory`, a `selection` or a `blob`): the server reads them and puts their text
        after the prompt (spec D11), where an in-process session only records its own.
        `output_type` goes as its JSON Schema: the server checks results against it
        (spec OUT7); `output` reads the result back as an `output_type`.
        """
        params = self._send_params(
            prompt,
            request_headers,
            images,
            attachments,
            _schema(output_type, output_schema),
            max_invalid_outputs,
            budget,
            mode,
        )
        return (await self._call("session.send", params, SendResult)).message_id

    @overload
    async def send_and_wait(
        self,
        prompt: str,
        *,
        output_type: None = None,
        output_schema: None = None,
        timeout: float | None = None,
        **options: Unpack[RemoteSendOptions],
    ) -> AssistantMessageEvent | None: ...
    @overload
    async def send_and_wait(
        self,
        prompt: str,
        *,
        output_type: type[_T],
        output_schema: None = None,
        timeout: float | None = None,
        **options: Unpack[RemoteSendOptions],
    ) -> _T: ...
    @overload
    async def send_and_wait(
        self,
        prompt: str,
        *,
        output_type: None = None,
        output_schema: Mapping[str, Any],
        timeout: float | None = None,
        **options: Unpack[RemoteSendOptions],
    ) -> Any: ...
    async def send_and_wait(
        self,
        prompt: str,
        *,
        output_type: Any = None,
        output_schema: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **options: Unpack[RemoteSendOptions],
    ) -> Any:
        """Send `prompt` and wait for its run to end, as `Session.send_and_wait`: with
        `output_type` (or `output_schema`), its typed result.

        Raises `SessionError` if the run ended in `session.error`, and `TimeoutError` after
        `timeout` seconds (the run goes on).
        """
        check_seconds("timeout", timeout, bounded=False)  # before anything is sent
        schema = _schema(output_type, output_schema)
        params = self._send_params(
            prompt,
            options.get("request_headers"),
            options.get("images", ()),
            options.get("attachments", ()),
            schema,
            options.get("max_invalid_outputs"),
            options.get("budget"),
            options.get("mode", "enqueue"),
        )
        result = await self._call("session.sendAndWait", params, SendAndWaitResult, timeout=timeout)
        if schema is not None:
            if result.output is None:
                why = "it was aborted" if result.aborted else "no result was given"
                raise TrimtabError(f"the run ended without a result: {why}")
            return (
                result.output.value if output_type is None else value_of(output_type, result.output)
            )
        if result.response is None:
            return None
        event = EventAdapter.validate_python(result.response)
        if not isinstance(event, AssistantMessageEvent):
            raise TrimtabError(f"the server answered with a {event.type} event")
        return event

    async def output(self, message_id: str | None = None, *, output_type: Any = None) -> Any:
        """The typed result of the run of `message_id` (the latest when None), read from the
        session's log, as `Session.output`."""
        found = results_of(await self.get_events())
        key = message_id if message_id is not None else next(reversed(found), None)
        if key is None or key not in found:
            raise LookupError(f"no result of the run of {message_id or 'any message'}")
        return found[key].value if output_type is None else value_of(output_type, found[key])

    async def set_budget(self, budget: Budget | Mapping[str, Any] | None) -> None:
        """Set what the whole session may spend, as `Session.set_budget` (spec U6)."""
        try:
            checked = None if budget is None else Budget.model_validate(budget)
        except ValidationError as exc:
            raise ValueError(f"invalid budget: {exc}") from None
        params = UpdateOptionsParams(session_id=self.session_id, budget=checked)
        answer = {**dump(params), "budget": dump(checked) if checked is not None else None}
        try:
            result = await self._conn.request("session.options.update", answer)
        except RpcError as exc:
            raise error_from_rpc(exc) from None
        if not SuccessResult.model_validate(result).success:
            raise TrimtabError("the server did not take the budget")

    def _send_params(
        self,
        prompt: str,
        request_headers: Mapping[str, str] | None,
        images: Sequence[Image | Mapping[str, str]],
        attachments: Sequence[Mapping[str, Any]],
        output_schema: dict[str, Any] | None = None,
        max_invalid_outputs: int | None = None,
        budget: Budget | Mapping[str, Any] | None = None,
        mode: Literal["enqueue", "immediate"] = "enqueue",
    ) -> SendParams:
        """A send on the wire: its images as blob attachments (spec D14), its attachments
        checked here as the server checks them (D11: a bad one is a `ValueError` and nothing
        is sent), its headers as `requestHeaders` (D9), its typed result's schema and its
        budget as trimtab's `outputSchema` and `budget` (OUT7, U6), a steering message's
        `mode` (X6; the default is left out, as the official client leaves it)."""
        blobs: list[Any] = [
            BlobAttachment(type="blob", data=image.data, mime_type=image.mime_type)
            for image in (Image.model_validate(i) for i in images)
        ]
        try:
            return SendParams(
                session_id=self.session_id,
                prompt=prompt,
                attachments=[*blobs, *attachments] or None,
                request_headers=dict(request_headers) if request_headers else None,
                output_schema=output_schema,
                max_invalid_outputs=max_invalid_outputs,
                budget=budget,
                mode=None if mode == "enqueue" else mode,
                **outgoing(),
            )
        except ValidationError as exc:
            raise ValueError(f"invalid send: {exc}") from None

    async def abort(self) -> None:
        """Stop the current run; its tool handlers here are cancelled too."""
        await self._call("session.abort", SessionParams(session_id=self.session_id))

    async def get_events(self) -> list[Event]:
        """The persisted log, oldest first."""
        params = SessionParams(session_id=self.session_id)
        result = await self._call("session.getMessages", params, EventsResult)
        return [EventAdapter.validate_python(event) for event in result.events]

    async def disconnect(self) -> None:
        """Let go of the session: the server disconnects it once no client holds it."""
        if self._closed:
            return
        try:
            if not self._conn.closed:
                await self._call("session.detach", SessionParams(session_id=self.session_id))
        finally:
            self._close()

    # --- from the connection -------------------------------------------------------------

    @overload
    async def _call(
        self, method: str, params: BaseModel, result: type[_Result], *, timeout: float | None = None
    ) -> _Result: ...
    @overload
    async def _call(
        self, method: str, params: BaseModel, result: None = None, *, timeout: float | None = None
    ) -> None: ...
    async def _call(
        self,
        method: str,
        params: BaseModel,
        result: type[_Result] | None = None,
        *,
        timeout: float | None = None,
    ) -> _Result | None:
        """One request with its params model; the answer as its result model."""
        try:
            answer = await self._conn.request(method, dump(params), timeout=timeout)
        except RpcError as exc:
            raise error_from_rpc(exc) from None
        return None if result is None else result.model_validate(answer)

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
            # In the call's trace context: the handler's spans nest under its span (OT5).
            with remote_parent(data.traceparent, data.tracestate):
                outcome = await tool.run(params, invocation)
        result = ToolResultAnswer(
            text_result_for_llm=outcome.text,
            result_type=_RESULT_TYPES[outcome.outcome],
            tool_references=list(outcome.references) or None,
        )
        await self._answer(
            "session.tools.handlePendingToolCall",
            HandleToolCallParams(
                session_id=self.session_id, request_id=data.request_id, result=result
            ),
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
            HandlePermissionParams(
                session_id=self.session_id,
                request_id=event.data.request_id,
                result=PermissionAnswer(kind=decision.kind, feedback=decision.feedback),
            ),
        )

    async def _answer(self, method: str, params: BaseModel) -> None:
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


class RemoteSendOptions(TypedDict, total=False):
    """What `RemoteSession.send` takes beside its prompt and its output type."""

    request_headers: Mapping[str, str] | None
    images: Sequence[Image | Mapping[str, str]]
    attachments: Sequence[Mapping[str, Any]]
    mode: Literal["enqueue", "immediate"]
    max_invalid_outputs: int | None
    budget: Budget | Mapping[str, Any] | None


def _schema(output_type: Any, output_schema: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The JSON Schema a send's typed result goes with: `output_schema`, or `output_type`'s."""
    if output_type is not None and output_schema is not None:
        raise ValueError("give output_type or output_schema, not both")
    if output_schema is not None:
        return dict(output_schema)
    if output_type is None:
        return None
    try:
        return TypeAdapter(output_type).json_schema()
    except Exception as exc:
        raise TypeError(f"output_type {output_type!r} has no JSON Schema: {exc}") from None
