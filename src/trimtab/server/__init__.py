"""`trimtab serve`: the runtime over JSON-RPC, in the Copilot SDK's protocol.

Programs written against the GitHub Copilot SDK run on trimtab unchanged: point the official
client at `serve` (TCP) or let it spawn `trimtab serve --stdio`. The package is an adapter
(`framing` and `rpc` carry JSON-RPC, `copilot` maps its methods onto `trimtab.Client` and
`Session` calls, `hub` shares open sessions between connections); it holds no domain logic.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from trimtab import Client
from trimtab.server.copilot import CANCELLABLE, CopilotConnection
from trimtab.server.hub import SessionHub
from trimtab.server.rpc import Connection
from trimtab.store import Store

__all__ = ["serve"]

log = logging.getLogger("trimtab.server")

_STREAM_LIMIT = 1024 * 1024
"""Bytes a header line may take before the reader gives up (bodies are not limited by it)."""


async def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    stdio: bool = False,
    store: Store | str | os.PathLike[str] | None = None,
    token: str | None = None,
    provider: dict[str, Any] | None = None,
    lease_ttl: float = 30.0,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve the Copilot protocol: over TCP until cancelled, or over stdio until stdin closes.

    Args:
        host: The address to listen on. Anything but loopback needs a `token`.
        port: The TCP port; 0 picks a free one.
        stdio: Speak on this process's stdin and stdout instead of TCP. Nothing but frames
            is written to stdout then: stray writes to it are redirected to stderr.
        store: Where session logs live, as for `trimtab.Client`.
        token: The connection token clients must send in `connect`.
        provider: The provider of sessions created without a BYOK `provider`.
        lease_ttl: Seconds a session's lease outlives this server if it dies without letting
            go: another server sharing the store takes the session over after that.
        on_ready: Called with the port once listening (TCP); by default the server prints
            `listening on port N` to stdout, the line the official clients wait for.

    Raises:
        ValueError: A non-loopback `host` without a `token`.
    """
    if not stdio and token is None and not _is_loopback(host):
        raise ValueError(
            f"refusing to listen on {host!r} without a connection token: "
            "anyone who can reach it could drive your sessions (pass a token, or use 127.0.0.1)"
        )
    # Checks for queued input and expired leases at least every second, faster for short
    # leases, so that a takeover follows soon after the lease expires.
    poll = min(1.0, lease_ttl / 10)
    async with Client(
        store=store, provider=provider, lease_ttl=lease_ttl, poll_interval=poll
    ) as client:
        hub = SessionHub(client)
        try:
            if stdio:
                await _serve_stdio(hub, token)
            else:
                await _serve_tcp(hub, host, port, token, on_ready or _announce)
        finally:
            await hub.close_all()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost could resolve anywhere


def _announce(port: int) -> None:
    print(f"listening on port {port}", flush=True)


async def _serve_tcp(
    hub: SessionHub, host: str, port: int, token: str | None, on_ready: Callable[[int], None]
) -> None:
    handlers: set[asyncio.Task[Any]] = set()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Small frames (events, answers) must not wait ~40 ms for Nagle's algorithm.
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            conn = Connection(reader, writer, cancellable=CANCELLABLE)
            await CopilotConnection(conn, hub, token=token).serve()
        except asyncio.CancelledError:
            pass  # the server is stopping; 3.11 would report a cancelled handler as an error
        except Exception:
            log.exception("connection failed")
        finally:
            handlers.discard(task)

    server = await asyncio.start_server(on_client, host, port, limit=_STREAM_LIMIT)
    on_ready(server.sockets[0].getsockname()[1])
    try:
        await asyncio.Event().wait()  # until cancelled
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def _serve_stdio(hub: SessionHub, token: str | None) -> None:
    reader, writer = await _stdio_streams()
    conn = Connection(reader, writer, cancellable=CANCELLABLE)
    await CopilotConnection(conn, hub, token=token).serve()


async def _stdio_streams() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams on stdin and stdout; afterwards fd 1 points at stderr.

    The official Python client treats any stdout line that is not a frame header as the end
    of the connection, so frames get a private copy of stdout and everything else that
    writes to fd 1 (a stray print, a C library) lands on stderr.
    """
    frames = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_STREAM_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(_PipeWriter, frames)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class _PipeWriter(asyncio.streams.FlowControlMixin):
    """The protocol of a write-only pipe under a `StreamWriter`: flow control (from the
    mixin) and the close waiter that `StreamWriter.wait_closed` asks its protocol for."""

    def __init__(self) -> None:
        super().__init__()
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed
