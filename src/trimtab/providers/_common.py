"""What every wire format shares: reading a stream that may stall or drop, and failures.

A provider module maps its wire format; everything that does not depend on the format lives
here once: the deadlines, folding a stream of events into deltas and one `ModelResponse`,
turning HTTP statuses, error events, answers of the wrong kind and transport failures into
typed `ProviderError`s, and giving id-less tool calls an id.

Nothing here imports a client library: the transport errors of httpx (which `openai` and
`anthropic` use, as `httpx` or as `httpx2` depending on their version) are looked up among the
modules already imported.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Generic, Protocol, TypeVar
from urllib.parse import urlsplit

from trimtab._errors import ProviderError, ProviderErrorType
from trimtab.providers._base import ModelResponse, ProviderEvent, ToolCall
from trimtab.providers._config import CONNECT_TIMEOUT, MAX_REDIRECTS

__all__ = [
    "HttpResponse",
    "StreamFold",
    "answer_within",
    "attempt_timeout",
    "classify_status",
    "connection_error",
    "endpoint",
    "environment_header_names",
    "own_key_needed",
    "fold_stream",
    "provider_errors",
    "read_body",
    "require_event_stream",
    "retry_after",
    "status_error",
    "stream_error",
    "time_left",
    "tool_call",
    "unexpected_answer",
]

_Event = TypeVar("_Event")
_Event_contra = TypeVar("_Event_contra", contravariant=True)

_UNEXPECTED_BODY_LIMIT = 65_536
"""Bytes read of an answer that is not what was asked for: enough for any error object."""

CONTEXT_LENGTH = re.compile(
    r"context[ _]?(length|size|window)|maximum context|too many tokens|prompt is too long", re.I
)
"""What OpenAI, Anthropic, vLLM, llama.cpp and LM Studio say when the prompt does not fit."""


# --- deadlines ----------------------------------------------------------------------------


def attempt_timeout(seconds: float) -> dict[str, float]:
    """The arguments of an httpx `Timeout` for each attempt of a call that has `seconds` in
    all: connecting takes at most `CONNECT_TIMEOUT` of them."""
    return {"timeout": seconds, "connect": min(CONNECT_TIMEOUT, seconds)}


_DEADLINE: ContextVar[float | None] = ContextVar("trimtab_provider_deadline", default=None)
"""When the call in progress must have its answer (the event loop's clock), if it is bounded."""


class answer_within:  # noqa: N801 (used as the function it was)
    """Bound the wait for a call's answer, retries and their pauses included (see
    `ProviderConfig.deadline`): past it, the block fails with `timeout`. Inside the block,
    `time_left()` tells how long is left (the retries' waits fit in it).

    A class rather than a generator's context manager: it holds less for every call in
    flight (a thousand sessions' calls at once)."""

    __slots__ = ("_seconds", "_stream", "_timeout", "_token")

    def __init__(self, seconds: float, *, stream: bool) -> None:
        self._seconds = seconds
        self._stream = stream
        self._timeout = asyncio.timeout(seconds)
        self._token: Token[float | None] | None = None

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()
        self._token = _DEADLINE.set(self._timeout.when())

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _: TracebackType | None
    ) -> None:
        if self._token is not None:
            _DEADLINE.reset(self._token)
        try:
            await self._timeout.__aexit__(kind, exc, _)
        except TimeoutError:
            what = "the answer did not start" if self._stream else "no answer"
            text = f"{what} within {self._seconds:g} s"
            raise ProviderError("timeout", text, retryable=True) from None


def time_left() -> float | None:
    """Seconds left before the deadline of the call in progress (`answer_within`); None
    outside one."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - asyncio.get_running_loop().time()


# --- streams ------------------------------------------------------------------------------


class StreamFold(Protocol[_Event_contra]):
    """Folds the events of one wire format's stream into deltas and a final response."""

    def add(self, event: _Event_contra) -> list[ProviderEvent]:
        """Fold one event in; return the deltas to show as they stream."""
        ...

    def response(self) -> ModelResponse:
        """The complete response; raise `ProviderError` if the stream did not complete it."""
        ...


async def fold_stream(
    events: AsyncIterator[_Event],
    fold: StreamFold[_Event],
    *,
    stall_timeout: float | None,
    close: Callable[[], Awaitable[object]],
) -> AsyncIterator[ProviderEvent]:
    """Yield the deltas of a stream as they come, then its one `ModelResponse`.

    `close` releases the connection however the stream ends, including when the consumer
    stops early.
    """
    watch: _StallWatch[_Event] = _StallWatch(stall_timeout)
    try:
        while (event := await watch.next(events)) is not None:
            for delta in fold.add(event):
                yield delta
    finally:
        watch.stop()
        await close()
    yield fold.response()


