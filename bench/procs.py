"""Processes the server benchmarks start and measure: `trimtab serve`, and /proc readings.

Stdlib only. `Server` runs `python -m trimtab.server` (what `trimtab serve` runs) on a free
127.0.0.1 port; `cpu_seconds` and `machine_busy` read /proc, so that CPU is measured per
process whatever else runs on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, or None if it is gone (or not on this machine)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values)
    return (total - idle) / CLK_TCK, total / CLK_TCK


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50, p99 (nearest rank) and max of samples."""
    if not samples:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan"), "n": 0}
    ordered = sorted(samples)

    def rank(q: float) -> float:
        return ordered[max(0, min(len(ordered), round(q * len(ordered))) - 1)]

    return {
        "p50": statistics.median(ordered),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "max": ordered[-1],
        "n": len(ordered),
    }


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the bench dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _log_file(path: Path) -> BinaryIO:
    return open(path, "wb")


@dataclass
class Server:
    """One `trimtab serve` process."""

    process: asyncio.subprocess.Process
    port: int
    log: Path

    @classmethod
    async def start(
        cls, store: str, provider: dict[str, Any], token: str, log: Path, *extra: str
    ) -> Server:
        command = [
            sys.executable,
            "-m",
            "trimtab.server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--store",
            store,
            "--provider",
            json.dumps(provider),
            "--token",
            token,
            *extra,
        ]
        stderr = _log_file(log)
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                preexec_fn=_die_with_parent,
            )
        finally:
            stderr.close()  # the child has its own descriptor
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), 30)
        except TimeoutError:
            line = b""
        text = line.decode(errors="replace")
        if not text.startswith("listening on port "):
            server = cls(process, 0, log)
            await server.stop()
            raise RuntimeError(f"a server did not start ({text!r}):\n{server.log_tail()}")
        return cls(process, int(text.split()[-1]), log)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def stop(self) -> None:
        """SIGTERM (the server lets its sessions go), SIGKILL after 10 s."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                print(f"server {self.pid} ignored SIGTERM; killing it", file=sys.stderr)
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
