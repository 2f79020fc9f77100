"""A local MCP server's stdin and stdout, with a bound on each message it writes (spec MCP12).

The SDK's stdio transport joins each chunk of a line to the part read before, copying it
whole every time: a 50 MB line took 10 s and some 240 MB before trimtab could cut the result
to 100,000 characters, and a server could make it hold any amount. Here a line is gathered
in one buffer up to `MAX_MESSAGE_BYTES`; a longer one is refused as soon as it passes the
limit: `refused` says so, the session's stream ends (the requests in flight fail at once),
and the rest of what the server writes is read and dropped while it is stopped.

The process is the guard (`_guard.py`) in front of the server: stopping closes its stdin,
waits `STOP_GRACE` seconds, then sends the guard SIGTERM (it stops the server's group) and
SIGKILL if it outlives that too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import anyio
import anyio.abc

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.client._transport import TransportStreams
    from mcp.shared.message import SessionMessage

__all__ = ["MAX_MESSAGE_BYTES", "StdioTransport"]

log = logging.getLogger("trimtab.mcp")

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""The longest line (one JSON-RPC message) read from a server: far above any result the model
is shown (`MAX_RESULT_CHARS`), room for the images and audio a result may carry (described to
the model in a line each), and eight times the SDK's own bound on one SSE event."""

STOP_GRACE = 2.0
"""Seconds a server has to exit after its stdin closes, before its guard gets SIGTERM."""

_GUARD_GRACE = 3.0
"""Seconds the guard has after SIGTERM (it gives the server's group 1.5 s) before SIGKILL."""


class StdioTransport:
    """The MCP SDK's `Transport` for one process speaking JSON-RPC, one message per line."""

    def __init__(
        self, argv: list[str], *, env: Mapping[str, str], cwd: str | None, stderr: IO[Any]
    ) -> None:
        self.refused: str | None = None
        """Why the transport stopped reading the server, when it refused a message."""
        self._argv = argv
        self._env = dict(env)
        self._cwd = cwd
        self._stderr = stderr
        """The server's stderr, closed here once the process has its own copy."""
        self._streams: contextlib.AbstractAsyncContextManager[TransportStreams] | None = None

    async def __aenter__(self) -> TransportStreams:
        self._streams = self._run()
        return await self._streams.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        assert self._streams is not None
        return await self._streams.__aexit__(exc_type, exc, traceback)

    @contextlib.asynccontextmanager
    async def _run(self) -> AsyncIterator[TransportStreams]:
        from mcp.shared.message import SessionMessage

        process = await anyio.open_process(
            self._argv, env=self._env, cwd=self._cwd, stderr=self._stderr, start_new_session=True
        )
        self._stderr.close()
        assert process.stdin is not None and process.stdout is not None
        received, session_reads = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        session_writes, to_send = anyio.create_memory_object_stream[SessionMessage](0)
        written = anyio.Event()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._read, process.stdout, received)
            tasks.start_soon(self._write, process.stdin, to_send, received, written)
            try:
                yield session_reads, session_writes
            finally:
                with anyio.CancelScope(shield=True):
                    # Unblock a read waiting on the session (then the rest is dropped), let
                    # what the session wrote go out, then stop the process.
                    session_reads.close()
                    session_writes.close()
                    with anyio.move_on_after(0.5):
                        await written.wait()
                    await _stop(process)
                tasks.cancel_scope.cancel()

    async def _read(
        self,
        stdout: anyio.abc.ByteReceiveStream,
        received: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with received:
                await self._deliver(stdout, received)
        # The session's stream has ended (the server's output did, or a line was refused, or
        # the transport is stopping): drop whatever else comes, so that the server never
        # blocks on a full pipe while it is stopped.
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for _ in stdout:
                pass

    async def _deliver(
        self,
        stdout: anyio.abc.ByteReceiveStream,
        received: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        """The server's lines, one message each, until its output ends or a line is too long."""
        line = bytearray()
        async for chunk in stdout:
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                if not self._fits(len(line) + end - start):
                    return
                line += chunk[start:end]
                start = end + 1
                if line and not line.isspace():
                    await received.send(_parsed(line))
                line.clear()
            if not self._fits(len(line) + len(chunk) - start):
                return
            line += chunk[start:]

    def _fits(self, size: int) -> bool:
        if size <= MAX_MESSAGE_BYTES:
            return True
        limit = MAX_MESSAGE_BYTES // 2**20
        self.refused = f"sent a message longer than {limit} MiB (the most trimtab reads)"
        return False

    @staticmethod
    async def _write(
        stdin: anyio.abc.ByteSendStream,
        to_send: MemoryObjectReceiveStream[SessionMessage],
        received: MemoryObjectSendStream[SessionMessage | Exception],
        written: anyio.Event,
    ) -> None:
        try:
            async with to_send:
                async for item in to_send:
                    text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send(text.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server stopped reading: end the session's stream, so that no request of
            # its waits for an answer that cannot come.
            await received.aclose()
        finally:
            written.set()


def _parsed(line: bytearray) -> SessionMessage | Exception:
    """One line as a message, or the error for the session to report (as the SDK does).

    Parsed to plain values first: validating the JSON itself builds several times the objects
    (an 8 MB line of small contents took 360 MB that way, 50 MB this way)."""
    from mcp.shared.message import SessionMessage
    from mcp_types import jsonrpc_message_adapter
    from pydantic_core import from_json

    try:
        return SessionMessage(
            jsonrpc_message_adapter.validate_python(from_json(line), by_name=False)
        )
    except ValueError as exc:
        log.debug("MCP server wrote a line that is no JSON-RPC message: %r", bytes(line[:200]))
        return exc


async def _stop(process: anyio.abc.Process) -> None:
    """Close its stdin, then SIGTERM, then SIGKILL: each after a bounded wait for its exit."""
    assert process.stdin is not None and process.stdout is not None
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, STOP_GRACE):
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        if not await _exited(process, _GUARD_GRACE):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            if not await _exited(process, 2.0):
                log.warning("MCP server guard %d outlived SIGKILL; left behind", process.pid)
    # Whatever still holds the pipe open (nothing, once the guard killed the group) must not
    # keep the read going.
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()


async def _exited(process: anyio.abc.Process, timeout: float) -> bool:
    # Polled: `wait()` also waits for the end of the pipes, which a child may hold.
    with anyio.move_on_after(timeout):
        while process.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    return process.returncode is not None