class HttpResponse(Protocol):
    """What `require_event_stream` needs of an httpx response (of either httpx flavour)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


async def read_body(response: HttpResponse, limit: int | None = None) -> bytes:
    """The body of `response` (its first `limit` bytes, if given), then closed.

    The whole of a body is bounded by the client that read it (`_bodies`); `limit` is for an
    unexpected answer, of which the start says enough.
    """
    body = bytearray()
    try:
        async for chunk in response.aiter_bytes():
            body += chunk
            if limit is not None and len(body) >= limit:
                break
    finally:
        await response.aclose()
    return bytes(body[:limit])


async def require_event_stream(response: HttpResponse) -> None:
    """Raise unless the successful answer to a streamed call is an event stream.

    A JSON answer or an HTML page (a proxy, a wrong endpoint) would otherwise read as a stream
    that ended early, which looks like a dropped connection and is retried. It is
    `bad_response` instead, or the error its body tells of (see `unexpected_answer`).
    """
    content_type = response.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() == "text/event-stream":
        return
    data = await read_body(response, _UNEXPECTED_BODY_LIMIT)
    try:
        parsed: object = json.loads(data)
    except ValueError:
        parsed = data.decode(errors="replace")
    raise unexpected_answer(parsed, f"an event stream, got {content_type or 'no content type'}")


class _StallWatch(Generic[_Event]):
    """A stream's stall timeout: no wait for its next event may last `seconds` (the time its
    consumer takes between events does not count, and a keep-alive comment is no event).

    One timer per `seconds`, not per event: it cancels the wait once it has lasted that
    long, as `asyncio.timeout` would, without a timeout's setting up and undoing for every
    event (docs/performance.md, streaming). The timer fires only while the stream is waited for,
    so its cancellation reaches the wait, which turns it into a `timeout`; a cancellation
    from anyone else (an abort) still wins.
    """

    __slots__ = ("_fired", "_seconds", "_since", "_task", "_timer")

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._since: float | None = None
        """When the wait in progress began; None between waits."""
        self._task: asyncio.Task[object] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._fired = False

    async def next(self, events: AsyncIterator[_Event]) -> _Event | None:
        """The next event, or None at the end; a stall or a dropped connection is a typed
        error."""
        loop = asyncio.get_running_loop()
        seconds = self._seconds
        if seconds is not None:
            self._task = asyncio.current_task()
            self._since = loop.time()
            if self._timer is None:
                self._timer = loop.call_at(self._since + seconds, self._check)
        failure: BaseException | None = None
        event: _Event | None = None
        try:
            event = await anext(events)
        except StopAsyncIteration:
            pass
        except BaseException as exc:  # (re-raised below, or replaced by the stall)
            failure = exc
        finally:
            self._since = None
        if isinstance(failure, TimeoutError) and not self._fired:
            raise _stalled(seconds) from None
        if self._fired:
            self._fired = False
            assert self._task is not None
            if self._task.uncancel() > 0:  # cancelled by someone else too
                raise (
                    failure
                    if isinstance(failure, asyncio.CancelledError)
                    else asyncio.CancelledError()
                )
            raise _stalled(seconds) from None
        if failure is not None:
            # Once the stream has started the client libraries no longer retry, and `openai`
            # wraps a dropped connection as if the host had never been reached: say what
            # happened.
            mapped = (
                transport_failure(failure, mid_stream=True)
                if isinstance(failure, Exception)
                else None
            )
            if mapped is None:
                raise failure
            raise mapped from failure
        return event

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        loop = asyncio.get_running_loop()
        now, since = loop.time(), self._since
        assert self._seconds is not None
        if since is not None and now - since >= self._seconds and self._task is not None:
            self._timer = None
            self._fired = True
            self._task.cancel()  # reaches the wait: the task is suspended in it
            return
        start = now if since is None else since
        self._timer = loop.call_at(start + self._seconds, self._check)


def _stalled(seconds: float | None) -> ProviderError:
    return ProviderError("timeout", f"the stream stalled: no data for {seconds} s", retryable=True)


# --- failures -----------------------------------------------------------------------------


class provider_errors:  # noqa: N801 (used as the function it was)
    """Turn every failure inside the block into a `ProviderError`.

    `map_library_error` maps the client library's own exceptions (None for others). Transport
    failures the library let through become `provider_unavailable` or `timeout`, and what
    reading an answer of an unexpected shape raises (`_MALFORMED`) `bad_response`. (A class,
    as `answer_within` is.)
    """

    __slots__ = ("_map",)

    def __init__(
        self, map_library_error: Callable[[Exception], ProviderError | None] | None = None
    ) -> None:
        self._map = map_library_error

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _: TracebackType | None
    ) -> None:
        if not isinstance(exc, Exception) or isinstance(exc, ProviderError):
            return  # (none, or one to let through as it is)
        if (own := _wrapped_provider_error(exc)) is not None:
            raise own from exc  # ours (a bounded body's), wrapped by a library
        mapped = self._map(exc) if self._map is not None else None
        error = mapped or transport_failure(exc, mid_stream=False)
        if error is None and isinstance(exc, _MALFORMED):
            error = ProviderError("bad_response", f"malformed response: {exc!r}"[:500])
        if error is not None:
            raise error from exc


_MALFORMED = (ValueError, TypeError, AttributeError, LookupError, OverflowError, RecursionError)
"""What reading an answer of an unexpected shape raises (a string where an object was, JSON
nested too deep, a number past a float's range): the server's fault, a `bad_response`."""


def _wrapped_provider_error(exc: BaseException) -> ProviderError | None:
    cause = exc.__cause__
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ProviderError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


def transport_failure(exc: BaseException, *, mid_stream: bool) -> ProviderError | None:
    """A typed error if `exc` (or an exception it was raised from) is an httpx transport error."""
    timeouts, transports = _transport_errors()
    cause: BaseException | None = exc
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, timeouts):
            what = "the stream timed out" if mid_stream else "the request timed out"
            return ProviderError("timeout", what, retryable=True)
        if isinstance(cause, transports):
            what = "the connection was lost mid-stream" if mid_stream else "the connection failed"
            detail = str(cause) or type(cause).__name__
            return ProviderError("provider_unavailable", f"{what}: {detail}", retryable=True)
        cause = cause.__cause__
    return None


def _redirect_loop(exc: BaseException) -> BaseException | None:
    """httpx's `TooManyRedirects`, if `exc` is it or was raised from it."""
    kinds: tuple[type[BaseException], ...] = tuple(
        module.TooManyRedirects for name in ("httpx2", "httpx") if (module := sys.modules.get(name))
    )
    cause: BaseException | None = exc
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, kinds):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


