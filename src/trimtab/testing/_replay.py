"""A replay server: recorded conversations served over real HTTP.

`ReplayServer` listens on 127.0.0.1 and answers model calls from a list of `Conversation`s:
a request whose messages are a prefix of a conversation gets the assistant message that comes
next. Everything a provider does on the wire is exercised (HTTP, SSE framing, chunking,
retries, timeouts), without a network or a model.

The module has three parts: the conversation models and the format-neutral matching; the
format-specific functions (only OpenAI Chat Completions for now, each named `_openai_*`); and
the HTTP/1.1 server, written on `asyncio.start_server` so that tests need no web framework.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "Conversation",
    "ConversationFunction",
    "ConversationMessage",
    "ConversationToolCall",
    "ReplayServer",
]


# --- conversations ------------------------------------------------------------------------


class _Strict(BaseModel):
    # Conversations are written by hand (and later loaded from YAML): a misspelt key must fail.
    model_config = ConfigDict(extra="forbid")


class ConversationFunction(_Strict):
    """The function a recorded tool call invokes."""

    name: str
    arguments: str = "{}"
    """The arguments as JSON text, as on the wire; compared as parsed JSON."""


class ConversationToolCall(_Strict):
    """A recorded tool call, in OpenAI shape."""

    id: str
    """Matched by order of appearance, not literally: any id the client sends back will do."""
    type: Literal["function"] = "function"
    function: ConversationFunction


class ConversationMessage(_Strict):
    """One recorded message, in OpenAI Chat Completions shape."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ConversationToolCall] | None = None
    """On assistant messages: the calls the model made."""
    tool_call_id: str | None = None
    """On tool messages: the call this is the result of."""
    reasoning_content: str | None = None
    """On assistant messages: reasoning text to stream before the content (not matched)."""


class Conversation(_Strict):
    """A recorded exchange; each assistant message in it is the answer to what precedes it."""

    messages: list[ConversationMessage]


# --- matching (format-neutral) ------------------------------------------------------------


class _Ids:
    """Numbers tool call ids by order of first appearance, so ids compare by position."""

    def __init__(self) -> None:
        self.by_id: dict[str, int] = {}

    def ordinal(self, call_id: str) -> int:
        return self.by_id.setdefault(call_id, len(self.by_id))

    def id_of(self, ordinal: int) -> str | None:
        return next((i for i, n in self.by_id.items() if n == ordinal), None)


@dataclass(frozen=True)
class _Normalized:
    """A message reduced to what matching compares."""

    role: str
    content: str
    calls: tuple[tuple[str, str, int], ...]
    """(name, canonical JSON arguments, ordinal) of each tool call."""
    answers: int | None
    """On tool messages: the ordinal of the call answered."""
    position: int = field(compare=False)
    """Index in the original message list, for error messages."""
    source: ConversationMessage = field(compare=False)


def _canonical_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text  # invalid JSON compares as text


def _normalize(
    messages: Sequence[ConversationMessage], *, match_system: bool
) -> tuple[list[_Normalized], _Ids]:
    """The messages to compare (system ones dropped unless matched) and their id numbering."""
    ids = _Ids()
    result: list[_Normalized] = []
    for position, message in enumerate(messages):
        # Providers send "developer" as "system" (servers reject the former), so they are one.
        role = "system" if message.role == "developer" else message.role
        if role == "system" and not match_system:
            continue
        calls = tuple(
            (c.function.name, _canonical_json(c.function.arguments), ids.ordinal(c.id))
            for c in message.tool_calls or ()
        )
        answers = ids.ordinal(message.tool_call_id) if message.tool_call_id is not None else None
        content = message.content or ""
        result.append(_Normalized(role, content, calls, answers, position, message))
    return result, ids


def _describe(message: _Normalized) -> str:
    text = message.content if len(message.content) <= 120 else message.content[:117] + "..."
    parts = [f"{message.role} {text!r}"]
    parts += [f"call #{n} {name}({args})" for name, args, n in message.calls]
    if message.answers is not None:
        parts.append(f"answering call #{message.answers}")
    return ", ".join(parts)


