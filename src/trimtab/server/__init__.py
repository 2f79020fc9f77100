"""`trimtab serve`: the runtime over JSON-RPC, in the Copilot SDK's protocol.

Programs written against the GitHub Copilot SDK run on trimtab unchanged: point the official
client at `serve` (TCP) or let it spawn `trimtab serve --stdio`. The package is an adapter
(`framing` and `rpc` carry JSON-RPC, `copilot` maps its methods onto `trimtab.Client` and
`Session` calls, `hub` shares open sessions between connections); it holds no domain logic.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from pydantic import ValidationError

from trimtab import Client
from trimtab._durations import check_seconds
from trimtab.protocol.errors import SERVER_BUSY
from trimtab.protocol.framing import encode_frame
from trimtab.protocol.jsonrpc import Connection
from trimtab.providers import ProviderConfig, make_provider
from trimtab.server.copilot import CANCELLABLE, CopilotConnection
from trimtab.server.hub import PENDING_TIMEOUT, SessionHub
from trimtab.store import DEFAULT_TIMEOUT, Store

__all__ = ["ServeError", "serve"]

log = logging.getLogger("trimtab.server")

_STREAM_LIMIT = 1024 * 1024
"""Bytes a header line may take before the reader gives up (bodies are not limited by it)."""

START_CHECK = 10.0
"""Seconds the store has to answer once before the server says it is ready (spec S4)."""

_FILE_MARGIN = 64
"""File descriptors kept beyond `max_connections` for the store, logs and providers."""


class ServeError(Exception):
    """The server cannot start: its store is unreachable, or a provider cannot be built."""


async def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    stdio: bool = False,
    store: Store | str | os.PathLike[str] | None = None,
    token: str | None = None,
    provider: dict[str, Any] | None = None,
    lease_ttl: float = 30.0,
    max_connections: int = 4096,
    max_output: int = 8 * 1024 * 1024,
    max_requests: int = 1000,
    frame_timeout: float = 10.0,
    connect_timeout: float = 5.0,
    idle_timeout: float = 300.0,
    pending_timeout: float = PENDING_TIMEOUT,
    store_timeout: float = DEFAULT_TIMEOUT,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve the Copilot protocol: over TCP until cancelled, or over stdio until stdin closes.

    The store and the provider are checked before the server says it is ready: a store that
    cannot be reached or a provider that cannot be built fails here, with one message.

    Args:
        host: The address to listen on. Anything but loopback needs a `token`.
        port: The TCP port; 0 picks a free one.
        stdio: Speak on this process's stdin and stdout instead of TCP. Nothing but frames
            is written to stdout then: stray writes to it are redirected to stderr.
        store: Where session logs live, as for `trimtab.Client`.
        token: The connection token clients must send in `connect`. An empty token is no
            token.
        provider: The provider of sessions created without a BYOK `provider`. It is the
            operator's: credentials from this process's environment go with it (spec S1).
        lease_ttl: Seconds a session's lease outlives this server if it dies without letting
            go: another server sharing the store takes the session over after that.
        max_connections: TCP connections served at once; one more gets a `SERVER_BUSY`
            error frame and is closed.
        max_output: Bytes of answers and events queued for one client and not yet sent past
            which that client is cut off (it stopped reading).
        max_requests: Requests one client may have in flight; more are refused.
        frame_timeout: Seconds a frame's header may take once it has begun, and the longest
            pause inside its body.
        connect_timeout: Seconds a TCP client has to authenticate, when there is a `token`.
        idle_timeout: Seconds a TCP connection may idle (nothing received, nothing in
            flight, no session attached) before it is closed.
        pending_timeout: Seconds the tool calls and permission requests a dropped client
            left unanswered wait for a client that resumes the session (spec D6).
        store_timeout: Seconds within which every call of the store the server opens
            completes or raises `StoreUnavailableError` (spec W1), so that a run the store
            holds up ends in an error and a request is answered with one; at start the store
            has at most `START_CHECK` seconds of it to answer. A `Store` passed in keeps its
            own `timeout`.
        on_ready: Called with the port once listening (TCP); by default the server prints
            `listening on port N` to stdout, the line the official clients wait for.

    Raises:
        ValueError: A non-loopback `host` without a `token`, an invalid `provider` or store
            spec, or a limit that is not positive.
        ServeError: The store cannot be reached, or the provider cannot be built.
    """
    token = token or None
    if not stdio and token is None and not _is_loopback(host):
        raise ValueError(
            f"refusing to listen on {host!r} without a connection token: "
            "anyone who can reach it could drive your sessions (pass a token, or use 127.0.0.1)"
        )
    if min(max_connections, max_output, max_requests) <= 0:
        raise ValueError("the server's limits must be positive")
    durations = {
        "lease_ttl": lease_ttl,
        "store_timeout": store_timeout,
        "pending_timeout": pending_timeout,
        "frame_timeout": frame_timeout,
        "connect_timeout": connect_timeout,
        "idle_timeout": idle_timeout,
    }
    for name, seconds in durations.items():
        check_seconds(name, seconds)
    limits = _Limits(max_output, max_requests, frame_timeout, connect_timeout, idle_timeout)
    await _check_provider(provider)
    # Checks for queued input and expired leases at least every second, faster for short
    # leases, so that a takeover follows soon after the lease expires.
    poll = min(1.0, lease_ttl / 10)
    client = Client(
        store=store,
        provider=provider,
        lease_ttl=lease_ttl,
        poll_interval=poll,
        store_timeout=store_timeout,
    )
    await _check_store(client, min(store_timeout, START_CHECK))
    async with client:
        hub = SessionHub(client, pending_timeout=pending_timeout)
        try:
            if stdio:
                # The one client is the process that started the server: no deadlines for it.
                own = replace(limits, connect_timeout=None, idle_timeout=None)
                await own.connection(hub, token, *await _stdio_streams()).serve()
            else:
                listen = _Listener(partial(limits.connection, hub, token), max_connections)
                await listen(host, port, on_ready or _announce)
        finally:
            await hub.close_all()


