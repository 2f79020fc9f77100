"""Wall time of one plain turn and one tool turn with ScriptedModel (no network, no model).

What is left is the runtime's own overhead: event construction, persistence, fan-out, the loop.

    python bench/turns.py [--runs 100]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from trimtab import Client, PermissionHandler, define_tool
from trimtab.testing import ScriptedModel, ScriptStep, tool_call


class EchoArgs(BaseModel):
    text: str


def echo(params: EchoArgs) -> str:
    return params.text


async def measure(store: str | Path, runs: int, with_tool: bool) -> list[float]:
    script: list[ScriptStep] = []
    for _ in range(runs + 10):
        script += [tool_call("echo", {"text": "hi"}), "done"] if with_tool else ["done"]
    model = ScriptedModel(script)
    times: list[float] = []
    async with Client(store=store) as client:
        session = await client.create_session(
            provider=model,
            system_message="You are a benchmark.",
            tools=[define_tool("echo", params_type=EchoArgs, handler=echo)],
            on_permission_request=PermissionHandler.approve_all,
        )
        for i in range(runs + 10):
            started = time.perf_counter()
            await session.send_and_wait("Say done")
            if i >= 10:  # warm-up
                times.append((time.perf_counter() - started) * 1000)
    return times


def import_time() -> float:
    code = "import time; t = time.perf_counter(); import trimtab; print(time.perf_counter() - t)"
    return float(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stores: dict[str, str | Path] = {"memory": "memory", "sqlite": Path(tmp) / "bench.db"}
        print(f"median / p90 of {args.runs} runs, ms")
        print(f"{'store':<8} {'plain turn':>16} {'one-tool turn':>16}")
        for name, store in stores.items():
            cells = []
            for with_tool in (False, True):
                times = sorted(await measure(store, args.runs, with_tool))
                p90 = times[int(len(times) * 0.9) - 1]
                cells.append(f"{statistics.median(times):7.3f} / {p90:6.3f}")
            print(f"{name:<8} {cells[0]:>16} {cells[1]:>16}")
    print(f"import trimtab: {import_time() * 1000:.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
