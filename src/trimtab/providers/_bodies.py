"""Every answer's body is read with a limit, whichever provider reads it (spec M3).

A model server, or a proxy in front of one, can send without end: an answer that never
closes, an event stream whose events keep coming, one line that never ends. The stall timeout
does not fire while bytes arrive, and the client libraries buffer what they are sent (a line
of an event stream, a JSON body, an error's body), so the limit sits under all of them: an
httpx event hook puts a counting stream in place of each response's body before anything
reads it. The one HTTP client every provider sends through (`_http.HttpClient`, which the
`openai` and `anthropic` libraries are given too) is built with `bounded_answers()`.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

import httpx2

from trimtab._errors import ProviderError

__all__ = [
    "ACCEPT_ENCODING",
    "ERROR_BODY_LIMIT",
    "MAX_ANSWER_BYTES",
    "MAX_EVENT_BYTES",
    "bounded_answers",
]

MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The most bytes one answer may hold, streamed or not: past it, a `bad_response`. A stream of
128k tokens, one chunk of JSON per token, is ~30 MB."""

MAX_EVENT_BYTES = 8 * 1024 * 1024
"""The longest line of an event stream. One event is one line of JSON; the longest is the
Responses API's last, which repeats the whole answer. The `anthropic` library joins a line's
pieces one copy at a time, so that an endless line would cost time as the square of its length."""

ERROR_BODY_LIMIT = 64 * 1024
"""The bytes of an error's body read for its message; the rest is not read."""


def bounded_answers(
    request: Callable[[httpx2.Request], Awaitable[None]] | None = None,
) -> dict[str, list[Any]]:
    """The `event_hooks` of an httpx2 client whose answers' bodies are read with a limit,
    with `request` as its request hook, if given."""
    return {"response": [bound_answer], "request": [request] if request else []}


async def bound_answer(response: httpx2.Response) -> None:
    """The response hook of `bounded_answers`: `response`'s body is read within the limits."""
    if isinstance(response.stream, httpx2.AsyncByteStream):  # an async client's always is
        content_type = response.headers.get("content-type", "")
        encodings = _encodings(response.headers)
        if encodings:
            # Decoded here, within the limits: httpx would inflate a few compressed bytes
            # into gigabytes before anything above it could count them.
            del response.headers["content-encoding"]
        response.stream = _BoundedBody(
            response.stream,
            error=response.is_error,
            stream=content_type.split(";")[0].strip().lower() == "text/event-stream",
            encodings=encodings,
        )


def _encodings(headers: httpx2.Headers) -> list[str]:
    """The body's content codings, in the order they were applied (identity left out)."""
    encodings = [
        coding.strip().lower()
        for value in headers.get_list("content-encoding")
        for coding in value.split(",")
    ]
    encodings = [coding for coding in encodings if coding not in ("", "identity")]
    unknown = [coding for coding in encodings if coding not in _WBITS]
    if unknown:
        raise ProviderError(
            "bad_response", f"the answer is encoded as {', '.join(unknown)}, which is not read"
        )
    return encodings


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""zlib's window bits for each coding read (only these are asked for: `ACCEPT_ENCODING`)."""

ACCEPT_ENCODING = "gzip, deflate"
"""What the clients ask for, whatever decoders happen to be installed (brotli, zstd)."""

_PIECE = 64 * 1024
"""The most bytes one step of decoding makes, so that a bomb is caught a piece at a time."""


class _Inflater:
    """One content coding undone, a bounded piece at a time."""

    def __init__(self, coding: str) -> None:
        self._coding = coding
        self._inflate = zlib.decompressobj(_WBITS[coding])
        self._first = True

    def pieces(self, data: bytes) -> Iterator[bytes]:
        try:
            piece = self._inflate.decompress(data, _PIECE)
        except zlib.error:
            if not (self._first and self._coding == "deflate"):
                raise
            # Some servers send raw deflate, without zlib's header (as httpx allows).
            self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            piece = self._inflate.decompress(data, _PIECE)
        self._first = False
        while piece:
            yield piece
            piece = self._inflate.decompress(self._inflate.unconsumed_tail, _PIECE)


class _BoundedBody(httpx2.AsyncByteStream):
    """A response's body that ends (an error's) or fails (an answer's) past its limit."""

    def __init__(
        self, body: httpx2.AsyncByteStream, *, error: bool, stream: bool, encodings: list[str]
    ) -> None:
        self._body = body
        self._error = error
        self._stream = stream
        self._inflaters = [_Inflater(coding) for coding in reversed(encodings)]

    async def _decoded(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._body:
                pieces: Iterable[bytes] = (chunk,)
                for inflater in self._inflaters:  # the last coding applied first
                    pieces = _chained(inflater, pieces)
                for piece in pieces:
                    yield piece
        except zlib.error as exc:
            raise ProviderError("bad_response", f"the answer's encoding is broken: {exc}") from None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        line = 0  # bytes since the last line break
        async for chunk in self._decoded() if self._inflaters else self._body:
            total += len(chunk)
            if self._error:
                if total >= ERROR_BODY_LIMIT:
                    yield chunk[: len(chunk) - (total - ERROR_BODY_LIMIT)]
                    return  # its start says what went wrong
            elif total > MAX_ANSWER_BYTES:
                raise ProviderError(
                    "bad_response", f"the answer is larger than {MAX_ANSWER_BYTES} bytes"
                )
            elif self._stream:
                end = chunk.rfind(b"\n")
                line = line + len(chunk) if end < 0 else len(chunk) - end - 1
                if line > MAX_EVENT_BYTES:
                    raise ProviderError(
                        "bad_response",
                        f"an event of the stream is longer than {MAX_EVENT_BYTES} bytes",
                    )
            yield chunk

    async def aclose(self) -> None:
        await self._body.aclose()


def _chained(inflater: _Inflater, pieces: Iterable[bytes]) -> Iterator[bytes]:
    for piece in pieces:
        yield from inflater.pieces(piece)