def _transport_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    timeouts: list[type[BaseException]] = []
    transports: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        module = sys.modules.get(name)
        if module is not None:
            timeouts.append(module.TimeoutException)
            transports.append(module.TransportError)
    return tuple(timeouts), tuple(transports)


def endpoint(url: object) -> str:
    """A request's URL as errors show it: scheme, host, port and path, so that a wrong host,
    port or path (a missing `/v1`) is visible, but no query or user info, which may hold a
    key."""
    parts = urlsplit(str(url))
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # IPv6
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def connection_error(url: object, exc: BaseException) -> ProviderError:
    """`provider_unavailable` for a request to `url` that got no (complete) answer, after
    retries; the message names the host and port it tried, or the redirect loop it was sent
    round (not retried: the server's configuration sends every try round it again)."""
    if (loop := _redirect_loop(exc)) is not None:
        where = endpoint(url)
        try:
            last = endpoint(loop.request.url)  # type: ignore[attr-defined]
        except RuntimeError:  # (httpx's error raises when it was made without its request)
            last = where
        if last != where:
            where = f"{where}, the last to {last}"
        message = f"a redirect loop: more than {MAX_REDIRECTS} redirects from {where}"
        return ProviderError("provider_unavailable", message, retryable=False)
    parts = urlsplit(str(url))
    port = parts.port or (443 if parts.scheme == "https" else 80)
    cause = exc.__cause__ or exc
    detail = str(cause) or type(cause).__name__  # a reset connection has no message
    message = f"the connection to {parts.hostname}:{port} failed: {detail} ({endpoint(url)})"
    return ProviderError("provider_unavailable", message, retryable=True)


def own_key_needed(error: ProviderError, variable: str) -> ProviderError:
    """`error` (an authentication failure of a config that named its own `base_url` and
    brought no key) with what to do about it: the environment's key was not sent (spec S1)."""
    if error.error_type != "authentication":
        return error
    message = (
        f"{error.message}; the provider config names its own base_url and has no api_key,"
        f" and this runtime's {variable} is only sent to the vendor's endpoint or to the"
        " runtime's own provider: give the session's provider its own api_key"
    )
    return ProviderError(
        error.error_type,
        message,
        status_code=error.status_code,
        retryable=error.retryable,
        retry_after=error.retry_after,
    )


