"""LSP-style framing: `Content-Length: N`, a blank line, then exactly N bytes of JSON.

Strict on the way out and tolerant on the way in. The official Python Copilot client reads
exactly one header line and discards the next, so every frame we write carries the one
`Content-Length` header and nothing else. Other clients (vscode-jsonrpc) may send several
headers, in any case, with `\\n` or `\\r\\n` line ends: the reader accepts all of that.
"""

from __future__ import annotations

import asyncio

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


async def read_frame(reader: asyncio.StreamReader, *, max_size: int = MAX_FRAME) -> bytes | None:
    """The body of the next frame, or None when the stream ends cleanly between frames.

    Raises:
        FramingError: A header is malformed or missing `Content-Length`, the length is out of
            range, or the stream ends inside a frame.
    """
    length: int | None = None
    headers = 0
    while True:
        line = await _read_line(reader)
        if line is None:
            if headers == 0:
                return None
            raise FramingError("the stream ended inside a frame header")
        if not line.strip():
            if headers == 0:
                continue  # stray blank lines between frames are harmless
            break
        headers += 1
        if headers > _MAX_HEADER_LINES:
            raise FramingError(f"more than {_MAX_HEADER_LINES} header lines")
        length = _header_length(line, length)
    if length is None:
        raise FramingError("the frame has no Content-Length header")
    if length > max_size:
        raise FramingError(f"Content-Length {length} exceeds the limit of {max_size} bytes")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FramingError(
            f"the stream ended after {len(exc.partial)} of {length} body bytes"
        ) from None


async def _read_line(reader: asyncio.StreamReader) -> bytes | None:
    """One header line without its line end; None at a clean end of the stream."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
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
    if not text.isdigit():
        raise FramingError(f"Content-Length is not a non-negative integer: {text[:40]!r}")
    return int(text)
