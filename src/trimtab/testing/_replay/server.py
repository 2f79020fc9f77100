"""`ReplayServer`: recorded conversations served over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx2

from trimtab.testing._replay import http
from trimtab.testing._replay.conversations import (
    Conversation,
    ConversationMessage,
    ConversationToolCall,
    read_conversation_file,
    save_conversations,
)
from trimtab.testing._replay.formats import (
    ParsedRequest,
    Reply,
    WireFormat,
    format_for,
    openai_error,
)
from trimtab.testing._replay.matching import answer_calls, estimate_tokens, find_answer, normalize

__all__ = ["ReceivedRequest", "ReplayServer"]


@dataclass(frozen=True)
class ReceivedRequest:
    """A model request as the server received it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    """Names lower-cased."""
    body: dict[str, Any]
    wire_format: str
    """`openai-chat`, `openai-responses` or `anthropic`."""
    at: float
    """When it arrived (`time.monotonic()`), to check how long a client waited to retry."""


@dataclass
class _Injection:
    """What to do instead of (or on top of) answering the next `times` model requests."""

    times: int
    status: int | None = None
    """Answer with this error status instead."""
    headers: dict[str, str] = field(default_factory=dict)
    message: str | None = None
    error_type: str | None = None
    body: dict[str, Any] | bytes | None = None
    content_type: str | None = None
    delivery: http.Delivery = field(default_factory=http.Delivery)
    reset: bool = False
    malformed: bool = False


ACCEPT_QUEUE = 1024
"""Connections the listening socket holds until they are accepted (the kernel may cap it)."""


