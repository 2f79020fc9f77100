"""HTTP/1.1 over asyncio: the transport of the providers' HTTP client (`_http`) for a direct
connection. httpx2's requests are sent over `_network`'s connections and parsed by h11 (the
protocol machine httpcore2 itself uses), with a pool of idle connections kept for reuse.

httpx2's own transport (httpcore2) guards its pool with anyio's locks and events even under
asyncio, and scans every connection whenever a request starts or ends: with a thousand
sessions' calls in flight that held budget lines out of reach (docs/performance.md, item 18).
It is used where this one has nothing to offer: through a proxy, and for HTTP/2.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Mapping

import h11
import httpx2

from trimtab.providers import _network as network

_READ_SIZE = 64 * 1024

_Origin = tuple[bytes, bytes, int]
"""Scheme, host and port: the connections one of them can reuse."""

_Timeouts = Mapping[str, float | None]
"""httpx2's `timeout` request extension: connect, read, write and pool, in seconds."""


class _Connection:
    """One HTTP/1.1 connection: its stream, and h11's state of the exchange on it."""

    __slots__ = ("idle_since", "stream", "wire")

    def __init__(self, stream: network.AsyncioStream) -> None:
        self.stream = stream
        self.wire = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    async def send(self, request: httpx2.Request, timeouts: _Timeouts) -> h11.Response:
        """Write `request` whole, then read its answer's head."""
        write = timeouts.get("write")
        await self.stream.write(self._head(request), write)
        assert isinstance(request.stream, httpx2.AsyncByteStream)
        async for chunk in request.stream:
            await self.stream.write(self._bytes(h11.Data(data=chunk)), write)
        await self.stream.write(self._bytes(h11.EndOfMessage()), write)
        while True:
            event = await self.next_event(timeouts.get("read"))
            if isinstance(event, h11.Response):
                return event
            if not isinstance(event, h11.InformationalResponse):  # (a `100 Continue`)
                raise httpx2.RemoteProtocolError(f"an answer began with {type(event).__name__}")

    async def next_event(self, timeout: float | None) -> h11.Event:
        """The answer's next part, reading as much as it takes."""
        wire = self.wire
        while True:
            try:
                event = wire.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx2.RemoteProtocolError(str(exc)) from exc
            if event is h11.NEED_DATA:
                wire.receive_data(await self.stream.read(_READ_SIZE, timeout))
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx2.RemoteProtocolError("the server closed the connection mid-answer")
            else:
                assert not isinstance(event, type)  # (h11's PAUSED: a client never pipelines)
                return event

    def _head(self, request: httpx2.Request) -> bytes:
        # (Its own frame: h11's copy of the headers is not kept while the answer is awaited.)
        head = h11.Request(
            method=request.method, target=request.url.raw_path, headers=request.headers.raw
        )
        return self._bytes(head)

    def next_cycle(self) -> bool:
        """Make the connection ready for its next exchange, if both sides ended their
        messages and keep it open; whether it is."""
        wire = self.wire
        if wire.our_state is h11.DONE and wire.their_state is h11.DONE:
            wire.start_next_cycle()
            return self.stream.idle_and_open
        return False

    def _bytes(self, event: h11.Event) -> bytes:
        try:
            data = self.wire.send(event)
        except h11.LocalProtocolError as exc:
            raise httpx2.LocalProtocolError(str(exc)) from exc
        return data or b""


class _Body(httpx2.AsyncByteStream):
    """An answer's body as it arrives; closing it returns its connection to the pool."""

    def __init__(
        self, pool: Transport, origin: _Origin, connection: _Connection, timeout: float | None
    ) -> None:
        self._pool = pool
        self._origin = origin
        self._connection: _Connection | None = connection
        self._timeout = timeout
        self._ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            raise httpx2.StreamClosed()
        while not self._ended:
            event = await connection.next_event(self._timeout)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._ended = True

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(self._origin, connection, ended=self._ended)


class Transport(httpx2.AsyncBaseTransport):
    """httpx2's transport for HTTP/1.1 over asyncio, with `limits` on its connections."""

    def __init__(self, *, verify: ssl.SSLContext | bool | None, limits: httpx2.Limits) -> None:
        self._verify = verify  # None: trust no certificate (every HTTPS server fails)
        self._slots = asyncio.Semaphore(limits.max_connections) if limits.max_connections else None
        self._keep = limits.max_keepalive_connections
        self._expiry = limits.keepalive_expiry
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._closed = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeouts: _Timeouts = request.extensions.get("timeout", {})
        url = request.url
        scheme = url.raw_scheme
        if scheme not in (b"http", b"https"):
            raise httpx2.UnsupportedProtocol(f"the URL's scheme must be http or https: {url}")
        origin = (scheme, url.raw_host, url.port or (443 if scheme == b"https" else 80))
        await self._acquire(timeouts.get("pool"))
        connection = None
        try:
            connection = self._take(origin) or await self._open(origin, timeouts.get("connect"))
            head = await connection.send(request, timeouts)
        except BaseException:
            if connection is not None:
                connection.stream.close()
            self._release_slot()
            raise
        return httpx2.Response(
            head.status_code,
            headers=head.headers.raw_items(),
            stream=_Body(self, origin, connection, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": head.reason},
        )

    def release(self, origin: _Origin, connection: _Connection, *, ended: bool) -> None:
        """Take back a connection whose answer was read to its end (`ended`) or abandoned."""
        self._release_slot()
        if ended and not self._closed and connection.next_cycle():
            if self._keep is None or self._idle_count < self._keep:
                connection.idle_since = time.monotonic()
                self._idle.setdefault(origin, []).append(connection)
                self._idle_count += 1
                return
        connection.stream.close()

    async def aclose(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.stream.close()
        self._idle.clear()
        self._idle_count = 0

    async def _acquire(self, timeout: float | None) -> None:
        slots = self._slots
        if slots is None:
            return
        if not slots.locked():
            await slots.acquire()  # (no wait: no timer)
            return
        try:
            async with asyncio.timeout(timeout):
                await slots.acquire()
        except TimeoutError:
            raise httpx2.PoolTimeout(f"no connection free within {timeout} s") from None

    def _release_slot(self) -> None:
        if self._slots is not None:
            self._slots.release()

    def _take(self, origin: _Origin) -> _Connection | None:
        """The most recently used idle connection to `origin` still open and fresh."""
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            fresh = self._expiry is None or now - connection.idle_since < self._expiry
            if fresh and connection.stream.idle_and_open:
                return connection
            connection.stream.close()
        return None

    async def _open(self, origin: _Origin, timeout: float | None) -> _Connection:
        scheme, raw_host, port = origin
        host = raw_host.decode("ascii")
        stream = await network.connect(host, port, timeout)
        if scheme == b"https":
            stream = await stream.start_tls(self._tls(), server_hostname=host, timeout=timeout)
        return _Connection(stream)

    def _tls(self) -> ssl.SSLContext:
        # Made on the first HTTPS connection: loading the certificate store is not free, and
        # a server reached over plain HTTP (a local model) never needs it.
        if self._verify is None:
            self._verify = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        elif not isinstance(self._verify, ssl.SSLContext):
            self._verify = httpx2.create_ssl_context(verify=self._verify)
        return self._verify
