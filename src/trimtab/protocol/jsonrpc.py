"""A JSON-RPC 2.0 connection over framed streams, usable from either end.

Every inbound request runs on its own task, so a request that waits (a tool call pending on
the client) never blocks the reader: the client may call back into the server meanwhile
(spec C11). Outbound frames go through one queue and one writer task, so notifications keep
the order in which they were produced and frames never interleave. Requests this side sends
use integer ids, which the official clients need to honour `$/cancelRequest`.

A connection can be bounded for a peer that is not trusted to behave: the bytes queued for it
and not yet sent (`max_output`: past it, the peer is cut off), the requests it has in flight
(`max_requests`: more are refused with `TOO_MANY_REQUESTS`), and how long one of its frames
may take (`frame_timeout`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from trimtab.protocol.framing import MAX_FRAME, FramingError, encode_frame, read_frame

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "REQUEST_CANCELLED",
    "TOO_MANY_REQUESTS",
    "Connection",
    "Dispatch",
    "Notify",
    "Params",
    "RpcError",
]

log = logging.getLogger("trimtab.server")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
TOO_MANY_REQUESTS = -32004
"""A request beyond the connection's `max_requests` in flight: refused, not queued."""

Params = dict[str, Any] | list[Any]
"""Structured params: by name (the Copilot protocol always) or by position."""
Dispatch = Callable[[str, Params], Awaitable[Any]]
"""`dispatch(method, params) -> result`; raises `RpcError` to answer with an error."""
Notify = Callable[[str, Params], None]
"""`on_notification(method, params)`: called inline, so notifications keep their order."""

_ABSENT = object()
_FLUSH_TIMEOUT = 5.0


