"""One MCP server, on the official `mcp` SDK: started on first use, restarted after a crash.

A `McpServer` is shared by the sessions of one runtime whose configs name the same process
(command, arguments, environment, directory) or endpoint (URL, headers). Its connection lives
in one task of its own (the SDK's client must be entered and left in the same task); calls and
listings are made from the sessions' tasks. A local server runs under `_guard.py`, so that it
dies with the runtime however the runtime ends (spec MCP5).

The server's tool list is fetched on first use and again after
`notifications/tools/list_changed` (on 2026-era connections, the same change as a
`subscriptions/listen` event), or after a restart; `changes` counts those, so that sessions
know when to look again.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from trimtab.mcp._answers import AnswerChecks, Listing, list_tools
from trimtab.mcp._config import RemoteServerConfig, ServerConfig, StdioServerConfig
from trimtab.mcp._stdio import StdioTransport

if TYPE_CHECKING:
    import mcp_types

    import mcp

__all__ = ["START_TIMEOUT", "Backoff", "McpServer", "ServerError"]

log = logging.getLogger("trimtab.mcp")

START_TIMEOUT = 30.0
"""Seconds a server has to start and answer the handshake."""

BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Seconds before the next start after consecutive failures (crashes, failed starts)."""

_STDERR_TAIL = 2_000
"""Characters of a local server's stderr kept, for the message when it fails: the rest is
read and dropped, so that a server writing without end neither blocks nor fills memory."""

_GUARD = Path(__file__).with_name("_guard.py")


class ServerError(Exception):
    """The server could not serve the request; the text is for the model and the log."""


class Backoff(ServerError):
    """The server failed a moment ago: the next start waits for its backoff to pass."""


class _Tail:
    """Reads a pipe to its end, keeping only its last characters."""

    def __init__(self, fd: int) -> None:
        self.text = ""
        self.closed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read(fd))

    async def _read(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        try:
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb")
            )
        except OSError:
            self.closed.set()
            return
        try:
            while chunk := await reader.read(65_536):
                self.text = (self.text + chunk.decode("utf-8", "replace"))[-_STDERR_TAIL:]
        finally:
            transport.close()
            self.closed.set()

    def last_line(self) -> str:
        lines = [line.strip() for line in self.text.splitlines() if line.strip()]
        return lines[-1][-300:] if lines else ""

    async def aclose(self) -> None:
        self._task.cancel()
        await asyncio.wait([self._task])


