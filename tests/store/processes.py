"""Child processes for the multi-process store tests: a script started with arguments, which
prints "ready", waits for "go" on stdin, then reports on stdout; killed when the test ends."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trimtab.store

SRC = Path(trimtab.store.__file__).resolve().parents[2]
"""The directory holding the `trimtab` package under test, for the children's PYTHONPATH."""


@asynccontextmanager
async def child(script: Path, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`script` running with `args`, ready and waiting for "go"; killed on exit."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        assert await next_line(proc) == "ready"
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def next_line(proc: asyncio.subprocess.Process, timeout: float = 15) -> str:
    """The child's next stdout line; fails with its stderr if it died instead."""
    assert proc.stdout is not None and proc.stderr is not None
    async with asyncio.timeout(timeout):
        line = await proc.stdout.readline()
    if not line:
        raise AssertionError(f"child process died: {(await proc.stderr.read()).decode()}")
    return line.decode().strip()


def go(*procs: asyncio.subprocess.Process) -> None:
    """Let ready children start, together."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