@dataclass(frozen=True, slots=True)
class _Limits:
    """What bounds each connection (see `serve`)."""

    max_output: int
    max_requests: int
    frame_timeout: float
    connect_timeout: float | None
    idle_timeout: float | None

    def connection(
        self,
        hub: SessionHub,
        token: str | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> CopilotConnection:
        """The Copilot protocol on a new connection, within these limits."""
        conn = Connection(
            reader,
            writer,
            cancellable=CANCELLABLE,
            max_output=self.max_output,
            max_requests=self.max_requests,
            frame_timeout=self.frame_timeout,
        )
        return CopilotConnection(
            conn,
            hub,
            token=token,
            connect_timeout=self.connect_timeout,
            idle_timeout=self.idle_timeout,
        )


async def _check_provider(provider: dict[str, Any] | None) -> None:
    """Build the default provider once, so that a bad config fails the start, not a session."""
    if provider is None:
        return
    try:
        config = ProviderConfig.model_validate(provider)
        built = make_provider(config, env_credentials=True)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "provider"
        raise ValueError(f"invalid provider config: {where}: {problem['msg']}") from None
    except ImportError as exc:
        raise ServeError(str(exc)) from None
    await built.aclose()


async def _check_store(client: Client, timeout: float) -> None:
    """Open the store and read from it once, within `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            await client.list_sessions()
    except Exception as exc:
        await client.stop()
        if isinstance(exc, ValueError):
            raise  # a spec that names no store: bad usage
        if isinstance(exc, TimeoutError):
            raise ServeError(f"the session store did not answer within {timeout:g} s") from None
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ServeError(f"cannot open the session store: {detail}") from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost could resolve anywhere


def _announce(port: int) -> None:
    print(f"listening on port {port}", flush=True)


class _Listener:
    """Accepts TCP clients, at most `max_connections` at once, each served on its own task."""

    def __init__(
        self,
        copilot: Callable[[asyncio.StreamReader, asyncio.StreamWriter], CopilotConnection],
        max_connections: int,
    ) -> None:
        self._copilot = copilot
        self._max = max_connections
        self._handlers: set[asyncio.Task[Any]] = set()
        self._full = False
        """Connections are being refused (said once in the log, not once per refusal)."""

    async def __call__(self, host: str, port: int, on_ready: Callable[[int], None]) -> None:
        _raise_file_limit(self._max + _FILE_MARGIN)
        # The accept queue holds as many clients as the server serves (the kernel caps it at
        # `net.core.somaxconn`): connecting together while the loop is busy, they wait there,
        # where asyncio's default of 100 drops the rest, to retry a second or more later.
        server = await asyncio.start_server(
            self._on_client, host, port, limit=_STREAM_LIMIT, backlog=self._max
        )
        on_ready(server.sockets[0].getsockname()[1])
        log.debug("listening on %s port %d", host, server.sockets[0].getsockname()[1])
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            server.close()
            for task in self._handlers:
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await server.wait_closed()

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._handlers) >= self._max:
            if not self._full:
                log.warning("refusing connections: %d are open, the limit", self._max)
                self._full = True
            await _refuse(writer, self._max)
            return
        # Small frames (events, answers) must not wait ~40 ms for Nagle's algorithm.
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        copilot = self._copilot(reader, writer)
        log.debug("%s connected (%d open)", copilot.peer, len(self._handlers))
        try:
            await copilot.serve()
        except asyncio.CancelledError:
            pass  # the server is stopping; 3.11 would report a cancelled handler as an error
        except Exception:
            log.exception("connection failed")
        finally:
            self._handlers.discard(task)
            self._full = False
            log.debug("%s disconnected (%d open)", copilot.peer, len(self._handlers))


async def _refuse(writer: asyncio.StreamWriter, limit: int) -> None:
    """Tell a client beyond the limit why it is turned away, then close its connection."""
    error = {
        "code": SERVER_BUSY,
        "message": f"SERVER_BUSY: the server has {limit} connections open, its limit;"
        " try again later",
    }
    writer.write(encode_frame(json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()))
    writer.close()
    try:
        async with asyncio.timeout(1.0):
            await writer.wait_closed()
    except (TimeoutError, ConnectionError, OSError):
        writer.transport.abort()


def _raise_file_limit(wanted: int) -> None:
    """Raise this process's open-file limit towards `wanted` (within the hard limit), so that
    the connection limit is reached before the operating system's."""
    try:
        import resource
    except ImportError:  # not on Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            log.warning("cannot raise the open-file limit to %d (it is %d)", target, soft)


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