class McpServer:
    """A connection to one MCP server, opened when first needed."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.changes = 0
        """Bumped whenever the server's tools may have changed (a list change, a restart)."""
        self._client: mcp.Client | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        """Connection tasks, the current one and those still winding down."""
        self._stderr: _Tail | None = None
        self._lock = asyncio.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._tools: Listing | None = None
        self._checks: AnswerChecks | None = None
        """The current connection's checks of the server's answers."""
        self._stdio_transport: StdioTransport | None = None
        """The current connection's transport, for a local server (on POSIX)."""
        self._closed = False

    def __repr__(self) -> str:
        return f"McpServer({self.config.process_key()[:2]!r})"

    # --- use -----------------------------------------------------------------------------

    async def tools(self, timeout: float) -> Listing:
        """The server's tools, started first if need be; fetched again after a change.

        Raises `ServerError` without waiting while a failed start's backoff runs.
        """
        from pydantic import ValidationError

        client = await self._connected(wait=False)
        if self._tools is None:
            changes = self.changes
            try:
                assert self._checks is not None  # set with the client
                tools = await asyncio.wait_for(list_tools(client, self._checks), timeout)
            except TimeoutError:
                raise ServerError(f"did not list its tools within {timeout:g} s") from None
            except ValidationError:
                raise ServerError("answered tools/list with no list of tools") from None
            except Exception as exc:
                raise self._failed(exc, "while listing its tools") from None
            if changes == self.changes:  # no change came in meanwhile: the list is current
                self._tools = tools
            return tools
        return self._tools

    async def call(
        self, tool: str, arguments: dict[str, Any], timeout: float
    ) -> mcp_types.CallToolResult:
        """Call one tool; `ServerError` when the server fails. The caller bounds the call to
        `timeout`; the SDK's own bound is a little longer, a backstop."""
        from pydantic import ValidationError

        client = await self._connected(wait=True)
        try:
            result = await client.call_tool(tool, arguments, read_timeout_seconds=timeout + 1)
        except ValidationError:
            raise ServerError("returned a malformed result") from None
        except Exception as exc:
            raise self._failed(exc, "during the call") from None
        self._failures = 0
        return result

    def _failed(self, exc: Exception, when: str) -> ServerError:
        """The error to report for `exc`; a lost connection is noted, for a restart."""
        import anyio
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        if isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED:
            return ServerError(f"answered with an error {when}: {exc.error.message}")
        refused = self._refused()
        self._lost()
        if refused is not None:
            return ServerError(f"{refused} {when}; it was stopped and restarts on next use")
        if isinstance(exc, MCPError | anyio.ClosedResourceError | anyio.BrokenResourceError):
            return ServerError(f"stopped {when}{self._exit_detail()}; it restarts on next use")
        return ServerError(f"failed {when} ({_reason(exc)}); it restarts on next use")

    def _refused(self) -> str | None:
        """Why trimtab closed the connection, if it did (a message over MCP12's bound)."""
        transport = self._stdio_transport
        return transport.refused if transport is not None else None

    def _exit_detail(self) -> str:
        line = self._stderr.last_line() if self._stderr is not None else ""
        return f" (its last output: {line!r})" if line else ""

    # --- lifecycle -------------------------------------------------------------------------

    async def _connected(self, *, wait: bool) -> mcp.Client:
        async with self._lock:
            if self._closed:
                raise ServerError("was shut down")
            if (
                self._client is not None
                and (self._stderr is None or not self._stderr.closed.is_set())
                and self._refused() is None
            ):
                return self._client
            if self._client is not None:
                self._lost()  # the process exited, or trimtab closed it, while idle
            delay = self._retry_at - asyncio.get_running_loop().time()
            if delay > 0:
                if not wait:
                    raise Backoff(f"failed; next start in {delay:.1f} s")
                await asyncio.sleep(delay)
            try:
                self._client = await self._start()
            except Exception as exc:
                self._note_failure()
                raise ServerError(f"failed to start: {_reason(exc)}{self._exit_detail()}") from None
            return self._client

    def _note_failure(self) -> None:
        delay = BACKOFF[min(self._failures, len(BACKOFF) - 1)]
        self._failures += 1
        self._retry_at = asyncio.get_running_loop().time() + delay

    def _lost(self) -> None:
        """The connection is gone: drop it (its task winds down) and start again on next use."""
        if self._client is None:
            return
        why = self._refused() or f"stopped{self._exit_detail()}"
        log.warning("MCP server %r %s", self.config.process_key()[1], why)
        self._client = None
        self._tools = None
        self.changes += 1
        self._note_failure()
        self._wind_down()

    def _wind_down(self) -> None:
        """Let the current connection's task close it (the SDK's shutdown, bounded)."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    async def _start(self) -> mcp.Client:
        stop = asyncio.Event()
        ready: asyncio.Future[mcp.Client] = asyncio.get_running_loop().create_future()
        self._stop = stop
        task = asyncio.get_running_loop().create_task(
            self._serve(ready, stop), name="trimtab-mcp-server"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            # A backstop only: the SDK bounds the handshake itself (its read timeout).
            async with asyncio.timeout(START_TIMEOUT + 5):
                client = await asyncio.shield(ready)
        except BaseException as exc:
            # Failed, timed out or cancelled (an abort): the task lets go of whatever it has.
            stop.set()
            self._stop = None
            if isinstance(exc, TimeoutError):
                task.cancel()
                raise TimeoutError(f"no handshake within {START_TIMEOUT:g} s") from None
            if isinstance(exc, Exception) and self._stderr is not None:
                # The reason is in what the process wrote last: read it to its end first.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._stderr.closed.wait()
            raise
        self._tools = None
        self.changes += 1
        return client

    async def _serve(self, ready: asyncio.Future[mcp.Client], stop: asyncio.Event) -> None:
        """Hold the SDK's client open until asked to stop (its whole life in this task)."""
        import mcp

        try:
            async with contextlib.AsyncExitStack() as stack:
                transport = await stack.enter_async_context(self._transport())
                checks = AnswerChecks(transport, lambda: client.session.protocol_version)
                client = mcp.Client(
                    checks,
                    message_handler=self._on_message,
                    client_info=_client_info(),
                    read_timeout_seconds=START_TIMEOUT,
                    cache=None,
                )
                await stack.enter_async_context(client)
                if _listens(client):
                    stack.enter_context(_Listener(client, self._tools_changed))
                self._checks = checks
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ServerError("cancelled"))
            elif not isinstance(exc, asyncio.CancelledError):
                log.debug("MCP server connection ended", exc_info=True)
            if not isinstance(exc, Exception):
                raise

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        config = self.config
        if isinstance(config, StdioServerConfig):
            async with self._stdio(config) as transport:
                yield transport
            return
        assert isinstance(config, RemoteServerConfig)
        from mcp.shared._httpx_utils import create_mcp_http_client

        if config.type == "sse":
            from mcp.client.sse import sse_client

            yield sse_client(config.url, headers=dict(config.headers))
            return
        from mcp.client.streamable_http import streamable_http_client

        async with create_mcp_http_client(headers=dict(config.headers)) as http:
            yield streamable_http_client(config.url, http_client=http)

    @contextlib.asynccontextmanager
    async def _stdio(self, config: StdioServerConfig) -> AsyncIterator[Any]:
        from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client

        read_end, write_end = os.pipe()
        if self._stderr is not None:
            await self._stderr.aclose()
        self._stderr = _Tail(read_end)
        with os.fdopen(write_end, "w") as errlog:
            if sys.platform == "win32" or not sys.executable:
                # No guard there (it is POSIX's): the SDK's transport, which ends the server's
                # process tree its own way (and reads its messages without MCP12's bound).
                params = StdioServerParameters(
                    command=config.command,
                    args=list(config.args),
                    env=dict(config.env) or None,
                    cwd=config.working_directory,
                )
                yield _spawned(stdio_client(params, errlog=errlog), errlog)
                return
            guard = [sys.executable, "-I", "-S", str(_GUARD), str(os.getpid()), "--"]
            self._stdio_transport = StdioTransport(
                [*guard, config.command, *config.args],
                env=get_default_environment() | dict(config.env),
                cwd=config.working_directory,
                stderr=errlog,
            )
            yield self._stdio_transport

    async def _on_message(self, message: Any) -> None:
        from mcp_types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self._tools_changed()

    def _tools_changed(self) -> None:
        self._tools = None
        self.changes += 1

    async def close(self) -> None:
        """Stop the server (a local one: stdin closed, then SIGTERM, then SIGKILL)."""
        async with self._lock:
            self._closed = True
            self._client = None
            self._wind_down()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        if self._stderr is not None:
            await self._stderr.aclose()


