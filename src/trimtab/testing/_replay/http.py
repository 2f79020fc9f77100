"""Just enough HTTP/1.1 for the replay server, on `asyncio` streams (tests need no framework).

Besides answering, it can misbehave the ways real servers and networks do: stall before or in
the middle of a body, close the connection half-way through it, or reset it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

__all__ = ["Delivery", "HttpRequest", "HttpResponse", "json_response", "read_request", "reset"]


@dataclass
class HttpRequest:
    """One request as read from the connection."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    """Names lower-cased."""
    body: bytes


@dataclass
class HttpResponse:
    """A response to send."""

    status: int
    pieces: list[bytes]
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False
    """Send with chunked transfer encoding, one chunk a piece (for SSE)."""


@dataclass(frozen=True)
class Delivery:
    """How to send a response: on time, or misbehaving."""

    stall: float = 0.0
    """Seconds to wait before the body (or before piece `stall_after` of a chunked one)."""
    stall_after: int = 0
    cut_after: int | None = None
    """Close the connection after this many pieces (after half the body if not chunked)."""


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> HttpResponse:
    """A JSON response."""
    return HttpResponse(status, [json.dumps(body).encode()], headers=headers or {})


async def read_request(reader: asyncio.StreamReader) -> HttpRequest | None:
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
    path, _, query = target.partition("?")
    return HttpRequest(method, path, dict(parse_qsl(query)), headers, body)


async def send(writer: asyncio.StreamWriter, response: HttpResponse, delivery: Delivery) -> bool:
    """Send `response`; return False if the connection was cut on purpose (close it)."""
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
    if not response.chunked:
        body = b"".join(response.pieces)
        await asyncio.sleep(delivery.stall)
        writer.write(body if delivery.cut_after is None else body[: len(body) // 2])
        await writer.drain()
        return delivery.cut_after is None
    for index, piece in enumerate(response.pieces):
        if index == delivery.stall_after:
            await asyncio.sleep(delivery.stall)
        if index == delivery.cut_after:
            return False
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    return True


def reset(writer: asyncio.StreamWriter) -> None:
    """Reset the connection (TCP RST), as a crashed server or a dropping proxy would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # A zero linger time makes close() send RST instead of FIN.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