class RpcError(Exception):
    """A JSON-RPC error: raised by a dispatcher to answer with it, or by `request` when the
    peer answered with one."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"JSON-RPC error {code}: {message}")
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        """The `error` member of a response."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class Connection:
    """One JSON-RPC peer over an asyncio stream pair.

    Args:
        reader: The stream frames arrive on.
        writer: The stream frames leave on.
        cancellable: Methods whose running request a `$/cancelRequest` may cancel. Others run
            to completion: cancelling a handler halfway could leave work half done.
        max_frame: The largest frame body accepted.
        max_output: Bytes of frames queued for the peer behind the one being written beyond
            which the connection is closed (a peer that stopped reading); None: no limit. A
            single frame is always queued when nothing else waits, however large, so at most
            two frames and this many bytes are held.
        max_requests: The peer's requests that may run at once; more are answered with
            `TOO_MANY_REQUESTS`. None: no limit.
        frame_timeout: Seconds a frame's header may take once it has begun, and the longest
            pause inside its body (see `read_frame`); None: no limit.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        cancellable: Collection[str] = (),
        max_frame: int = MAX_FRAME,
        max_output: int | None = None,
        max_requests: int | None = None,
        frame_timeout: float | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._cancellable = frozenset(cancellable)
        self.max_frame = max_frame
        """The largest frame body accepted from now on (a server lowers it until the peer
        has authenticated)."""
        self._max_output = max_output
        self._max_requests = max_requests
        self._frame_timeout = frame_timeout
        self._outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._sizes: deque[int] = deque()
        """The sizes of the frames not yet written, the one being written first."""
        self._queued = 0
        """Their total, but for the first: a peer's own large message, echoed to it, takes a
        while to read without the peer having stopped."""
        self._last_active = asyncio.get_running_loop().time()
        self.peer = _peer_name(writer)
        """The peer's address, for logs."""
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._requests = 0
        """The peer's requests in flight (a batch's each count)."""
        self._by_id: dict[str, asyncio.Task[None]] = {}
        self._cancelled: set[asyncio.Task[None]] = set()
        self._dispatch: Dispatch | None = None
        self._on_notification: Notify | None = None
        self._closed = False

    @property
    def awaiting_answers(self) -> bool:
        """Whether a request sent on this connection still waits for its answer."""
        return bool(self._pending)

    @property
    def closed(self) -> bool:
        """True once the connection has stopped reading; nothing more is sent."""
        return self._closed

    def idle_seconds(self) -> float:
        """Seconds since the peer last sent a frame or a request of either side ended; 0
        while a request is in flight."""
        if self._tasks or self._pending:
            return 0.0
        return asyncio.get_running_loop().time() - self._last_active

    def abort(self, reason: str, *, level: int = logging.INFO) -> None:
        """Drop the connection now, without flushing: what is queued is discarded. One line
        at `level` says why."""
        if self._closed:
            return
        log.log(level, "closing the connection of %s: %s", self.peer, reason)
        self._closed = True
        self._writer.transport.abort()
        # Reading stops too (a pipe's reading end is not the transport just aborted).
        self._reader.set_exception(ConnectionAbortedError(reason))

    # --- sending -------------------------------------------------------------------------

    def notify(self, method: str, params: Params) -> None:
        """Queue a notification; silently dropped once the connection is closed."""
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def request(self, method: str, params: Params, *, timeout: float | None = None) -> Any:
        """Send a request to the peer and wait for its result.

        Raises:
            RpcError: The peer answered with an error.
            ConnectionError: The connection closed before the answer came.
            TimeoutError: No answer within `timeout` seconds.
        """
        if self._closed:
            raise ConnectionError("the connection is closed")
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        try:
            return await asyncio.wait_for(future, timeout)
        except (TimeoutError, asyncio.CancelledError):
            # The answer is no longer wanted: let the peer stop working on it.
            self.notify("$/cancelRequest", {"id": request_id})
            raise
        finally:
            self._pending.pop(request_id, None)

    def _send(self, message: dict[str, Any] | list[dict[str, Any]]) -> None:
        if self._closed:
            return
        try:
            body = _encode(message)
        except (TypeError, ValueError, RecursionError) as exc:
            if not (isinstance(message, dict) and "result" in message):
                log.exception("dropping a message that is not JSON-serialisable")
                return
            # A result we cannot encode still gets an answer, or the peer would wait forever.
            error = RpcError(INTERNAL_ERROR, f"Internal error: unserialisable result: {exc}")
            body = _encode(_error_response(_valid_id(message), error))
        frame = encode_frame(body)
        if not self._sizes and self._takes_more():
            # Nothing waits ahead of it: straight to the transport, and so to the kernel's
            # buffer. Left for the writer's next turn of the loop instead, the frames of many
            # turns in flight would pile up here between two of its turns.
            self._writer.write(frame)
            return
        limit = self._max_output
        if self._sizes:  # behind another
            if limit is not None and self._queued + len(frame) > limit:
                reason = f"it left more than {limit} bytes of output unread"
                self.abort(reason, level=logging.WARNING)
                return
            self._queued += len(frame)
        self._sizes.append(len(frame))
        self._outgoing.put_nowait(frame)

    def _takes_more(self) -> bool:
        """Whether the transport takes a frame without passing its high-water mark (where
        the writer would wait to drain)."""
        transport = self._writer.transport
        high = transport.get_write_buffer_limits()[1]
        return not transport.is_closing() and transport.get_write_buffer_size() < high

    async def _write_loop(self) -> None:
        while (frame := await self._outgoing.get()) is not None:
            try:
                self._writer.write(frame)
                await self._writer.drain()
            except (ConnectionError, OSError):
                return  # the peer is gone; the reader will see the end of the stream too
            self._sizes.popleft()
            if self._sizes:
                self._queued -= self._sizes[0]  # the next one is first now

    # --- receiving -----------------------------------------------------------------------

    async def run(self, dispatch: Dispatch, *, on_notification: Notify | None = None) -> None:
        """Serve the connection until the peer closes it or breaks the framing, then close.

        Requests go to `dispatch`, each on its own task. Notifications go to
        `on_notification` in arrival order when it is given, else to `dispatch` as well.
        Cancelling `run` closes the connection after flushing what was already queued.
        """
        self._dispatch = dispatch
        self._on_notification = on_notification
        writer = asyncio.get_running_loop().create_task(self._write_loop())
        try:
            await self._read_loop()
        finally:
            await self._shut_down(writer)

    async def _read_loop(self) -> None:
        while True:
            try:
                body = await read_frame(
                    self._reader, max_size=lambda: self.max_frame, timeout=self._frame_timeout
                )
            except FramingError as exc:
                # Without a trustworthy length the stream cannot be resynchronised.
                self._send(_error_response(None, RpcError(PARSE_ERROR, f"Parse error: {exc}")))
                return
            except (ConnectionError, OSError):
                return
            if body is None:
                return
            self._receive(body)

    async def _shut_down(self, writer: asyncio.Task[None]) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the connection closed"))
        self._outgoing.put_nowait(None)
        try:
            await asyncio.wait_for(writer, _FLUSH_TIMEOUT)
        except TimeoutError:
            pass  # a peer that stopped reading must not hold the server
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    def _receive(self, body: bytes) -> None:
        self._last_active = asyncio.get_running_loop().time()
        try:
            # UTF-8, as the protocol is (`json.loads` of bytes would take UTF-16 and UTF-32).
            text = body.decode()
            message = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
        except (UnicodeDecodeError, ValueError) as exc:
            self._send(_error_response(None, RpcError(PARSE_ERROR, f"Parse error: {exc}")))
            return
        except RecursionError:
            error = RpcError(PARSE_ERROR, "Parse error: the JSON is nested too deeply")
            self._send(_error_response(None, error))
            return
        if isinstance(message, dict) and _is_response(message):
            self._settle(message)
            return
        if _is_notification(message) and message["method"] == "$/cancelRequest":
            self._cancel_request(message.get("params"))
            return
        if self._on_notification is not None and _is_notification(message):
            try:
                self._on_notification(message["method"], message.get("params", {}))
            except Exception:
                log.exception("notification %s failed", message["method"])
            return
        if self._over_limit(message):
            return
        if isinstance(message, list):
            if not message:
                error = RpcError(INVALID_REQUEST, "Invalid Request: empty batch")
                self._send(_error_response(None, error))
            else:
                self._spawn(self._answer_batch(message), None, len(message))
            return
        key = None
        if isinstance(message, dict) and message.get("method") in self._cancellable:
            key = _id_key(message.get("id"))
        try:
            method, params, request_id = _parse_request(message)
        except RpcError as exc:
            self._send(_error_response(_valid_id(message), exc))
            return
        # The request's parts, not the message: it is not kept while the request runs (a
        # thousand sessions' `sendAndWait` at once).
        self._spawn(self._answer_single(method, params, request_id), key, 1)

    def _over_limit(self, message: Any) -> bool:
        """Refuse a request (or batch) beyond `max_requests`, rather than queue it: a peer that
        sends faster than it is answered must not grow the server without bound."""
        limit = self._max_requests
        # A batch's requests count one by one: batches must not multiply the limit.
        if limit is None or self._requests + _size(message) <= limit:
            return False
        if not _is_notification(message):
            error = RpcError(TOO_MANY_REQUESTS, f"Too many requests: more than {limit} at once")
            self._send(_error_response(_valid_id(message), error))
        return True

    def _spawn(self, work: Awaitable[None], key: str | None, requests: int) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        self._requests += requests
        if key is not None:
            self._by_id[key] = task

        def done(finished: asyncio.Task[None]) -> None:
            self._last_active = asyncio.get_running_loop().time()
            self._requests -= requests
            self._tasks.discard(finished)
            self._cancelled.discard(finished)
            if key is not None and self._by_id.get(key) is finished:
                del self._by_id[key]

        task.add_done_callback(done)

    async def _answer_single(self, method: str, params: Any, request_id: Any) -> None:
        response = await self._respond(method, params, request_id)
        if response is not None:
            self._send(response)

    async def _answer_batch(self, messages: list[Any]) -> None:
        answers = await asyncio.gather(*(self._answer(m) for m in messages))
        responses = [a for a in answers if a is not None]
        if responses:
            self._send(responses)

    async def _answer(self, message: Any) -> dict[str, Any] | None:
        """The response to one message, or None for notifications and responses."""
        if isinstance(message, dict) and _is_response(message):
            self._settle(message)
            return None
        try:
            method, params, request_id = _parse_request(message)
        except RpcError as exc:
            return _error_response(_valid_id(message), exc)
        return await self._respond(method, params, request_id)

    async def _respond(self, method: str, params: Any, request_id: Any) -> dict[str, Any] | None:
        """The response to a request (None for a notification: `request_id` is absent)."""
        log.debug(
            "%s: %.60s (id %.40r)", self.peer, method, None if request_id is _ABSENT else request_id
        )
        try:
            assert self._dispatch is not None
            result = await self._dispatch(method, params)
        except RpcError as exc:
            return None if request_id is _ABSENT else _error_response(request_id, exc)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task not in self._cancelled or request_id is _ABSENT:
                raise
            task.uncancel()  # the peer's cancel is handled: answer it
            return _error_response(request_id, RpcError(REQUEST_CANCELLED, "Request cancelled"))
        except Exception as exc:
            log.exception("%s failed", method)
            error = RpcError(INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")
            return None if request_id is _ABSENT else _error_response(request_id, error)
        if request_id is _ABSENT:
            return None
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    def _settle(self, message: dict[str, Any]) -> None:
        """Deliver a response to the request of ours it answers."""
        request_id = message.get("id")
        future = self._pending.get(request_id) if isinstance(request_id, int) else None
        if future is None or future.done():
            log.debug("ignoring a response to unknown request %r", request_id)
            return
        error = message.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            future.set_exception(
                RpcError(
                    code if isinstance(code, int) else INTERNAL_ERROR,
                    str(error.get("message", "")),
                    error.get("data"),
                )
            )
        else:
            future.set_result(message.get("result"))

    def _cancel_request(self, params: Any) -> None:
        key = _id_key(params.get("id")) if isinstance(params, dict) else None
        task = self._by_id.get(key) if key is not None else None
        if task is not None and not task.done():
            self._cancelled.add(task)
            task.cancel()


def _size(message: Any) -> int:
    return len(message) if isinstance(message, list) else 1


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else "the peer"


def _encode(message: dict[str, Any] | list[dict[str, Any]]) -> bytes:
    # ASCII-only JSON: `\uXXXX` escapes keep even a lone surrogate from breaking a frame.
    return json.dumps(message, separators=(",", ":")).encode()


def _is_response(message: dict[str, Any]) -> bool:
    return "method" not in message and ("result" in message or "error" in message)


def _is_notification(message: Any) -> bool:
    """A well-formed notification (no id); anything doubtful takes the checked path."""
    return (
        isinstance(message, dict)
        and "id" not in message
        and message.get("jsonrpc") == "2.0"
        and isinstance(message.get("method"), str)
        and isinstance(message.get("params", {}), dict | list)
    )


def _parse_request(message: Any) -> tuple[str, Params, Any]:
    """`(method, params, id)` of a request or notification (id `_ABSENT`), else `RpcError`."""
    if not isinstance(message, dict):
        raise RpcError(INVALID_REQUEST, "Invalid Request: not a JSON object")
    if message.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
    method = message.get("method")
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, 'Invalid Request: "method" must be a string')
    request_id = message.get("id", _ABSENT)
    if request_id is not _ABSENT and _id_key(request_id) is None:
        raise RpcError(INVALID_REQUEST, 'Invalid Request: "id" must be a string or a number')
    params = message.get("params", {})
    if not isinstance(params, dict | list):
        raise RpcError(INVALID_REQUEST, 'Invalid Request: "params" must be an object or array')
    return method, params, request_id


def _no_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON does not.
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    # A number past a double's range (1e400) would be read as infinity, which no JSON holds:
    # stored as null, or failing every request that carries it.
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _id_key(request_id: Any) -> str | None:
    """A hashable key for a valid id (string, number or null), else None."""
    if isinstance(request_id, bool) or not isinstance(request_id, str | int | float | None):
        return None
    if isinstance(request_id, float) and not math.isfinite(request_id):
        return None
    return json.dumps(request_id)


def _valid_id(message: Any) -> Any:
    """The message's id if it is a valid one, for an error response; else null."""
    request_id = message.get("id") if isinstance(message, dict) else None
    return request_id if _id_key(request_id) is not None else None


def _error_response(request_id: Any, error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_json()}
