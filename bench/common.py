"""What every benchmark worker shares: the scenario, the floor, timing, memory and output.

Stdlib only at import time: the peers' workers import it from their own virtual environment,
where trimtab is not installed. The floor imports `openai` when it is first used.

The scenario is the same for everyone: a system prompt, one tool `echo(text)`, and two kinds
of run, each in a fresh conversation:

- plain turn: the model answers at once (one request);
- one-tool turn: the model calls `echo`, the framework runs it and sends the result back,
  the model answers (two requests).

The floor is the raw `openai` client doing exactly that by hand: the least any framework
built on it can cost. A worker times its framework and the floor interleaved in one process,
so both see the same noise, and reports the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

MODEL = "fake-model"
SYSTEM = "You are a benchmark assistant. Answer briefly."
PLAIN_PROMPT = "Say done."
TOOL_PROMPT = "ECHO: call the echo tool with text hi, then say done."
TOOL_DESCRIPTION = "Echo the given text back."
ECHO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
}
API_KEY = "bench-key"

Turn = Callable[[], Awaitable[object]]


def echo(text: str) -> str:
    """The benchmark's tool."""
    return text


# --- statistics -----------------------------------------------------------------------------


def summary(samples_ms: Sequence[float]) -> dict[str, float]:
    """Median and p90 (nearest rank) of samples in ms."""
    ordered = sorted(samples_ms)
    p90 = ordered[max(0, round(0.9 * len(ordered)) - 1)]
    return {"median": statistics.median(ordered), "p90": p90, "n": len(ordered)}


def above(subject: Sequence[float], floor: Sequence[float]) -> dict[str, Any]:
    """The subject's median and p90 above the floor's (ms), and both summaries."""
    s, f = summary(subject), summary(floor)
    return {
        "median": s["median"] - f["median"],
        "p90": s["p90"] - f["p90"],
        "subject": s,
        "floor": f,
    }


async def interleaved(turns: dict[str, Turn], runs: int, warmup: int) -> dict[str, list[float]]:
    """Run every turn kind `warmup` times, then `runs` timed rounds of all of them.

    The order rotates every round, so that no kind always runs right after another (a
    connection reused warm, a collection triggered by the previous kind's garbage).
    """
    names = list(turns)
    for _ in range(warmup):
        for name in names:
            await turns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(runs):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            await turns[name]()
            times[name].append((time.perf_counter() - started) * 1000)
    return times


# --- the floor --------------------------------------------------------------------------------


class Floor:
    """The raw `openai` client running the scenario by hand.

    `lean=True` hands messages and tools over in `extra_body`, which skips the client's typed
    transform of every message (as trimtab's provider does): the least an HTTP round trip
    through this client costs.
    """

    def __init__(self, base_url: str, *, lean: bool = False) -> None:
        import openai

        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY)
        self.lean = lean
        self.tools: list[Any] = [
            {
                "type": "function",
                "function": {
                    "name": "echo",
                    "description": TOOL_DESCRIPTION,
                    "parameters": ECHO_SCHEMA,
                },
            }
        ]

    async def run(self, prompt: str, history: list[Any] | None = None) -> str:
        """One run: call the model, run any tool calls, repeat until it answers in text.

        With `history`, the conversation goes on from it and it is extended in place (the
        floor of a long session); else each run starts afresh.
        """
        messages: list[Any] = history if history is not None else []
        if not messages:
            messages.append({"role": "system", "content": SYSTEM})
        messages.append({"role": "user", "content": prompt})
        while True:
            if self.lean:
                response = await self.client.chat.completions.create(
                    model=MODEL, messages=[], extra_body={"messages": messages, "tools": self.tools}
                )
            else:
                response = await self.client.chat.completions.create(
                    model=MODEL, messages=messages, tools=self.tools
                )
            message = response.choices[0].message
            calls = message.tool_calls or []
            if not calls:
                messages.append({"role": "assistant", "content": message.content})
                return message.content or ""
            messages.append(
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {
                                "name": call.function.name,  # type: ignore[union-attr]
                                "arguments": call.function.arguments,  # type: ignore[union-attr]
                            },
                        }
                        for call in calls
                    ],
                }
            )
            for call in calls:
                arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": echo(**arguments)}
                )

    def turn(self, prompt: str) -> Turn:
        """A fresh-conversation run of `prompt`, as a turn to time."""
        return lambda: self.run(prompt)

    async def close(self) -> None:
        await self.client.close()


# --- memory -----------------------------------------------------------------------------------


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default), from /proc."""
    with open(f"/proc/{pid or os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def settled_rss() -> int:
    """This process's resident set once garbage is collected and glibc's `malloc_trim(0)`
    has handed free heap pages back: what the live objects occupy, not what the allocator
    kept from earlier garbage (a fair reading; it changes no live object). From
    /proc/self/statm."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: no trim, still RSS
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def bytes_per_session(
    make: Callable[[int], Awaitable[object]], count: int
) -> dict[str, float]:
    """Memory per idle session: `make(i)` opens session i and runs one turn in it; the
    sessions are kept alive by the caller. Reports tracemalloc's count of Python allocations
    per session and, for what tracemalloc cannot see (SQLite, C buffers), RSS growth."""
    await make(-1)  # warm caches, connection pools, lazily built schemas
    gc.collect()
    rss_before = rss_bytes()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(count):
        await make(i)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    traced = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    return {
        "traced": traced / count,
        "rss": (rss_bytes() - rss_before) / count,
        "sessions": count,
    }


# --- import time ----------------------------------------------------------------------------


def import_seconds(statement: str, python: str | None = None, repeats: int = 5) -> float:
    """Median wall time of `statement` in a fresh interpreter (after one discarded run that
    warms the OS file cache)."""
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    times = []
    for _ in range(repeats + 1):
        out = subprocess.run(
            [python or sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times[1:])


# --- output ----------------------------------------------------------------------------------


def worker_args(description: str) -> argparse.Namespace:
    """The options every worker takes (run.py passes them)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--base-url", required=True, help="the fake model server's /v1 root")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=1000, help="idle sessions to measure")
    return parser.parse_args()


async def measure_turns(
    base_url: str, runs: int, warmup: int, plain: Turn, tool: Turn
) -> dict[str, Any]:
    """Plain and one-tool turns of a framework, interleaved with the floor's."""
    floor = Floor(base_url)
    try:
        times = await interleaved(
            {
                "floor_plain": floor.turn(PLAIN_PROMPT),
                "plain": plain,
                "floor_tool": floor.turn(TOOL_PROMPT),
                "tool": tool,
            },
            runs,
            warmup,
        )
    finally:
        await floor.close()
    return {
        "plain": above(times["plain"], times["floor_plain"]),
        "tool": above(times["tool"], times["floor_tool"]),
    }


def report(result: dict[str, Any]) -> None:
    """Print the worker's result as one JSON line on stdout (the last line is the result)."""
    print(json.dumps(result), flush=True)


def run_worker(main: Callable[[], Coroutine[Any, Any, dict[str, Any]]]) -> None:
    report(asyncio.run(main()))
