"""`serve`: the runtime over JSON-RPC, in the Copilot SDK's protocol, as `options` say.

It composes the pieces: a `trimtab.Client` on the store, the `SessionHub` its connections
share, and the transport (a TCP listener, or this process's stdin and stdout).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from trimtab import Client
from trimtab._engine import Engine
from trimtab.protocol.errors import SERVER_BUSY
from trimtab.protocol.framing import encode_frame
from trimtab.protocol.jsonrpc import Connection
from trimtab.providers import ProviderConfig, make_provider
from trimtab.providers._install import install_command
from trimtab.server.auth import Credentials
from trimtab.server.copilot import CANCELLABLE, CopilotConnection
from trimtab.server.hub import SessionHub
from trimtab.server.isolation import undumpable
from trimtab.server.options import ServerOptions
from trimtab.server.policy import HostPolicy
from trimtab.store import data_home
from trimtab.store._files import TokenFile

__all__ = ["START_CHECK", "ServeError", "serve"]

log = logging.getLogger("trimtab.server")

_STREAM_LIMIT = 1024 * 1024
"""Bytes a header line may take before the reader gives up (bodies are not limited by it)."""

START_CHECK = 10.0
"""Seconds the store has to answer once before the server says it is ready (spec S4)."""

_FILE_MARGIN = 64
"""File descriptors kept beyond `max_connections` for the store, logs and providers."""


class ServeError(Exception):
    """The server cannot start: its store is unreachable, a provider cannot be built, or its
    port cannot be listened on.

    Args:
        message: What went wrong, on one line.
        hint: What the operator can do about it, on one line.
    """

    def __init__(
        self,
        message: str,
        *,
        hint: str = "check --store and --provider (and that the database is reachable)",
    ) -> None:
        super().__init__(message)
        self.hint = hint


async def serve(
    options: ServerOptions | None = None, *, on_ready: Callable[[int], None] | None = None
) -> None:
    """Serve the Copilot protocol: over TCP until cancelled, or over stdio until stdin closes.

    The store and the provider are checked before the server says it is ready: a store that
    cannot be reached or a provider that cannot be built fails here, with one message. The
    default provider is the operator's: credentials from this process's environment go with
    it (spec S1).

    Over TCP a client must present a token (spec S10): given in `options`, or, with none, one
    made here and written to `$TRIMTAB_HOME/serve/<port>.token` (its path is said on
    stderr), removed when the server stops. What clients may make the host do beyond
    driving sessions is `options`' host policy (spec S11). On Linux the process is made
    undumpable, so that the commands it starts cannot read its memory or environment (S17).

    Args:
        options: Where to listen, the store, the provider, the tokens, the host policy and
            the limits (default: all defaults, the store in `TRIMTAB_STORE` or under
            `TRIMTAB_HOME`).
        on_ready: Called with the port once listening (TCP); by default the server prints
            `listening on port N` to stdout, the line the official clients wait for.

    Raises:
        ValueError: A provider config that cannot be built, a store spec that names no
            store, a tokens file, key file, `--mcp-command` or `--attachments-root` that
            cannot be used.
        ServeError: The store cannot be reached, the provider's library is missing, the
            port is in use, or the token cannot be written.
    """
    options = options or ServerOptions()
    policy = HostPolicy.of(options)
    credentials, made = _credentials(options)
    provider = _provider(options)
    await _check_provider(ProviderConfig.model_validate(provider) if provider else None)
    undumpable()
    # Checks for queued input and expired leases at least every second, faster for short
    # leases, so that a takeover follows soon after the lease expires.
    poll = min(1.0, options.lease_ttl / 10)
    client = Client(
        store=options.store,
        provider=provider,
        lease_ttl=options.lease_ttl,
        poll_interval=poll,
        store_timeout=options.store_timeout,
        engine=(engine := _engine(options)),
    )
    await _check_engine(client, engine, START_CHECK)
    await _check_store(client, min(options.store_timeout, START_CHECK))
    async with client:
        hub = SessionHub(
            client,
            policy=policy,
            pending_timeout=options.pending_timeout,
            has_provider=provider is not None,
        )
        limits = _Limits.of(options, credentials)
        try:
            if options.stdio:
                # The one client is the process that started the server: no deadlines for it.
                own = replace(limits, connect_timeout=None, idle_timeout=None)
                await own.connection(hub, *await _stdio_streams()).serve()
            else:
                listen = _Listener(partial(limits.connection, hub), options.max_connections)
                ready = on_ready or _announce
                if made is not None:
                    ready = partial(_token_ready, made, ready)
                await listen(options.host, options.port, ready)
        finally:
            if made is not None:
                made.remove()
            await hub.close_all()


def _credentials(options: ServerOptions) -> tuple[Credentials, TokenFile | None]:
    """The tokens the server accepts (spec S10), and the file of the one it made, if it did.

    Raises:
        ValueError: A tokens file that cannot be used.
    """
    if options.stdio or options.no_auth:
        return Credentials(), None
    if options.tokens_file is not None:
        return Credentials.from_file(options.tokens_file, options.admin), None
    if options.token_value is not None:
        return Credentials.single(options.token_value), None
    made = TokenFile(data_home() / "serve")
    return Credentials.single(made.token), made


def _token_ready(made: TokenFile, ready: Callable[[int], None], port: int) -> None:
    """Write the token the server made for `port`, say where, then that it is ready."""
    try:
        path = made.write(port)
    except OSError as exc:
        raise ServeError(
            f"cannot write the connection token: {exc.strerror or exc}",
            hint="set TRIMTAB_HOME to a directory of yours, or pass --token",
        ) from None
    # Where, never what: the token itself stays in the file (spec S10).
    print(f"trimtab: connection token in {path} (clients send what it holds)", file=sys.stderr)
    ready(port)


def _provider(options: ServerOptions) -> dict[str, Any] | None:
    """The operator's provider config, with its key read from `--api-key-file`.

    Raises:
        ValueError: The key file cannot be read, or is empty.
    """
    if options.provider is None:
        return None
    config = options.provider.model_dump(exclude_none=True)
    if (path := options.api_key_file) is not None:
        try:
            key = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--api-key-file {path}: {getattr(exc, 'strerror', exc)}") from None
        if not key:
            raise ValueError(f"--api-key-file {path} is empty")
        config["api_key"] = key
    return config


@dataclass(frozen=True, slots=True)
class _Limits:
    """What bounds each connection (see `ServerOptions`)."""

    credentials: Credentials
    max_output: int
    max_requests: int
    frame_timeout: float
    connect_timeout: float | None
    idle_timeout: float | None

    @classmethod
    def of(cls, options: ServerOptions, credentials: Credentials) -> _Limits:
        return cls(
            credentials,
            options.max_output,
            options.max_requests,
            options.frame_timeout,
            options.connect_timeout,
            options.idle_timeout,
        )

    def connection(
        self,
        hub: SessionHub,
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
            credentials=self.credentials,
            connect_timeout=self.connect_timeout,
            idle_timeout=self.idle_timeout,
        )


def _engine(options: ServerOptions) -> Engine | None:
    """The engine `--engine` names, if any (spec EN1)."""
    if options.engine is None:
        return None
    try:
        from trimtab.temporal import TemporalEngine
    except ImportError as exc:
        raise ServeError(
            f"--engine needs the temporal extra ({exc})",
            hint=install_command("temporal"),
        ) from None
    return TemporalEngine(options.engine, pending_timeout=options.pending_timeout)


async def _check_provider(config: ProviderConfig | None) -> None:
    """Build the default provider once, so that a bad config fails the start, not a session."""
    if config is None:
        return
    try:
        built = make_provider(config, env_credentials=True)
    except ImportError as exc:
        raise ServeError(str(exc)) from None
    await built.aclose()


async def _check_engine(client: Client, engine: Engine | None, timeout: float) -> None:
    """Connect to the engine, if any, within `timeout` seconds."""
    if engine is None:
        return
    try:
        async with asyncio.timeout(timeout):
            await client.start()
    except Exception as exc:
        await client.stop()
        if isinstance(exc, ValueError):
            raise
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ServeError(
            f"cannot reach the engine {engine.name}: {detail}",
            hint="check --engine (is the Temporal server up?)",
        ) from None


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
        try:
            server = await asyncio.start_server(
                self._on_client, host, port, limit=_STREAM_LIMIT, backlog=self._max
            )
        except OSError as exc:
            raise _unlistenable(exc, host, port) from None
        try:
            on_ready(server.sockets[0].getsockname()[1])
            log.debug("listening on %s port %d", host, server.sockets[0].getsockname()[1])
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


def _unlistenable(exc: OSError, host: str, port: int) -> ServeError:
    """Why the server cannot listen on `host` and `port`, said as the operator would fix it."""
    if exc.errno == errno.EADDRINUSE:
        return ServeError(
            f"port {port} is in use", hint="pick another with --port, or --port 0 for a free one"
        )
    # asyncio words a failed bind at length; the system's name for its errno is enough.
    errno_ = exc.errno or 0
    reason = os.strerror(errno_) if errno_ > 0 else exc.strerror or str(exc)
    return ServeError(
        f"cannot listen on {host} port {port}: {reason}", hint="check --host and --port"
    )


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
