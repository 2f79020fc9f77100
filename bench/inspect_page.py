"""The session inspector on a large log: how long a 10,000-event session's page takes to open.

    python bench/inspect_page.py [--events 10000] [--opens 5] [--runs 20]

One session of about `--events` events is written to a fresh SQLite store by the real runtime
(`trimtab.testing.ScriptedModel` at the model boundary): runs of 40 model calls, each calling
an `echo` tool, with a clear every fifth run. Then, `--opens` times, a fresh `trimtab inspect`
process serves that store and the session's page is requested over HTTP on 127.0.0.1:

- cold open: the first request of a fresh inspector, which reads and folds the whole log;
- warm open: the same page again (`--runs` times, median and p90), which reads only what was
  appended since;
- other pages, warm: a page in the middle of the timeline, the window of the last model call
  (a replay of the whole log), the sessions page.

Times are wall time from sending the request to the last byte of the answer. The budget is a
cold open under a second. The last stdout line is the JSON result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2 as httpx
from pydantic import BaseModel

from trimtab import Client, PermissionHandler, define_tool
from trimtab.providers import ModelRequest
from trimtab.testing import ScriptedModel, ScriptStep, tool_call

BUDGET_MS = 1000.0
CALLS_PER_RUN = 40
SEED = "Reply with exactly FRESH_CONTEXT."


class EchoArgs(BaseModel):
    text: str


class ClearArgs(BaseModel):
    prompt: str


async def build(store: Path, events: int) -> tuple[str, int, int]:
    """A session of at least `events` events: its id, events and model calls."""
    calls = 0

    def reply(request: ModelRequest) -> ScriptStep:
        nonlocal calls
        calls += 1
        if calls % (5 * CALLS_PER_RUN) == 0:
            return tool_call("clear_context", {"prompt": SEED})
        if calls % CALLS_PER_RUN == 0:
            return "done"
        return tool_call("echo", {"text": f"call {calls}: " + "lorem ipsum " * 8})

    async def clear(params: ClearArgs, invocation: Any) -> str:
        await invocation.session.history.clear_context(params.prompt)
        return "cleared"

    tools = [
        define_tool("echo", description="Echo", params_type=EchoArgs, handler=lambda p: p.text),
        define_tool(
            "clear_context",
            description="Clear the context",
            params_type=ClearArgs,
            is_terminal=True,
            handler=clear,
        ),
    ]
    async with Client(store=store) as client:
        session = await client.create_session(
            provider=ScriptedModel(then=reply),
            system_message="You are a benchmark assistant.",
            tools=tools,
            on_permission_request=PermissionHandler.approve_all,
        )
        while len(log := await session.get_events()) < events:
            await session.send_and_wait("Go on.", timeout=120)
        calls = sum(event.type == "assistant.turn_start" for event in log)
        return session.session_id, len(log), calls


class Inspector:
    """A `trimtab inspect` process serving `store`."""

    def __init__(self, store: Path) -> None:
        src = Path(__file__).resolve().parents[1] / "src"
        self.token = secrets.token_urlsafe(32)  # every request carries it (spec L9)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
            "TRIMTAB_INSPECT_TOKEN": self.token,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trimtab", "inspect", "--store", str(store), "--port", "0"],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("inspecting sessions at "):
            self.close()
            raise RuntimeError(f"the inspector did not start: {line!r}")
        self.url = line.split(" at ", 1)[1].strip().split("?")[0]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def timed(http: httpx.Client, url: str) -> tuple[float, int]:
    """Milliseconds to the last byte of the answer, and its size."""
    started = time.perf_counter()
    response = http.get(url)
    elapsed = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return elapsed, len(response.content)


def spread(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median": round(statistics.median(ordered), 1),
        "p90": round(ordered[max(0, round(0.9 * len(ordered)) - 1)], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--opens", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="trimtab-inspect-bench-") as work:
        store = Path(work) / "sessions.db"
        started = time.perf_counter()
        session_id, events, calls = asyncio.run(build(store, args.events))
        built = time.perf_counter() - started
        page = f"sessions/{quote(session_id, safe='')}"
        cold: list[float] = []
        warm: list[float] = []
        others: dict[str, list[float]] = {"middle page": [], "last window": [], "sessions": []}
        size = 0
        with httpx.Client(timeout=60) as http:
            for _ in range(args.opens):
                inspector = Inspector(store)
                http.headers["authorization"] = f"Bearer {inspector.token}"
                try:
                    elapsed, size = timed(http, inspector.url + page)
                    cold.append(elapsed)
                    warm += [timed(http, inspector.url + page)[0] for _ in range(args.runs)]
                    for name, path in (
                        ("middle page", page + "?page=7"),
                        ("last window", page + f"/calls/{calls}"),
                        ("sessions", ""),
                    ):
                        http.get(inspector.url + path)  # its template compiled, its log read
                        others[name].append(timed(http, inspector.url + path)[0])
                finally:
                    inspector.close()

    result: dict[str, Any] = {
        "events": events,
        "model_calls": calls,
        "build_s": round(built, 1),
        "page_bytes": size,
        "cold_open_ms": spread(cold),
        "warm_open_ms": spread(warm),
        **{f"{name.replace(' ', '_')}_ms": spread(samples) for name, samples in others.items()},
        "budget_ms": BUDGET_MS,
        "holds": max(cold) < BUDGET_MS,
    }
    print(
        f"{events} events: cold open {result['cold_open_ms']['median']} ms median"
        f" (max {max(cold):.1f}, budget {BUDGET_MS:.0f}), warm {result['warm_open_ms']['median']}"
        f" ms; middle page {result['middle_page_ms']['median']} ms, window of the last call"
        f" {result['last_window_ms']['median']} ms, sessions page {result['sessions_ms']['median']}"
        " ms",
        file=sys.stderr,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