def environment_header_names(variable: str) -> list[str]:
    """The names of the headers a client library adds from a variable of this process's
    environment (`OPENAI_CUSTOM_HEADERS`, `ANTHROPIC_CUSTOM_HEADERS`: `Name: value` lines), to
    switch them off where the environment's credentials must not go."""
    text = os.environ.get(variable, "")
    return [line.split(":", 1)[0].strip() for line in text.splitlines() if ":" in line]


def classify_status(status: int, text: str) -> tuple[ProviderErrorType, bool]:
    """The error type of an HTTP status, and whether retrying may help.

    `text` is what the server said (error type, code, message): only a 400 saying the prompt
    is too long tells `context_length` from `bad_request`.
    """
    if status == 429:
        return "rate_limit", True
    if status in (401, 403):
        return "authentication", False
    if status == 408:
        return "timeout", True
    if status >= 500:  # 529 is Anthropic's "overloaded"
        return "provider_unavailable", True
    if status == 413 or CONTEXT_LENGTH.search(text):
        return "context_length", False
    return "bad_request", False


def status_error(
    status: int,
    detail: str,
    *,
    url: object = None,
    kind: str = "",
    retry_after: float | None = None,
    retryable: bool | None = None,
) -> ProviderError:
    """The `ProviderError` for an HTTP error answer.

    Args:
        status: The HTTP status.
        detail: The server's message.
        url: The URL requested, named in the message (see `endpoint`).
        kind: The server's error type and code, which help classify it.
        retry_after: Seconds the server asked to wait.
        retryable: Overrides the status's default (out of quota is a 429 waiting won't fix).
    """
    error_type, default_retryable = classify_status(status, f"{kind} {detail}")
    where = f" ({endpoint(url)})" if url is not None else ""
    return ProviderError(
        error_type,
        f"HTTP {status}: {detail}{where}",
        status_code=status,
        retryable=default_retryable if retryable is None else retryable,
        retry_after=retry_after,
    )


_STREAM_ERROR_STATUS = {
    "rate_limit": 429,
    "overloaded": 529,
    "authentication": 401,
    "permission": 403,
    "context_length": 400,
    "invalid_request": 400,
    "request_too_large": 413,
    "not_found": 404,
    "timeout": 408,
}
"""Error type or code names (Anthropic's and OpenAI's) and the status they stand for."""


def stream_error(kind: str | None, detail: str) -> ProviderError:
    """The error for a failure the server reported inside a successful (200) stream."""
    kind = kind or ""
    status = _kind_status(kind) or 500
    error_type, retryable = classify_status(status, f"{kind} {detail}")
    return ProviderError(
        error_type, f"the stream failed: {kind + ': ' if kind else ''}{detail}", retryable=retryable
    )


def _kind_status(kind: str) -> int | None:
    """The HTTP status an error type or code stands for, if it names a known one."""
    return next((s for name, s in _STREAM_ERROR_STATUS.items() if name in kind), None)


def unexpected_answer(body: object, expected: str) -> ProviderError:
    """The error for a successful (200) answer that is not what was asked for (`expected`).

    Some proxies send their errors with a 200: a body holding an error object keeps the
    server's message, typed by the error's type or code when it names one (such as a rate
    limit), else `bad_response`. Any other body is a `bad_response` quoting its start. Neither
    is retried unless the error's type says so: the same request would get the same answer.
    """
    error = body.get("error") if isinstance(body, dict) else None
    fields = error if isinstance(error, dict) else {}
    message = fields.get("message") if isinstance(error, dict) else error
    if isinstance(message, str) and message.strip():
        kind = f"{fields.get('code') or ''} {fields.get('type') or ''}".strip()
        detail = f"the server answered with an error: {kind + ': ' if kind else ''}{message}"
        status = _kind_status(kind)
        if status is None:
            return ProviderError("bad_response", detail)
        error_type, retryable = classify_status(status, f"{kind} {message}")
        return ProviderError(error_type, detail, retryable=retryable)
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, default=str)
    excerpt = " ".join(text.split())
    if len(excerpt) > 200:
        excerpt = excerpt[:199] + "…"
    return ProviderError("bad_response", f"expected {expected}: {excerpt or 'an empty body'}")


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds a `retry-after-ms` or `retry-after` header asks to wait, if any."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return float(headers[name]) * scale
        except (KeyError, ValueError):
            continue  # absent, or an HTTP date: too rare to parse
    return None


# --- responses ----------------------------------------------------------------------------


def tool_call(call_id: str | None, name: str, arguments: str | None) -> ToolCall:
    """A `ToolCall`, with an id made up if the server sent none."""
    # Some local servers omit ids; the loop needs one to pair each result with its call.
    call_id = call_id or f"call_{uuid.uuid4().hex[:24]}"
    return ToolCall(id=call_id, name=name, arguments=arguments or "")
