"""LSP framing: exactly one header out, tolerant headers in, clear errors for broken streams."""

from __future__ import annotations

import asyncio

import pytest

from trimtab.protocol.framing import FramingError, encode_frame, read_frame


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def test_a_frame_has_exactly_one_header() -> None:
    # The official Python client reads one header line and discards the next one.
    assert encode_frame(b'{"a":1}') == b'Content-Length: 7\r\n\r\n{"a":1}'
    assert encode_frame("é".encode()) == b"Content-Length: 2\r\n\r\n\xc3\xa9"


async def test_frames_are_read_back_to_back() -> None:
    reader = reader_of(encode_frame(b"[1]") + encode_frame(b"") + encode_frame(b"{}"))
    assert [await read_frame(reader) for _ in range(4)] == [b"[1]", b"", b"{}", None]


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: 2\r\n\r\n",
        b"content-length:2\n\n",  # any case, bare LF, no space
        b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\nContent-Length: 2\r\n\r\n",
        b"Content-Length: 2\r\nX-Extra: yes\r\n\r\n",
        b"\r\n\r\nContent-Length: 2\r\n\r\n",  # stray blank lines between frames
    ],
)
async def test_headers_are_read_tolerantly(head: bytes) -> None:
    reader = reader_of(head + b"{}")
    assert await read_frame(reader) == b"{}"
    assert await read_frame(reader) is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"Content-Type: text/plain\r\n\r\n{}", "no Content-Length"),
        (b"Content-Length: abc\r\n\r\n", "not a non-negative integer"),
        (b"Content-Length: -1\r\n\r\n", "not a non-negative integer"),
        (b"just some text\r\n\r\n", "malformed header"),
        (b": value\r\n\r\n", "malformed header"),
        (b"Content-Length: 99999999999\r\n\r\n", "exceeds the limit"),
        (b"Content-Length: 10\r\n\r\n{}", "ended after 2 of 10"),
        (b"Content-Length: 10\r\n", "ended inside a frame header"),
        (b"Content-Len", "ended inside a frame header"),
        (b"X: y\r\n" * 40 + b"\r\n", "header lines"),
    ],
)
async def test_broken_frames_are_framing_errors(data: bytes, reason: str) -> None:
    with pytest.raises(FramingError, match=reason):
        await read_frame(reader_of(data))


async def test_an_overlong_header_line_is_an_error() -> None:
    reader = asyncio.StreamReader(limit=1024)
    reader.feed_data(b"X" * 4096 + b"\r\n\r\n")
    reader.feed_eof()
    with pytest.raises(FramingError, match="too long"):
        await read_frame(reader)


async def test_the_size_limit_is_configurable() -> None:
    with pytest.raises(FramingError, match="exceeds"):
        await read_frame(reader_of(encode_frame(b"x" * 11)), max_size=10)
