"""Connections on asyncio's own transports, for `_http11`.

Through anyio (httpcore2's way to the network), every read enters a cancel scope and resumes
and pauses the transport's reading around its wait (docs/performance.md, item 11). Here a
connection is an `asyncio.Protocol` that keeps reading, up to a bounded buffer, and a read only
waits when nothing is buffered.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections import deque

import httpx2

READ_BUFFER_LIMIT = 256 * 1024
"""Bytes a connection buffers before it stops reading the socket until some are read."""

_HAPPY_EYEBALLS_DELAY = 0.25
"""Seconds before trying a host's next address in parallel (RFC 8305), as anyio does."""


class _Connection(asyncio.Protocol):
    """One connection's received bytes, and whether writing must wait."""

    __slots__ = (
        "_drained", "_waiter", "buffered", "chunks", "ended", "error", "paused", "transport"
    )  # fmt: skip

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.ended = False
        """The peer closed its side, or the connection was lost."""
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > READ_BUFFER_LIMIT and not self.paused and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def received(self, timeout: float | None) -> None:
        """Wait until bytes arrive or the connection ends; raise `httpx2.ReadTimeout` after
        `timeout` seconds. (A timer on this future, not `asyncio.timeout` on the task: no
        cancellation to undo.)"""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _expire, waiter, timeout)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def drained(self) -> None:
        """Wait until the transport takes writes again (or the connection ends)."""
        if self._drained is not None:
            await asyncio.shield(self._drained)

    def take(self, max_bytes: int) -> bytes:
        data = self.chunks.popleft()
        if len(data) > max_bytes:
            self.chunks.appendleft(data[max_bytes:])
            data = data[:max_bytes]
        self.buffered -= len(data)
        if self.paused and self.buffered <= READ_BUFFER_LIMIT and self.transport is not None:
            self.transport.resume_reading()
            self.paused = False
        return data


def _numeric(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _expire(waiter: asyncio.Future[None], timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(httpx2.ReadTimeout(f"no data within {timeout} s"))


class AsyncioStream:
    """A connection as the HTTP client reads and writes it."""

    __slots__ = ("_connection", "_transport")

    def __init__(self, transport: asyncio.Transport, connection: _Connection) -> None:
        self._transport = transport
        self._connection = connection

    @property
    def buffered(self) -> int:
        """Bytes received and not read yet (at most about `READ_BUFFER_LIMIT`)."""
        return self._connection.buffered

    @property
    def idle_and_open(self) -> bool:
        """Nothing arrived unasked and the peer has not closed: an idle connection that may
        be used again (bytes or an end on it mean the server closed it or broke the
        protocol)."""
        return not self._connection.chunks and not self._connection.ended

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Up to `max_bytes` received bytes, or `b""` once the peer closed its side."""
        connection = self._connection
        if not connection.chunks and not connection.ended:
            await connection.received(timeout)
        if connection.chunks:
            return connection.take(max_bytes)
        if connection.error is not None:
            raise httpx2.ReadError(str(connection.error)) from connection.error
        return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpx2.WriteError("the connection is closed")
        try:
            self._transport.write(buffer)
            async with asyncio.timeout(timeout):
                await self._connection.drained()
        except TimeoutError:
            raise httpx2.WriteTimeout(f"could not write within {timeout} s") from None
        except (OSError, RuntimeError) as exc:
            raise httpx2.WriteError(str(exc)) from exc
        if self._connection.error is not None:
            raise httpx2.WriteError(str(self._connection.error))

    def close(self) -> None:
        self._transport.abort()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> AsyncioStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                tls = await loop.start_tls(
                    self._transport, self._connection, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError:
            self._transport.abort()
            raise httpx2.ConnectTimeout(f"no TLS handshake within {timeout} s") from None
        except (OSError, ssl.SSLError) as exc:
            self._transport.abort()
            raise httpx2.ConnectError(str(exc)) from exc
        if tls is None:  # the connection was closed meanwhile
            raise httpx2.ConnectError("the connection closed during the TLS handshake")
        assert isinstance(tls, asyncio.Transport)
        self._connection.transport = tls
        return AsyncioStream(tls, self._connection)


async def connect(host: str, port: int, timeout: float | None = None) -> AsyncioStream:
    """A TCP connection to `host`, within `timeout` seconds."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            transport, connection = await loop.create_connection(
                _Connection,
                host,
                port,
                # A numeric address has nothing to race (and the race costs tasks).
                happy_eyeballs_delay=None if _numeric(host) else _HAPPY_EYEBALLS_DELAY,
            )
    except TimeoutError:
        raise httpx2.ConnectTimeout(f"could not connect within {timeout} s") from None
    except OSError as exc:
        raise httpx2.ConnectError(str(exc)) from exc
    assert isinstance(transport, asyncio.Transport)
    return AsyncioStream(transport, connection)  # (asyncio sets TCP_NODELAY itself)
