"""What a typed result costs over a plain reply (issue 39): one run each, in process.

A plain run is one model call whose reply ends the run. A typed run (`send_and_wait(...,
output_type=City)`) is one model call that calls the run's `final_result` tool, whose checked
arguments end it: the tool call's events and the result's check are its extra work. The model
is `ScriptedModel` (no network), so the figures are trimtab's own; runs alternate, so that
both see the same noise. The embedded model (`--local`) shows what the schema in the prompt
and the constrained arguments cost a real (small) model.

    python bench/structured_output.py [--runs 500] [--store memory|sqlite] [--local N]

Prints one JSON line: the median and p90 (ms) of each kind of run, their difference, and the
events each run stores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trimtab import Client, Session
from trimtab.providers import ModelRequest
from trimtab.testing import ScriptedModel, ScriptStep, tool_call


class City(BaseModel):
    """A city and how many live there."""

    name: str
    population: int


def answer(request: ModelRequest) -> ScriptStep:
    if request.tools:
        return tool_call("final_result", {"name": "Oslo", "population": 709_000})
    return "Oslo has about 709,000 inhabitants."


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median": round(statistics.median(ordered), 3),
        "p90": round(ordered[max(0, round(0.9 * len(ordered)) - 1)], 3),
    }


async def timed(session: Session, typed: bool) -> float:
    started = time.perf_counter()
    if typed:
        await session.send_and_wait("Which city?", output_type=City)
    else:
        await session.send_and_wait("Which city?")
    return (time.perf_counter() - started) * 1000


async def scripted(runs: int, store: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        where = "memory" if store == "memory" else Path(folder) / "trimtab.db"
        async with Client(store=where) as client:
            plain_session = await client.create_session(provider=ScriptedModel(then=answer))
            typed_session = await client.create_session(provider=ScriptedModel(then=answer))
            for _ in range(20):  # warm-up: schemas built, caches filled
                await timed(plain_session, False)
                await timed(typed_session, True)
            plain, typed = [], []
            for _ in range(runs):
                plain.append(await timed(plain_session, False))
                typed.append(await timed(typed_session, True))
            events = [len(await s.get_events()) for s in (plain_session, typed_session)]
    per_run = [(count - 1) / (runs + 20) for count in events]
    return {
        "store": store,
        "runs": runs,
        "plain_ms": summary(plain),
        "typed_ms": summary(typed),
        "typed_over_plain_ms": round(statistics.median(typed) - statistics.median(plain), 3),
        "stored_events_per_run": {"plain": per_run[0], "typed": per_run[1]},
    }


async def local(runs: int) -> dict[str, Any]:
    """The embedded model (SmolLM2-135M): a plain run, a typed one by the tool, a typed one
    natively (its reply under the schema's grammar), each in a fresh session each time, so
    that no run reuses another's prompt state."""
    kinds = ("plain", "tool", "native")
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    tokens = dict.fromkeys(kinds, 0)
    async with Client(store="memory", provider={"type": "local"}) as client:
        warm = await client.create_session()
        await warm.send_and_wait("Hi")  # loads the model
        for _ in range(runs):
            for kind in kinds:
                mode = "native" if kind == "native" else "tool"
                session = await client.create_session(structured_output=mode)
                samples[kind].append(await timed(session, kind != "plain"))
                usage = [e for e in await session.get_events() if e.type == "assistant.usage"]
                tokens[kind] = usage[-1].data.input_tokens or 0
    medians = {kind: statistics.median(samples[kind]) for kind in kinds}
    return {
        "local_runs": runs,
        **{f"{kind}_ms": summary(samples[kind]) for kind in kinds},
        "tool_over_plain_ms": round(medians["tool"] - medians["plain"], 1),
        "native_over_plain_ms": round(medians["native"] - medians["plain"], 1),
        "prompt_tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--store", default="memory", choices=["memory", "sqlite"])
    parser.add_argument("--local", type=int, default=0, help="embedded-model runs (0: none)")
    args = parser.parse_args()
    result = asyncio.run(scripted(args.runs, args.store))
    if args.local:
        result["local"] = asyncio.run(local(args.local))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
