"""httpcore2's network backend on asyncio's own transports, for the Chat Completions client.

httpcore2 reaches the network through anyio on asyncio, which costs every read a cancel scope
and two `epoll_ctl` calls (reading is resumed and paused around each one): ~20 µs of the
~100 µs a streamed delta takes from the socket to an `on()` handler (docs/performance.md,
streaming). Here a connection is an `asyncio.Protocol` that keeps reading, up to a bounded
buffer, and a read only waits when nothing is buffered.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections import deque
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2

READ_BUFFER_LIMIT = 256 * 1024
"""Bytes a connection buffers before it stops reading the socket until some are read."""

_HAPPY_EYEBALLS_DELAY = 0.25
"""Seconds before trying a host's next address in parallel (RFC 8305), as anyio does."""


def transport(*, verify: ssl.SSLContext | bool, limits: httpx2.Limits) -> httpx2.AsyncHTTPTransport:
    """httpx2's transport (no proxy) with its connections made by `AsyncioBackend`."""
    result = httpx2.AsyncHTTPTransport(verify=verify, limits=limits)
    # The transport takes no backend: its pool does, and reads it when it opens a connection
    # (a test checks that the requests go through `AsyncioBackend`).
    result._pool._network_backend = AsyncioBackend()
    return result


class _Connection(asyncio.Protocol):
    """One connection's received bytes, and whether writing must wait."""

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
        """Wait until bytes arrive or the connection ends; raise `httpcore2.ReadTimeout` after
        `timeout` seconds. (A timer on this future, not `asyncio.timeout` on the task: no
        cancellation to undo, at a third of the cost per read.)"""
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
        waiter.set_exception(httpcore2.ReadTimeout(f"no data within {timeout} s"))


class AsyncioStream(httpcore2.AsyncNetworkStream):
    """A connection as httpcore2 reads and writes it."""

    def __init__(self, transport: asyncio.Transport, connection: _Connection) -> None:
        self._transport = transport
        self._connection = connection

    @property
    def buffered(self) -> int:
        """Bytes received and not read yet (at most about `READ_BUFFER_LIMIT`)."""
        return self._connection.buffered

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        connection = self._connection
        if not connection.chunks and not connection.ended:
            await connection.received(timeout)
        if connection.chunks:
            return connection.take(max_bytes)
        if connection.error is not None:
            raise httpcore2.ReadError(str(connection.error)) from connection.error
        return b""  # the peer closed the connection: httpcore2 tells what that means

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore2.WriteError("the connection is closed")
        try:
            self._transport.write(buffer)
            async with asyncio.timeout(timeout):
                await self._connection.drained()
        except TimeoutError:
            raise httpcore2.WriteTimeout(f"could not write within {timeout} s") from None
        except (OSError, RuntimeError) as exc:
            raise httpcore2.WriteError(str(exc)) from exc
        if self._connection.error is not None:
            raise httpcore2.WriteError(str(self._connection.error))

    async def aclose(self) -> None:
        self._transport.abort()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                tls = await loop.start_tls(
                    self._transport, self._connection, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError:
            self._transport.abort()
            raise httpcore2.ConnectTimeout(f"no TLS handshake within {timeout} s") from None
        except (OSError, ssl.SSLError) as exc:
            self._transport.abort()
            raise httpcore2.ConnectError(str(exc)) from exc
        if tls is None:  # the connection was closed meanwhile
            raise httpcore2.ConnectError("the connection closed during the TLS handshake")
        assert isinstance(tls, asyncio.Transport)
        self._connection.transport = tls
        return AsyncioStream(tls, self._connection)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # Bytes or an end on an idle connection: the server closed it (or broke the
            # protocol), so the pool does not reuse it.
            return bool(self._connection.chunks) or self._connection.ended
        name = {"client_addr": "sockname", "server_addr": "peername"}.get(info, info)
        if name in ("ssl_object", "socket", "sockname", "peername"):
            return self._transport.get_extra_info(name)
        return None


class AsyncioBackend(httpcore2.AsyncNetworkBackend):
    """Opens `AsyncioStream` connections."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, connection = await loop.create_connection(
                    _Connection,
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                    # A numeric address has nothing to race (and the race costs tasks).
                    happy_eyeballs_delay=None if _numeric(host) else _HAPPY_EYEBALLS_DELAY,
                )
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"could not connect within {timeout} s") from None
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        # asyncio sets TCP_NODELAY itself, as anyio does.
        sock = transport.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        assert isinstance(transport, asyncio.Transport)
        return AsyncioStream(transport, connection)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