class ReplayServer:
    """Serves recorded conversations over HTTP on 127.0.0.1, in three wire formats.

    A request whose messages (converted to the canonical Chat Completions form) are a prefix
    of a recorded conversation gets the assistant message that comes next, in the format it
    was asked in: OpenAI Chat Completions (`POST /v1/chat/completions`), OpenAI Responses
    (`POST /v1/responses`) or Anthropic Messages (`POST /v1/messages`), streamed or not.
    Paths match by their end, so `/chat/completions` and Azure's
    `/openai/deployments/NAME/chat/completions` work too.

    Example:
        ```python
        async with ReplayServer.from_yaml("tests/conversations/weather.yaml") as server:
            provider = {"type": "openai", "base_url": server.base_url, "api_key": "test"}
            anthropic = {"type": "anthropic", "base_url": server.root_url, "api_key": "test"}
        ```

    Args:
        conversations: What to answer with.
        match_system: Compare system (and developer) messages too; by default they are
            ignored, so a change of system prompt does not invalidate recordings.
        chunk_size: Characters per streamed piece of content, reasoning or arguments.
        models: The models `GET /v1/models` lists (and `save_yaml` writes).
    """

    def __init__(
        self,
        conversations: Sequence[Conversation] = (),
        *,
        match_system: bool = False,
        chunk_size: int = 8,
        models: Sequence[str] | None = None,
    ) -> None:
        self.conversations = list(conversations)
        self.models = list(models) if models is not None else None
        self._match_system = match_system
        self._chunk_size = chunk_size
        self._recorded = [normalize(c.messages, match_system=match_system) for c in conversations]
        self._injections: deque[_Injection] = deque()
        self._connections: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self.requests: list[dict[str, Any]] = []
        """The JSON body of every model request received, in order (failed ones included)."""
        self.received: list[ReceivedRequest] = []
        """Every model request received, with its path, query and headers."""

    @classmethod
    def from_yaml(cls, path: str | Path, **options: Any) -> Self:
        """A server for the conversations (and models) of a YAML file."""
        document = read_conversation_file(path)
        options.setdefault("models", document.models)
        return cls(document.conversations, **options)

    def save_yaml(self, path: str | Path) -> None:
        """Write the server's conversations (and models) to a YAML file."""
        save_conversations(path, self.conversations, models=self.models)

    @property
    def root_url(self) -> str:
        """The server's root, such as `http://127.0.0.1:53124` (Anthropic's and Azure's
        clients add `/v1/messages` or `/openai/...` themselves)."""
        if self._server is None:
            raise RuntimeError("the replay server is not running: use `async with`")
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style API root to give a provider, such as `http://127.0.0.1:53124/v1`."""
        return f"{self.root_url}/v1"

    def transport(self) -> httpx2.AsyncBaseTransport:
        """The server without a socket, for tests that are not about connections: give it to
        a provider (`make_provider(config, transport=...)`) and its requests are answered in
        process, from the same recordings, with any `base_url` (paths match by their end).
        Needs no `async with`. Stalls and cuts play out in the body as they would over HTTP;
        a reset raises `httpx2.ConnectError`."""
        return httpx2.MockTransport(self._handle)

    # --- misbehaving ----------------------------------------------------------------------

    def fail_next(
        self,
        status: int = 500,
        *,
        retry_after: float | None = None,
        times: int = 1,
        message: str | None = None,
        error_type: str | None = None,
        body: dict[str, Any] | str | bytes | None = None,
        content_type: str | None = None,
    ) -> None:
        """Answer the next `times` model requests with an error instead of the conversation.

        Args:
            status: The HTTP status; 200 with a raw `body` serves a malformed response.
            retry_after: Seconds to send in a `Retry-After` header.
            times: How many requests fail.
            message: The error message, in the error body of the request's format.
            error_type: The error's type in that body (such as Anthropic's `overloaded_error`).
            body: Instead of that body: a JSON object, or raw text (sent as an event stream).
            content_type: Overrides the content type.
        """
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        raw = body.encode() if isinstance(body, str) else body
        self._injections.append(
            _Injection(
                times,
                status=status,
                headers=headers,
                message=message,
                error_type=error_type,
                body=raw,
                content_type=content_type,
            )
        )

    def stall_next(self, seconds: float, *, after: int = 0, times: int = 1) -> None:
        """Send the headers of the next `times` answers, then wait `seconds` before the body
        (or, in a stream, before event number `after`)."""
        delivery = http.Delivery(stall=seconds, stall_after=after)
        self._injections.append(_Injection(times, delivery=delivery))

    def reset_next(self, *, times: int = 1) -> None:
        """Reset the connection (TCP RST) instead of answering the next `times` requests."""
        self._injections.append(_Injection(times, reset=True))

    def cut_next(self, *, after: int = 2, times: int = 1) -> None:
        """Close the connection after `after` events of the next `times` answers (half-way
        through the body of a non-streamed one)."""
        self._injections.append(_Injection(times, delivery=http.Delivery(cut_after=after)))

    def malform_next(self, *, times: int = 1) -> None:
        """Break the JSON of the middle event of the next `times` streamed answers (of the
        body of a non-streamed one)."""
        self._injections.append(_Injection(times, malformed=True))

    # --- serving --------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        # A load test's clients connect together: the accept queue holds them while the loop
        # is busy (asyncio's default of 100 drops the rest, to retry a second or more later).
        self._server = await asyncio.start_server(
            self._serve_connection, "127.0.0.1", 0, backlog=ACCEPT_QUEUE
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is None:
            return
        self._server.close()
        # Connections outlive `close()`: a stalled answer would keep the test waiting.
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        # Without TCP_NODELAY, Nagle's algorithm holds small writes back for ~40 ms.
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while (request := await http.read_request(reader)) is not None:
                response, delivery = self._respond(request)
                if response is None:
                    http.reset(writer)
                    break
                if not await http.send(writer, response, delivery):
                    break
                if request.headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # the client went away (a timeout closes mid-answer) or sent garbage
        except asyncio.CancelledError:
            # Only `__aexit__` cancels us. End quietly: Python 3.11's `start_server` reports a
            # cancelled handler as an "Exception in callback".
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _handle(self, request: httpx2.Request) -> httpx2.Response:
        """Answer a request given to `transport()`."""
        received = http.HttpRequest(
            request.method,
            request.url.path,
            dict(request.url.params),
            {name.lower(): value for name, value in request.headers.items()},
            await request.aread(),
        )
        response, delivery = self._respond(received)
        if response is None:
            raise httpx2.ConnectError("the replay server reset the connection", request=request)
        headers = {"Content-Type": response.content_type, **response.headers}
        body = _Body(response, delivery)
        return httpx2.Response(response.status, headers=headers, stream=body, request=request)

    def _respond(self, request: http.HttpRequest) -> tuple[http.HttpResponse | None, http.Delivery]:
        """The response to a request (None: reset the connection), and how to deliver it."""
        on_time = http.Delivery()
        wire = format_for(request.path) if request.method == "POST" else None
        if wire is None:
            return self._other(request), on_time
        try:
            body = json.loads(request.body)
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as exc:
            return http.json_response(400, wire.error(400, f"invalid JSON: {exc}", None)), on_time
        self.requests.append(body)
        self.received.append(
            ReceivedRequest(
                request.method,
                request.path,
                request.query,
                request.headers,
                body,
                wire.name,
                time.monotonic(),
            )
        )
        injection = self._take_injection()
        if injection is None:
            return self._answer(wire, body), on_time
        if injection.reset:
            return None, on_time
        if injection.status is not None:
            return _failure(wire, injection), on_time
        response = self._answer(wire, body)
        return (_malformed(response) if injection.malformed else response), injection.delivery

    def _other(self, request: http.HttpRequest) -> http.HttpResponse:
        """`GET .../models`, or a 404."""
        if request.method == "GET" and request.path.endswith("/models"):
            models = [{"id": m, "object": "model", "owned_by": "replay"} for m in self.models or ()]
            return http.json_response(200, {"object": "list", "data": models})
        message = f"the replay server has no {request.method} {request.path}"
        return http.json_response(404, openai_error(404, message, None))

    def _take_injection(self) -> _Injection | None:
        if not self._injections:
            return None
        injection = self._injections[0]
        injection.times -= 1
        if injection.times <= 0:
            self._injections.popleft()
        return injection

    def _answer(self, wire: WireFormat, body: dict[str, Any]) -> http.HttpResponse:
        try:
            request = wire.parse(body)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            return http.json_response(400, wire.error(400, f"invalid request: {exc}", None))
        match = find_answer(self._recorded, request.messages, match_system=self._match_system)
        if isinstance(match, str):
            # Retrying cannot fix a mismatch: tell the client library not to.
            error = wire.error(500, match, "replay_mismatch")
            return http.json_response(500, error, {"x-should-retry": "false"})
        reply = _reply(request, match.answer, answer_calls(match))
        if not request.stream:
            return http.json_response(200, wire.body(reply))
        events = wire.events(reply, request, self._chunk_size)
        return http.HttpResponse(200, events, "text/event-stream", chunked=True)


def _reply(
    request: ParsedRequest, answer: ConversationMessage, calls: list[ConversationToolCall]
) -> Reply:
    output = estimate_tokens(
        answer.content, answer.reasoning_content, *(c.function.arguments for c in calls)
    )
    prompt = estimate_tokens(*(m.content for m in request.messages))
    return Reply(answer, calls, request.model, prompt, output)


def _failure(wire: WireFormat, injection: _Injection) -> http.HttpResponse:
    status = injection.status or 500
    if isinstance(injection.body, bytes):
        content_type = injection.content_type or "text/event-stream"
        return http.HttpResponse(status, [injection.body], content_type, injection.headers)
    body = injection.body or wire.error(status, injection.message, injection.error_type)
    response = http.json_response(status, body, injection.headers)
    response.content_type = injection.content_type or response.content_type
    return response


def _malformed(response: http.HttpResponse) -> http.HttpResponse:
    """The response with broken JSON: in its middle event, or in its body."""
    pieces = list(response.pieces)
    index = len(pieces) // 2
    piece = pieces[index]
    start = piece.find(b"data: ") + len(b"data: ") if response.chunked else 0
    data = piece[start:].rstrip(b"\n")
    pieces[index] = piece[:start] + data[: len(data) // 2] + (b"\n\n" if response.chunked else b"")
    return http.HttpResponse(
        response.status, pieces, response.content_type, response.headers, response.chunked
    )


class _Body(httpx2.AsyncByteStream):
    """A response's body as `transport()` delivers it: piece by piece, stalled or cut as
    `http.send` would on a connection."""

    def __init__(self, response: http.HttpResponse, delivery: http.Delivery) -> None:
        self._response = response
        self._delivery = delivery

    async def __aiter__(self) -> AsyncIterator[bytes]:
        delivery = self._delivery
        if not self._response.chunked:
            body = b"".join(self._response.pieces)
            await asyncio.sleep(delivery.stall)
            if delivery.cut_after is None:
                yield body
                return
            yield body[: len(body) // 2]
            raise httpx2.RemoteProtocolError("the replay server cut the answer")
        for index, piece in enumerate(self._response.pieces):
            if index == delivery.stall_after:
                await asyncio.sleep(delivery.stall)
            if index == delivery.cut_after:
                raise httpx2.RemoteProtocolError("the replay server cut the answer")
            yield piece
