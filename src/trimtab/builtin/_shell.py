"""`bash`: a command line run by bash in the working directory (spec B5, B6).

The command runs in a process group of its own, with stdin closed and stdout and stderr
together in one pipe (the order the command wrote them in, as the CLI shows them). Its
output is kept within a byte limit, its first and last halves, with what was cut said in
between. When the command ends, when its time is up, or when its call is cancelled (an
abort, the session's disconnect), its whole group is stopped: SIGTERM, a moment's grace,
then SIGKILL. Nothing it started in that group outlives the call.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
from collections.abc import Mapping
from contextlib import suppress
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trimtab._errors import ToolError
from trimtab._tools import ToolResult
from trimtab.builtin._base import BuiltinTool, builtin
from trimtab.builtin._directory import WorkingDirectory

__all__ = ["GRACE", "bash_tool", "command_environment", "shell_request"]

GRACE = 2.0
"""Seconds a stopped command's group has between SIGTERM and SIGKILL."""
_DRAIN = 1.0
"""Seconds the output of a stopped command is read on for (a process that left the group
may hold the pipe open for ever)."""
_CHUNK = 64 * 1024

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE", re.I)
_SECRET_VARIABLES = frozenset(
    {"OPENAI_CUSTOM_HEADERS", "ANTHROPIC_CUSTOM_HEADERS", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"}
)
_QUIET = {"PAGER": "cat", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0"}
"""Nothing waits for a terminal that is not there (stdin is closed)."""


class BashParams(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    command: str = Field(description="The command line bash runs.")
    description: str = Field(
        default="", description="What the command does, in a few words (shown to the user)."
    )
    mode: Literal["sync"] = Field(
        default="sync", description="sync: the call returns when the command has ended."
    )
    initial_wait: float | None = Field(
        default=None,
        description="Seconds to wait for the command; trimtab waits for it until its own "
        "time limit in any case.",
    )


def command_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a command gets: this process's (or `base`), without the variables
    that hold credentials (spec B6), and with pagers and prompts turned off."""
    source = os.environ if base is None else base
    kept = {
        name: value
        for name, value in source.items()
        if not _SECRET_NAME.search(name)
        and not name.startswith("TRIMTAB_")
        and name not in _SECRET_VARIABLES
    }
    return kept | _QUIET


def bash_tool(
    directory: WorkingDirectory, output_limit: int, time_limit: float, env: Mapping[str, str] | None
) -> BuiltinTool:
    async def bash(params: BashParams) -> str | ToolResult:
        starting = asyncio.ensure_future(
            _Command.start(params.command, directory, dict(env) if env is not None else None)
        )
        try:
            command = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # Cancelled while bash was starting (it may already run): asyncio would kill
            # bash alone, so its group is killed as soon as it has started.
            starting.add_done_callback(_killed_once_started)
            raise
        except OSError as exc:
            raise ToolError(f"Cannot run bash: {exc.strerror or exc}.") from None
        output = _Capture(output_limit)
        reader = asyncio.ensure_future(output.read(command.process.stdout))
        timed_out = False
        try:
            async with asyncio.timeout(time_limit):
                # Shielded: the timeout (or an abort) must not mark it done, which would
                # skip SIGTERM's grace in `stop`.
                await asyncio.shield(command.exited)
        except TimeoutError:
            timed_out = True
        finally:
            # Also when cancelled: an abort or a disconnect stops the command's group.
            await command.stop()
            await _drain(reader)
        text = output.text()
        if timed_out:
            note = f"<timed out after {time_limit:g} s: the command and its processes were killed>"
            return ToolResult(text_result_for_llm=_joined(text, note), result_type="timeout")
        code = command.process.returncode or 0
        return _joined(text, f"<exited with exit code {code if code >= 0 else 128 - code}>")

    return builtin(
        "bash",
        "Run a bash command line in the working directory and return its output (stdout "
        "and stderr) and exit code.",
        BashParams,
        bash,
        asks=lambda p: shell_request(p.command, p.description),
    )


def _joined(output: str, note: str) -> str:
    output = output.rstrip("\n")
    return f"{output}\n{note}" if output else note


class _Exits(asyncio.subprocess.SubprocessStreamProtocol):
    """The protocol `create_subprocess_exec` uses, which also says when the process has
    exited: `Process.wait()` waits for its pipes to close too, which a process it left
    running in the background may keep open for ever."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=_CHUNK, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


class _Command:
    """A command line running in a process group of its own."""

    def __init__(self, process: asyncio.subprocess.Process, exited: asyncio.Future[None]):
        self.process = process
        self.exited = exited

    @classmethod
    async def start(
        cls, command: str, directory: WorkingDirectory, env: dict[str, str] | None
    ) -> _Command:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.subprocess_exec(
            lambda: _Exits(loop),
            "bash",
            "-c",
            command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=directory.real,
            env=env if env is not None else command_environment(),
            start_new_session=True,
        )
        return cls(asyncio.subprocess.Process(transport, protocol, loop), protocol.exited)

    async def stop(self) -> None:
        """Stop the group: SIGTERM, up to `GRACE` seconds for the command to end, then
        SIGKILL for whatever is left of the group (at once if the command has ended: what
        it left running is not waited for)."""
        group = self.process.pid  # start_new_session: the command leads a group of its own
        try:
            if not self.exited.done():
                _signal(group, signal.SIGTERM)
                with suppress(TimeoutError):
                    async with asyncio.timeout(GRACE):
                        await asyncio.shield(self.exited)
        finally:
            _signal(group, signal.SIGKILL)  # also if cancelled while waiting for the grace


def _killed_once_started(starting: asyncio.Future[_Command]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        _signal(starting.result().process.pid, signal.SIGKILL)


def _signal(group: int, number: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(group, number)


async def _drain(reader: asyncio.Future[None]) -> None:
    """Let the reader take what the pipe still holds; a pipe a process outside the group
    keeps open is given up on after `_DRAIN` seconds."""
    try:
        async with asyncio.timeout(_DRAIN):
            await asyncio.shield(reader)
    except TimeoutError:
        pass
    finally:
        reader.cancel()


class _Capture:
    """A command's output within `limit` bytes: the first half kept, and the last."""

    def __init__(self, limit: int) -> None:
        self._half = max(limit // 2, 1)
        self._head = bytearray()
        self._tail = bytearray()
        self._cut = 0

    async def read(self, stream: asyncio.StreamReader | None) -> None:
        while stream is not None and (chunk := await stream.read(_CHUNK)):
            self._add(chunk)

    def _add(self, chunk: bytes) -> None:
        room = self._half - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        self._tail += chunk
        if len(self._tail) > self._half:
            drop = len(self._tail) - self._half
            del self._tail[:drop]
            self._cut += drop

    def text(self) -> str:
        head = self._head.decode("utf-8", "replace")
        tail = self._tail.decode("utf-8", "replace")
        if not self._cut:
            return head + tail
        return f"{head}\n[... {self._cut} bytes of output cut ...]\n{tail}"


_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;", "|&"})
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S+$")


def shell_request(command: str, description: str) -> dict[str, Any]:
    """The `shell` permission request of a command line (the CLI's shape): the commands it
    runs, the words that look like paths or URLs, whether it redirects into a file. A
    client shows these to help a user decide; none is a guarantee (spec B7)."""
    words = _words(command)
    commands: list[str] = []
    paths: list[str] = []
    urls: list[str] = []
    redirects = False
    starts = True
    for i, word in enumerate(words):
        if word in _SEPARATORS:
            starts = True
            continue
        if word in (">", ">>", "&>", "&>>", ">|") and i + 1 < len(words):
            redirects = redirects or words[i + 1] != "/dev/null"
            continue
        if starts and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word, re.DOTALL):
            continue  # an assignment before the command
        if starts:
            commands.append(word)
            starts = False
        elif _URL.match(word):
            urls.append(word)
        elif not word.startswith("-") and ("/" in word or word.startswith(".")):
            paths.append(word)
    return {
        "kind": "shell",
        "full_command_text": command,
        "intention": description or command,
        "commands": [{"identifier": c, "read_only": False} for c in dict.fromkeys(commands)],
        "possible_paths": list(dict.fromkeys(paths)),
        "possible_urls": [{"url": u} for u in dict.fromkeys(urls)],
        "has_write_file_redirection": redirects,
        # trimtab approves a tool for the session, not a command: approving `bash` so
        # would approve every later command line.
        "can_offer_session_approval": False,
    }


def _words(command: str) -> list[str]:
    lexer = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: bash will say so; the request shows the text
        return command.split()