class _Listener:
    """A `subscriptions/listen` stream of tool-list changes (2026-era servers), for as long
    as the connection lasts."""

    def __init__(self, client: mcp.Client, changed: Any) -> None:
        self._task = asyncio.get_running_loop().create_task(self._listen(client, changed))

    @staticmethod
    async def _listen(client: mcp.Client, changed: Any) -> None:
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _ in subscription:
                    changed()
        except Exception:
            log.debug("MCP tools/list_changed stream ended", exc_info=True)

    def __enter__(self) -> _Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self._task.cancel()


@contextlib.asynccontextmanager
async def _spawned(transport: Any, errlog: Any) -> AsyncIterator[Any]:
    """`transport`, closing our copy of the server's stderr pipe once the process has its
    own: then the end of that pipe tells that the process is gone."""
    async with transport as streams:
        errlog.close()
        yield streams


def _listens(client: mcp.Client) -> bool:
    """Whether tool-list changes come over `subscriptions/listen` (2026-era servers that
    announce them); older ones send `notifications/tools/list_changed` on their own."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    tools = client.server_capabilities.tools
    return (
        client.protocol_version in MODERN_PROTOCOL_VERSIONS
        and tools is not None
        and bool(tools.list_changed)
    )


def _client_info() -> mcp_types.Implementation:
    from mcp_types import Implementation

    try:
        version = importlib.metadata.version("trimtab")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout's sources
        version = "0"
    return Implementation(name="trimtab", version=version)


def _reason(exc: BaseException) -> str:
    """One line on why a start failed, from the first leaf of an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    if "Connection closed" in text:
        return "the server exited"
    # The reason is logged (a session warning): an httpx error names the URL, whose user,
    # password and query may hold the config's secrets (MCP3). Its origin and path stay.
    return _URL.sub(_without_secrets, text.splitlines()[0])[:300]


_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def _without_secrets(match: re.Match[str]) -> str:
    parts = urlsplit(match.group(0))
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