@dataclass
class _Match:
    answer: ConversationMessage
    conversation_ids: _Ids
    request_ids: _Ids


def _compare(
    index: int, recorded: list[_Normalized], request: list[_Normalized]
) -> tuple[int, str | None]:
    """How many request messages match, and why the conversation does not answer (or None)."""
    for i, got in enumerate(request):
        if i >= len(recorded):
            return i, f"conversation {index} has no message for request message {got.position}"
        if recorded[i] != got:
            return i, (
                f"conversation {index}, request message {got.position}: "
                f"expected {_describe(recorded[i])}; got {_describe(got)}"
            )
    if len(recorded) == len(request):
        return len(request), f"conversation {index} ends where the request ends"
    if recorded[len(request)].role != "assistant":
        role = recorded[len(request)].role
        return len(request), f"conversation {index} continues with a {role} message"
    return len(request), None


def _find_answer(
    conversations: Sequence[tuple[list[_Normalized], _Ids]],
    messages: Sequence[ConversationMessage],
    *,
    match_system: bool,
) -> _Match | str:
    """The match for a request, or an explanation of the closest miss."""
    request, request_ids = _normalize(messages, match_system=match_system)
    best: tuple[int, str] = (-1, "the replay server has no conversations")
    for index, (recorded, ids) in enumerate(conversations):
        matched, reason = _compare(index, recorded, request)
        if reason is None:
            return _Match(recorded[matched].source, ids, request_ids)
        best = max(best, (matched, reason), key=lambda b: b[0])
    return f"no recorded conversation continues these {len(messages)} messages; {best[1]}"


def _answer_calls(match: _Match) -> list[ConversationToolCall]:
    """The answer's tool calls with ids the client can match to what it already sent."""
    taken = set(match.request_ids.by_id)
    calls: list[ConversationToolCall] = []
    for call in match.answer.tool_calls or ():
        ordinal = match.conversation_ids.ordinal(call.id)
        call_id = match.request_ids.id_of(ordinal)
        if call_id is None:
            # A new call: keep the recorded id unless the client already uses it for another.
            call_id = call.id if call.id not in taken else f"call_replay_{ordinal}"
        calls.append(call.model_copy(update={"id": call_id}))
    return calls


