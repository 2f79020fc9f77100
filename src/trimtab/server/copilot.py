"""The Copilot SDK protocol on one connection: its method table, mapped onto trimtab sessions.

Each method validates its params with one wire model, calls the runtime, and returns a result
model. Runtime exceptions become JSON-RPC errors in one place (`CopilotConnection.dispatch`),
so a method body reads as the mapping it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from trimtab import (
    PermissionDecision,
    SessionError,
    SessionNotFoundError,
    __version__,
)
from trimtab._tracing import remote_parent
from trimtab.protocol.errors import AUTHENTICATION_FAILED, rpc_error
from trimtab.protocol.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND, Connection, Params, RpcError
from trimtab.protocol.wire import (
    PROTOCOL_VERSION,
    ClearContextParams,
    ClearContextResultWire,
    CompactParams,
    CompactResultWire,
    ConnectParams,
    ConnectResult,
    CreateParams,
    EventsResult,
    HandlePermissionParams,
    HandleToolCallParams,
    PingParams,
    ResumeParams,
    SendAndWaitResult,
    SendParams,
    SendResult,
    SessionIdResult,
    SessionListResult,
    SessionMetadata,
    SessionParams,
    SuccessResult,
    TruncateParams,
    TruncateResultWire,
    dump,
    event_payload,
    metadata_of,
)
from trimtab.server.attachments import with_attachments
from trimtab.server.auth import Credentials, Identity
from trimtab.server.hub import SessionHub, SharedSession
from trimtab.store import SessionRecord

__all__ = ["CANCELLABLE", "CopilotConnection"]

UNAUTHENTICATED_FRAME = 64 * 1024
"""The largest frame read from a client before it has presented the token."""

CANCELLABLE = frozenset({"session.sendAndWait"})
"""Requests a `$/cancelRequest` may cancel: only waiting, which is safe to stop halfway."""

Method = Callable[[dict[str, Any]], Awaitable[BaseModel | dict[str, Any] | str | None]]


class CopilotConnection:
    """Serves the Copilot protocol to one client.

    Args:
        conn: The JSON-RPC connection.
        hub: The server's open sessions.
        credentials: The tokens a client may present in `connect`, and who each stands for
            (spec S10, S16); without any, every client is the same one.
        connect_timeout: Seconds a client has to present the token before the connection is
            closed (with a token only); None: no limit.
        idle_timeout: Seconds a connection may stay idle (no frame from the client, no
            request in flight, no session attached) before it is closed; None: no limit.
    """

    def __init__(
        self,
        conn: Connection,
        hub: SessionHub,
        *,
        credentials: Credentials,
        connect_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        self._conn = conn
        self._hub = hub
        self._credentials = credentials
        self._identity: Identity | None = credentials.identify(None)
        """Who the client is, once it presented its token (at once, without tokens)."""
        self._max_frame = conn.max_frame
        if not self._authenticated:
            # Parsing a frame costs many times its size (tiny objects): a client that has
            # not presented the token gets no more than a `connect` needs.
            conn.max_frame = min(conn.max_frame, UNAUTHENTICATED_FRAME)
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._methods: dict[str, Method] = {
            "connect": self._connect,
            "ping": self._ping,
            "status.get": self._status,
            "auth.getStatus": self._auth_status,
            "models.list": self._models,
            "runtime.shutdown": self._shutdown,
            "session.create": self._create,
            "session.resume": self._resume,
            "session.send": self._send,
            "session.sendAndWait": self._send_and_wait,
            "session.abort": self._abort,
            "session.detach": self._detach,
            "session.destroy": self._detach,
            "session.getMessages": self._get_messages,
            "session.list": self._list,
            "session.getMetadata": self._get_metadata,
            "session.getLastId": self._get_last_id,
            "session.delete": self._delete,
            "session.history.clearContext": self._clear_context,
            "session.history.truncate": self._truncate,
            "session.history.compact": self._compact,
            "session.tools.handlePendingToolCall": self._handle_tool_call,
            "session.permissions.handlePendingPermissionRequest": self._handle_permission,
        }
        self._session_rpcs = False
        """Whether the session RPCs of section K joined the table (on the first call of one)."""

    @property
    def peer(self) -> str:
        """The client's address, for logs."""
        return self._conn.peer

    @property
    def _authenticated(self) -> bool:
        return self._identity is not None

    @property
    def _who(self) -> Identity:
        """Who the client is; every method but `connect` runs after it said so."""
        assert self._identity is not None
        return self._identity

    async def serve(self) -> None:
        """Serve until the client goes away, then let go of its sessions."""
        watchdog = asyncio.get_running_loop().create_task(self._watch())
        if self._identity is not None:
            self._hub.join(self._conn, self._identity)  # else once it presents its token
        try:
            await self._conn.run(self.dispatch)
        finally:
            watchdog.cancel()
            self._hub.leave(self._conn)
            # A dropped connection may come back (here or on another server): runs it
            # started finish first, so that a reconnecting client finds them complete.
            await self._hub.release_all(self._conn, linger=True)

    async def _watch(self) -> None:
        """Close the connection once its client failed to authenticate in time, or idled."""
        if not self._authenticated and self._connect_timeout is not None:
            await asyncio.sleep(self._connect_timeout)
            if not self._authenticated:
                self._conn.abort(f"no valid connect within {self._connect_timeout:g} s")
                return
        limit = self._idle_timeout
        if limit is None:
            return
        while not self._conn.closed:
            # A session attached keeps the connection: its client may wait hours for input.
            idle = 0.0 if self._hub.attached(self._conn) else self._conn.idle_seconds()
            if idle >= limit:
                self._conn.abort(f"idle for {limit:g} s")
                return
            await asyncio.sleep(limit - idle)

    async def dispatch(self, method: str, params: Params) -> Any:
        """Run one method; every runtime failure becomes a JSON-RPC error."""
        if not self._authenticated and method != "connect":
            raise _auth_failed()
        handler = self._methods.get(method)
        if handler is None and not self._session_rpcs:
            # Loaded on demand: a client that only sends never calls one, and their wire
            # models cost a server's start-up (docs/performance.md, server RSS and readiness).
            from trimtab.server.session_rpc import session_methods

            self._methods.update(session_methods(self._hub, self._conn))
            self._session_rpcs = True
            handler = self._methods.get(method)
        if handler is None:
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: expected an object")
        try:
            result = await handler(params)
        except Exception as exc:
            error = rpc_error(exc)
            if error is None:
                raise
            raise error from None
        return dump(result) if isinstance(result, BaseModel) else result

    # --- connection --------------------------------------------------------------------

    async def _connect(self, params: dict[str, Any]) -> ConnectResult:
        given = ConnectParams.model_validate(params).token
        if self._credentials.required:
            identity = self._credentials.identify(given)
            if identity is None:
                raise _auth_failed()
            if self._identity is None:
                self._identity = identity
                self._conn.max_frame = self._max_frame
                self._hub.join(self._conn, identity)
            elif identity != self._identity:
                # One connection is one client: its sessions are those of its first token.
                raise _auth_failed()
        return ConnectResult(version=__version__)

    async def _ping(self, params: dict[str, Any]) -> dict[str, Any]:
        message = PingParams.model_validate(params).message
        return {
            "message": f"pong: {'' if message is None else message}",
            "timestamp": datetime.now(UTC).isoformat(),
            "protocolVersion": PROTOCOL_VERSION,
        }

    async def _status(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"version": __version__, "protocolVersion": PROTOCOL_VERSION}

    async def _auth_status(self, params: dict[str, Any]) -> dict[str, Any]:
        # trimtab signs in to nothing: each session brings its own (BYOK) provider.
        return {"isAuthenticated": True, "statusMessage": "trimtab: sessions bring a provider"}

    async def _models(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"models": []}

    async def _shutdown(self, params: dict[str, Any]) -> None:
        # Answered after cleanup, as the protocol asks. Only this client's sessions are let
        # go: a TCP server may serve others. A stdio server ends when its stdin closes.
        await self._hub.release_all(self._conn)

    # --- sessions ------------------------------------------------------------------------

    def _session(self, params: dict[str, Any]) -> SharedSession:
        return self._hub.get(self._conn, SessionParams.model_validate(params).session_id)

    async def _create(self, params: dict[str, Any]) -> SessionIdResult:
        request = CreateParams.model_validate(params)
        shared = await self._hub.open(self._conn, request, resume=False, identity=self._who)
        return SessionIdResult(session_id=shared.session_id)

    async def _resume(self, params: dict[str, Any]) -> SessionIdResult:
        request = ResumeParams.model_validate(params)
        shared = await self._hub.open(self._conn, request, resume=True, identity=self._who)
        return SessionIdResult(session_id=shared.session_id)

    async def _send(self, params: dict[str, Any]) -> SendResult:
        _, message_id = await self._submit(params)
        return SendResult(message_id=message_id)

    async def _send_and_wait(self, params: dict[str, Any]) -> SendAndWaitResult:
        # On a remote session the owner runs it; the ledger follows its events from here.
        shared, message_id = await self._submit(params)
        run = await shared.questions.ledger.wait(message_id)
        idle = run.idle.id if run.idle is not None else None
        if run.error is not None:
            data = run.error.data
            error = rpc_error(
                SessionError(data.error_type, data.message, status_code=data.status_code)
            )
            assert error is not None and isinstance(error.data, dict)
            error.data["completionEventId"] = idle  # the client waits for that event too
            raise error
        return SendAndWaitResult(
            aborted=bool(run.idle is not None and run.idle.data.aborted),
            message_id=message_id,
            completion_event_id=idle,
            response=event_payload(run.last_message) if run.last_message is not None else None,
            output=run.output,
        )

    async def _submit(self, params: dict[str, Any]) -> tuple[SharedSession, str]:
        """Send the prompt with its attachments and request headers, in the client's trace
        context when it sent one (spec OT5)."""
        request = SendParams.model_validate(params)
        shared = self._hub.get(self._conn, request.session_id)
        composed = await with_attachments(
            request.prompt, request.attachments or [], opener=self._hub.policy.open
        )
        with remote_parent(request.traceparent, request.tracestate):
            message_id = await shared.session.send(
                composed.prompt,
                request_headers=request.request_headers,
                images=composed.images,
                attachments=composed.attachments,
                mode=request.mode or "enqueue",
                **request.run_options(),
            )
        return shared, message_id

    async def _abort(self, params: dict[str, Any]) -> dict[str, Any]:
        await self._session(params).session.abort()
        return {}

    async def _detach(self, params: dict[str, Any]) -> SuccessResult:
        session_id = SessionParams.model_validate(params).session_id
        await self._hub.release(self._conn, session_id)
        return SuccessResult(success=True)

    async def _get_messages(self, params: dict[str, Any]) -> EventsResult:
        events = await self._session(params).session.get_events()
        return EventsResult(events=[event_payload(e) for e in events])

    async def _list(self, params: dict[str, Any]) -> SessionListResult:
        return SessionListResult(sessions=await self._metadata())

    async def _get_metadata(self, params: dict[str, Any]) -> dict[str, Any]:
        session_id = SessionParams.model_validate(params).session_id
        try:
            record = await self._hub.client.get_session_record(session_id)
        except SessionNotFoundError:
            return {}
        if not self._who.sees(record.owner):
            return {}  # as for a session not stored (spec S16)
        return {"session": dump(self._metadata_of(record))}

    async def _get_last_id(self, params: dict[str, Any]) -> SessionIdResult:
        sessions = await self._metadata()
        return SessionIdResult(session_id=sessions[0].session_id if sessions else None)

    async def _metadata(self) -> list[SessionMetadata]:
        """Every stored session the client sees, most recently active first."""
        records = await self._hub.client.list_sessions()
        return [self._metadata_of(r) for r in records if self._who.sees(r.owner)]

    def _metadata_of(self, record: SessionRecord) -> SessionMetadata:
        # Remote: run by another runtime sharing the store (spec R1).
        remote = record.lease_owner is not None and not self._hub.runs(record.session_id)
        return metadata_of(record, is_remote=remote)

    async def _delete(self, params: dict[str, Any]) -> SuccessResult:
        session_id = SessionParams.model_validate(params).session_id
        try:
            await self._hub.delete(session_id, self._who)
        except SessionNotFoundError as exc:
            return SuccessResult(success=False, error=str(exc))
        return SuccessResult(success=True)

    # --- history -------------------------------------------------------------------------

    async def _clear_context(self, params: dict[str, Any]) -> ClearContextResultWire:
        request = ClearContextParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        # From this request's task, outside any handler's context: the core picks the
        # session's earliest tool call in flight as the enclosing one (spec C1).
        result = session.history.clear_context(request.prompt)
        return ClearContextResultWire(messages_cleared=result.messages_cleared)

    async def _truncate(self, params: dict[str, Any]) -> TruncateResultWire:
        request = TruncateParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        result = await session.history.truncate(request.event_id)
        return TruncateResultWire(events_removed=result.events_removed)

    async def _compact(self, params: dict[str, Any]) -> CompactResultWire:
        request = CompactParams.model_validate(params)
        session = self._hub.get(self._conn, request.session_id).session
        result = await session.history.compact(request.custom_instructions)
        return CompactResultWire(
            success=result.success,
            messages_removed=result.messages_removed,
            tokens_removed=result.tokens_removed,
            summary_content=result.summary,
        )

    # --- answers to the runtime's questions ----------------------------------------------

    async def _handle_tool_call(self, params: dict[str, Any]) -> SuccessResult:
        answer = HandleToolCallParams.model_validate(params)
        shared = self._hub.get(self._conn, answer.session_id)
        return SuccessResult(success=shared.questions.answer_tool(answer))

    async def _handle_permission(self, params: dict[str, Any]) -> SuccessResult:
        answer = HandlePermissionParams.model_validate(params)
        shared = self._hub.get(self._conn, answer.session_id)
        decision = PermissionDecision(kind=answer.result.kind, feedback=answer.result.feedback)
        return SuccessResult(
            success=shared.questions.answer_permission(answer.request_id, decision)
        )


def _auth_failed() -> RpcError:
    return RpcError(
        AUTHENTICATION_FAILED, "AUTHENTICATION_FAILED: missing or wrong connection token"
    )
