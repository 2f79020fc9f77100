"""LSP-style framing: `Content-Length: N`, a blank line, then exactly N bytes of JSON.

Strict on the way out and tolerant on the way in. The official Python Copilot client reads
exactly one header line and discards the next, so every frame we write carries the one
`Content-Length` header and nothing else. Other clients (vscode-jsonrpc) may send several
headers, in any case, with `\\n` or `\\r\\n` line ends: the reader accepts all of that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["MAX_FRAME", "FramingError", "encode_frame", "read_frame"]

MAX_FRAME = 64 * 1024 * 1024
"""The largest body we accept (64 MiB): a bigger `Content-Length` is refused, not allocated."""

_MAX_HEADER_LINE = 8 * 1024
_MAX_HEADER_LINES = 32


class FramingError(Exception):
    """The byte stream is not a sequence of frames; it cannot be resynchronised."""


def encode_frame(body: bytes) -> bytes:
    """One frame: the `Content-Length` header, a blank line, then `body`."""
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


async def read_frame(
    reader: asyncio.StreamReader,
    *,
    max_size: int | Callable[[], int] = MAX_FRAME,
    timeout: float | None = None,
) -> bytes | None:
    """The body of the next frame, or None when the stream ends cleanly between frames.

    `max_size` may be a function, asked once the frame's header has arrived: the limit may
    change while the reader waits for a frame (a peer that authenticated meanwhile).

    Waiting for a frame to begin is not limited; once its first byte has arrived, its header
    must be complete within `timeout` seconds, and its body may not pause for longer than
    that (None: no limit), so that a peer cannot hold a reader with a frame it never ends.

    Raises:
        FramingError: A header is malformed or missing `Content-Length`, the length is out of
            range, the stream ends inside a frame, or the frame stalls past `timeout`.
    """
    while True:
        first = await reader.read(1)
        if not first:
            return None
        try:
            async with asyncio.timeout(timeout):
                length = await _read_header(reader, first)
        except TimeoutError:
            raise FramingError(f"a frame header took more than {timeout:g} s") from None
        if length is None:
            continue  # stray blank lines between frames are harmless
        limit = max_size() if callable(max_size) else max_size
        if length > limit:
            raise FramingError(f"Content-Length {length} exceeds the limit of {limit} bytes")
        return await _read_body(reader, length, timeout)


async def _read_header(reader: asyncio.StreamReader, first: bytes) -> int | None:
    """The `Content-Length` of a header whose first byte was `first`; None for a blank line."""
    length: int | None = None
    headers = 0
    pending = first
    while True:
        line = await _read_line(reader, pending)
        pending = b""
        if line is None:
            raise FramingError("the stream ended inside a frame header")
        if not line.strip():
            if headers == 0:
                return None
            break
        headers += 1
        if headers > _MAX_HEADER_LINES:
            raise FramingError(f"more than {_MAX_HEADER_LINES} header lines")
        length = _header_length(line, length)
    if length is None:
        raise FramingError("the frame has no Content-Length header")
    return length


async def _read_body(reader: asyncio.StreamReader, length: int, stall: float | None) -> bytes:
    if stall is None:
        try:
            return await reader.readexactly(length)
        except asyncio.IncompleteReadError as exc:
            raise _cut(len(exc.partial), length) from None
    body = bytearray()
    while len(body) < length:
        try:
            async with asyncio.timeout(stall):
                chunk = await reader.read(length - len(body))
        except TimeoutError:
            raise FramingError(f"a frame body paused for more than {stall:g} s") from None
        if not chunk:
            raise _cut(len(body), length)
        body += chunk
    return bytes(body)


def _cut(received: int, length: int) -> FramingError:
    return FramingError(f"the stream ended after {received} of {length} body bytes")


async def _read_line(reader: asyncio.StreamReader, start: bytes = b"") -> bytes | None:
    """One header line (beginning with `start`, already read) without its line end; None at
    a clean end of the stream."""
    try:
        line = start if start == b"\n" else start + await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if not (start or exc.partial):
            return None
        raise FramingError("the stream ended inside a frame header") from None
    except asyncio.LimitOverrunError:
        raise FramingError("a header line is too long") from None
    if len(line) > _MAX_HEADER_LINE:
        raise FramingError("a header line is too long")
    return line.rstrip(b"\r\n")


def _header_length(line: bytes, length: int | None) -> int | None:
    """`length` updated by one header line (only `Content-Length` matters)."""
    name, colon, value = line.partition(b":")
    if not colon or not name.strip():
        raise FramingError(f"malformed header line {line[:80]!r}")
    if name.strip().lower() != b"content-length":
        return length  # Content-Type and friends are allowed and ignored
    text = value.strip()
    # At most 18 digits: `int` refuses more than 4,300, and no frame is that long anyway.
    if not text.isdigit() or len(text) > 18:
        raise FramingError(f"Content-Length is not a non-negative integer: {text[:40]!r}")
    return int(text)
