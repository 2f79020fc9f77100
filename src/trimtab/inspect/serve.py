"""`serve`: run the inspector on uvicorn until stopped (Ctrl-C, SIGTERM)."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Callable
from urllib.parse import quote

from trimtab.inspect.app import create_app
from trimtab.inspect.guard import LOOPBACK_NAMES, Guard
from trimtab.store import Store, open_store

__all__ = ["InspectError", "check_address", "inspector_url", "is_loopback", "serve"]

_SHUTDOWN_GRACE = 1
"""Seconds open responses (live views never end by themselves) get once asked to stop."""


class InspectError(Exception):
    """The inspector cannot start: its store cannot be read, or its address cannot be bound."""


def is_loopback(host: str) -> bool:
    """Whether `host` is an address only this machine reaches (as `trimtab serve` decides)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost could resolve anywhere


def check_address(host: str, token: str | None) -> None:
    """Raise `ValueError` unless `host` is loopback or there is a token."""
    if not token and not is_loopback(host):
        raise ValueError(
            f"refusing to listen on {host!r} without a token: anyone who can reach it could"
            " read your sessions (pass --token, or use 127.0.0.1)"
        )


def inspector_url(host: str, port: int, token: str | None) -> str:
    """The URL to open: a browser on this machine reaches an unspecified address (0.0.0.0)
    at loopback; the token rides along as a query parameter."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={quote(token, safe='')}" if token else "")


def _announce(url: str) -> None:
    print(f"inspecting sessions at {url}", flush=True)


async def serve(
    store: Store | str | os.PathLike[str] | None = None,
    *,
    home: str | os.PathLike[str] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    store_timeout: float = 10.0,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the inspector's pages over `store` until cancelled or signalled.

    Args:
        store: Where the sessions are, as for `open_store` (a `Store` is used as it is and
            left open).
        home: trimtab's data directory, for the default SQLite store.
        host: The address to listen on. Anything but loopback needs a `token`.
        port: The TCP port; 0 picks a free one.
        token: What every request must carry; an empty token is no token.
        store_timeout: Seconds the store has to answer once before the inspector starts.
        on_ready: Called with the URL to open once listening; by default it is printed.

    Raises:
        ValueError: A non-loopback `host` without a `token`, or a store spec that names none.
        InspectError: The store cannot be read, or the address cannot be bound.
    """
    token = token or None
    check_address(host, token)
    try:
        opened = open_store(store, home=home)
    except ImportError as exc:  # psycopg, for a PostgreSQL URL
        raise InspectError(str(exc)) from None
    try:
        await _check(opened, store_timeout)
        listener = _listen(host, port)
        hosts = LOOPBACK_NAMES | {host.lower()} if token is None else None
        stopping = asyncio.Event()
        app = create_app(opened, token=token, hosts=hosts, stopping=stopping)
        url = inspector_url(host, listener.getsockname()[1], token)
        await _run(app, stopping, listener, url, on_ready)
    finally:
        if opened is not store:
            await opened.close()


async def _check(store: Store, timeout: float) -> None:
    """Read the store once, within `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            await store.list_sessions()
    except TimeoutError:
        raise InspectError(f"the session store did not answer within {timeout:g} s") from None
    except Exception as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InspectError(f"cannot read the session store: {detail}") from None


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket, declared TCP: asyncio sets TCP_NODELAY on the connections of such
    a socket only (`socket.create_server` declares none), and without it a response on a
    kept-alive connection can wait some 40 ms for the browser's delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise InspectError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    return sock


async def _run(
    app: Guard,
    stopping: asyncio.Event,
    listener: socket.socket,
    url: str,
    on_ready: Callable[[str], None] | None,
) -> None:
    # Imported here: a server is started once, and uvicorn is not needed to build the app.
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            stopping.set()  # the live views end first, or the shutdown would wait for them
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        lifespan="off",
        ws="none",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=_SHUTDOWN_GRACE,
    )
    # The socket listens already: a browser that connects now waits in its backlog for the
    # server, which starts at once, so the URL can be given out before.
    (on_ready or _announce)(url)
    server = Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await asyncio.shield(serving)
    except asyncio.CancelledError:
        # Stopped as a task: shut down as on a signal, open responses included.
        server.should_exit = True
        await serving
        raise
    finally:
        listener.close()
