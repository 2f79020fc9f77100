"""`serve`: run the inspector on uvicorn until stopped (Ctrl-C, SIGTERM, or cancelled).

Every request must carry a token (spec L9), on loopback too: every account of the machine
reaches a loopback port, and the pages show every session's conversation. Without one given,
the inspector makes one, prints the URL that carries it and keeps it in
`$TRIMTAB_HOME/inspect/<port>.token` (`TokenFile`, as `trimtab serve` does) while it serves;
only `no_auth`, on loopback, serves without.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from urllib.parse import quote

from trimtab.inspect.app import create_app
from trimtab.inspect.guard import LOOPBACK_NAMES, Guard
from trimtab.store import Store, data_home, open_store
from trimtab.store._files import TokenFile

__all__ = ["InspectError", "check_address", "inspector_url", "is_loopback", "serve"]

_SHUTDOWN_GRACE = 1
"""Seconds open responses (live views never end by themselves) get once asked to stop."""


class InspectError(Exception):
    """The inspector cannot start: its store cannot be read, its address cannot be bound, or
    its token cannot be kept where only its user reads it.

    Args:
        message: What went wrong, on one line.
        hint: What the user can do about it, on one line.
    """

    def __init__(self, message: str, *, hint: str = "check --store, --host and --port") -> None:
        super().__init__(message)
        self.hint = hint


def is_loopback(host: str) -> bool:
    """Whether `host` is an address only this machine reaches (as `trimtab serve` decides)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost could resolve anywhere


def check_address(host: str, token: str | None, *, no_auth: bool = False) -> None:
    """Raise `ValueError` unless an inspector may listen on `host` so: beyond loopback only
    with a `token` given, and `no_auth` only on loopback and without one."""
    if no_auth and (token or not is_loopback(host)):
        raise ValueError(
            "--no-auth is for an inspector on a loopback address, without a token (--token,"
            " TRIMTAB_INSPECT_TOKEN): every account of this machine could read your sessions"
        )
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
    no_auth: bool = False,
    store_timeout: float = 10.0,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the inspector's pages over `store` until cancelled (then it raises
    `CancelledError`) or stopped by Ctrl-C or SIGTERM (then it returns).

    Args:
        store: Where the sessions are, as for `open_store` (a `Store` is used as it is and
            left open).
        home: trimtab's data directory: the default SQLite store's, and the token file's.
        host: The address to listen on. Anything but loopback needs a `token`.
        port: The TCP port; 0 picks a free one.
        token: What every request must carry; without one (or an empty one) the inspector
            makes one and writes it to `<home>/inspect/<port>.token`, 0600, until it stops.
        no_auth: Serve without a token, on loopback only: every account of this machine
            can then read every session.
        store_timeout: Seconds the store has to answer once before the inspector starts.
        on_ready: Called with the URL to open (the token in it) once listening; by default
            it is printed.

    Raises:
        ValueError: A non-loopback `host` without a `token`, `no_auth` with a token or
            beyond loopback, or a store spec that names none.
        InspectError: The store cannot be read, the address cannot be bound, or the token
            cannot be written where only this user reads it.
    """
    token = token or None
    check_address(host, token, no_auth=no_auth)
    try:
        opened = open_store(store, home=home)
    except ImportError as exc:  # psycopg, for a PostgreSQL URL
        raise InspectError(str(exc)) from None
    try:
        await _check(opened, store_timeout)
        listener = _listen(host, port)
        made = None if token or no_auth else TokenFile(data_home(home) / "inspect")
        try:
            port = listener.getsockname()[1]
            if made is not None:
                token = made.token
                _announce_file(_write(made, port))
            # On loopback the Host header is checked too: a page elsewhere that points a
            # name of its own at 127.0.0.1 (DNS rebinding) is refused before any token is.
            hosts = LOOPBACK_NAMES | {host.lower()} if is_loopback(host) else None
            stopping = asyncio.Event()
            app = create_app(opened, token=token, hosts=hosts, stopping=stopping)
            await _run(app, stopping, listener, inspector_url(host, port, token), on_ready)
        finally:
            listener.close()
            if made is not None:
                made.remove()
    finally:
        if opened is not store:
            await opened.close()


def _write(made: TokenFile, port: int) -> Path:
    try:
        return made.write(port)
    except OSError as exc:
        raise InspectError(
            f"cannot write the inspector's token: {exc.strerror or exc}",
            hint="set TRIMTAB_HOME to a directory of yours, or pass --token",
        ) from None


def _announce_file(path: Path) -> None:
    # Where, never what: the token itself is printed once, in the URL (spec L9).
    print(f"trimtab: the inspector's token is also in {path}", file=sys.stderr, flush=True)


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

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # `_signals_stop` does it, from before the URL is given out

    config = uvicorn.Config(
        app,
        lifespan="off",
        ws="none",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=_SHUTDOWN_GRACE,
    )
    server = Server(config)
    with _signals_stop(server.handle_exit):
        # The socket listens already: a browser that connects now waits in its backlog for
        # the server, which starts at once, so the URL can be given out before.
        (on_ready or _announce)(url)
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        try:
            await asyncio.shield(serving)
        except asyncio.CancelledError:
            # Stopped as a task: shut down as on a signal, open responses included.
            server.should_exit = True
            await serving
            raise


@contextlib.contextmanager
def _signals_stop(handle: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """Ctrl-C and SIGTERM call `handle` (which stops the server) within the block.

    uvicorn's own handlers come only once it serves, after the URL is out (a signal sent at
    once would meet the defaults), and it raises the signals again once it has stopped:
    SIGTERM's default action would then end the process before the token file is removed
    and the store closed. With these, `serve` cleans up and returns.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only
        return
    before = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