def _estimate_tokens(*texts: str | None) -> int:
    """A stand-in token count (4 characters a token), so usage is non-zero and stable."""
    return max(1, sum(len(t or "") for t in texts) // 4)


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


# --- OpenAI Chat Completions --------------------------------------------------------------

_OPENAI_PATHS = ("/v1/chat/completions", "/chat/completions")
_CREATED = 1_700_000_000  # a fixed timestamp keeps responses reproducible


def _openai_text(content: Any) -> str:
    """Message content: a string, or a list of parts whose text parts are joined."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _openai_messages(body: dict[str, Any]) -> list[ConversationMessage]:
    """The request's messages; unknown fields (such as `name`) are ignored."""
    return [
        ConversationMessage(
            role=m.get("role"),
            content=_openai_text(m.get("content")),
            tool_calls=[
                ConversationToolCall(
                    id=c.get("id", ""),
                    function=ConversationFunction(**c.get("function", {})),
                )
                for c in m.get("tool_calls") or ()
            ],
            tool_call_id=m.get("tool_call_id"),
        )
        for m in body.get("messages", [])
    ]


def _openai_usage(
    messages: list[ConversationMessage], answer: ConversationMessage
) -> dict[str, int]:
    prompt = _estimate_tokens(*(m.content for m in messages))
    completion = _estimate_tokens(
        answer.content,
        answer.reasoning_content,
        *(c.function.arguments for c in answer.tool_calls or ()),
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _openai_completion(
    answer: ConversationMessage,
    calls: list[ConversationToolCall],
    model: str,
    usage: dict[str, int],
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if calls:
        message["tool_calls"] = [c.model_dump() for c in calls]
    if answer.reasoning_content is not None:
        message["reasoning_content"] = answer.reasoning_content
    finish_reason = "tool_calls" if calls else "stop"
    return {
        "id": "chatcmpl-replay",
        "object": "chat.completion",
        "created": _CREATED,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }


def _openai_chunks(
    answer: ConversationMessage,
    calls: list[ConversationToolCall],
    model: str,
    usage: dict[str, int] | None,
    chunk_size: int,
) -> list[dict[str, Any]]:
    """The stream's chunks, split the way real servers split them."""
    base = {
        "id": "chatcmpl-replay",
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    reasoning = _split(answer.reasoning_content or "", chunk_size)
    chunks += [chunk({"reasoning_content": piece}) for piece in reasoning]
    chunks += [chunk({"content": piece}) for piece in _split(answer.content or "", chunk_size)]
    for index, call in enumerate(calls):
        # The name comes only in a call's first chunk; the arguments follow in pieces.
        head = {"name": call.function.name, "arguments": ""}
        chunks.append(chunk(_openai_call_delta(index, id=call.id, type="function", function=head)))
        chunks += [
            chunk(_openai_call_delta(index, function={"arguments": piece}))
            for piece in _split(call.function.arguments, chunk_size)
        ]
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    if usage is not None:
        chunks.append({**base, "choices": [], "usage": usage})
    return chunks


def _openai_call_delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, **fields}]}


def _openai_sse(chunks: list[dict[str, Any]]) -> list[bytes]:
    events = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    return [*events, b"data: [DONE]\n\n"]


_OPENAI_ERRORS: dict[int, tuple[str, str, str]] = {
    400: ("invalid_request_error", "invalid_request", "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "permission_denied", "Permission denied."),
    404: ("invalid_request_error", "not_found", "Not found."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached; please retry."),
}


def _openai_error(status: int, message: str | None = None) -> dict[str, Any]:
    default = ("server_error", "server_error", "The server had an error.")
    error_type, code, text = _OPENAI_ERRORS.get(status, default)
    return {"error": {"message": message or text, "type": error_type, "code": code}}


# --- HTTP ---------------------------------------------------------------------------------


@dataclass
class _HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class _HttpResponse:
    status: int
    pieces: list[bytes]
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False
    """Send with chunked transfer encoding, one chunk a piece (for SSE)."""


@dataclass
class _Injection:
    times: int
    response: _HttpResponse | None = None
    """A failure to answer with instead of the conversation."""
    stall: float = 0.0
    """Seconds to wait after the headers before the body."""


def _json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> _HttpResponse:
    return _HttpResponse(status, [json.dumps(body).encode()], headers=headers or {})


async def _read_request(reader: asyncio.StreamReader) -> _HttpRequest | None:
    """The next request on the connection, or None once the client has closed it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in filter(None, lines[1:]):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    # Clients send JSON with a Content-Length; chunked request bodies are not supported.
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return _HttpRequest(method, target.split("?", 1)[0], headers, body)


async def _send(writer: asyncio.StreamWriter, response: _HttpResponse, stall: float) -> None:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Unknown"
    headers = {"Content-Type": response.content_type, **response.headers}
    if response.chunked:
        headers["Transfer-Encoding"] = "chunked"
    else:
        headers["Content-Length"] = str(sum(len(p) for p in response.pieces))
    lines = [f"HTTP/1.1 {response.status} {reason}", *(f"{k}: {v}" for k, v in headers.items())]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()
    if stall:
        await asyncio.sleep(stall)
    for piece in response.pieces:
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if response.chunked else piece)
        await writer.drain()
    if response.chunked:
        writer.write(b"0\r\n\r\n")
        await writer.drain()


class ReplayServer:
    """Serves recorded conversations over HTTP on 127.0.0.1, in the OpenAI wire format.

    Example:
        ```python
        async with ReplayServer([conversation]) as server:
            config = ProviderConfig(type="openai", base_url=server.base_url, api_key="test")
        ```

    Args:
        conversations: What to answer with.
        match_system: Compare system (and developer) messages too; by default they are
            ignored, so a change of system prompt does not invalidate recordings.
        chunk_size: Characters per streamed piece of content, reasoning or arguments.
    """

    def __init__(
        self,
        conversations: Sequence[Conversation] = (),
        *,
        match_system: bool = False,
        chunk_size: int = 8,
    ) -> None:
        self._match_system = match_system
        self._chunk_size = chunk_size
        self._conversations = [
            _normalize(c.messages, match_system=match_system) for c in conversations
        ]
        self._injections: deque[_Injection] = deque()
        self._connections: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self.requests: list[dict[str, Any]] = []
        """The JSON body of every model request received, in order (failed ones included)."""

    @property
    def base_url(self) -> str:
        """The API root to give a provider, such as `http://127.0.0.1:53124/v1`."""
        if self._server is None:
            raise RuntimeError("the replay server is not running: use `async with`")
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def fail_next(
        self,
        status: int = 500,
        *,
        retry_after: float | None = None,
        times: int = 1,
        body: dict[str, Any] | str | bytes | None = None,
        content_type: str | None = None,
    ) -> None:
        """Answer the next `times` model requests with an error instead of the conversation.

        Args:
            status: The HTTP status; 200 with a raw `body` serves a malformed response.
            retry_after: Seconds to send in a `Retry-After` header.
            times: How many requests fail.
            body: A JSON object, or raw text; by default an OpenAI error object for `status`.
            content_type: Defaults to JSON for objects and `text/event-stream` for raw text.
        """
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        if body is None or isinstance(body, dict):
            response = _json_response(
                status, body if body is not None else _openai_error(status), headers
            )
        else:
            raw = body.encode() if isinstance(body, str) else body
            response = _HttpResponse(status, [raw], "text/event-stream", headers)
        if content_type is not None:
            response.content_type = content_type
        self._injections.append(_Injection(times, response=response))

    def stall_next(self, seconds: float, *, times: int = 1) -> None:
        """Send the headers of the next `times` answers, then wait `seconds` before the body."""
        self._injections.append(_Injection(times, stall=seconds))

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve_connection, "127.0.0.1", 0)
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
            while (request := await _read_request(reader)) is not None:
                response, stall = self._respond(request)
                await _send(writer, response, stall)
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

    def _respond(self, request: _HttpRequest) -> tuple[_HttpResponse, float]:
        """The response to a request, and the seconds to stall before its body."""
        if request.method != "POST" or request.path not in _OPENAI_PATHS:
            message = f"the replay server has no {request.method} {request.path}"
            return _json_response(404, _openai_error(404, message)), 0.0
        try:
            body = json.loads(request.body)
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as exc:
            return _json_response(400, _openai_error(400, f"invalid JSON body: {exc}")), 0.0
        self.requests.append(body)
        injection = self._take_injection()
        if injection is not None and injection.response is not None:
            return injection.response, 0.0
        stall = injection.stall if injection is not None else 0.0
        return self._openai_answer(body), stall

    def _take_injection(self) -> _Injection | None:
        if not self._injections:
            return None
        injection = self._injections[0]
        injection.times -= 1
        if injection.times <= 0:
            self._injections.popleft()
        return injection

    def _openai_answer(self, body: dict[str, Any]) -> _HttpResponse:
        try:
            messages = _openai_messages(body)
        except (ValidationError, TypeError, AttributeError) as exc:
            return _json_response(400, _openai_error(400, f"invalid messages: {exc}"))
        match = _find_answer(self._conversations, messages, match_system=self._match_system)
        if isinstance(match, str):
            # Retrying cannot fix a mismatch: tell the client library not to.
            error = {"error": {"message": match, "type": "replay_mismatch", "code": None}}
            return _json_response(500, error, {"x-should-retry": "false"})
        calls = _answer_calls(match)
        usage = _openai_usage(messages, match.answer)
        model = str(body.get("model", ""))
        if not body.get("stream"):
            return _json_response(200, _openai_completion(match.answer, calls, model, usage))
        include_usage = (body.get("stream_options") or {}).get("include_usage")
        chunks = _openai_chunks(
            match.answer, calls, model, usage if include_usage else None, self._chunk_size
        )
        return _HttpResponse(200, _openai_sse(chunks), "text/event-stream", chunked=True)
