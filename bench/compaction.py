"""Tokens a compaction saves on a sample long conversation (scripted model, no network).

A 40-turn conversation of ~150-token user messages and ~60-token replies, compacted once
by hand, and the same conversation driven with automatic compaction in an 8k window.

    python bench/compaction.py
"""

from __future__ import annotations

import asyncio

from trimtab import Client
from trimtab._compaction import COMPACTION_PROMPT
from trimtab._window import estimate_tokens
from trimtab.providers import ModelRequest
from trimtab.testing import ScriptedModel

TURNS = 40
QUESTION = "Here are the measurements for step {i}: " + "value {i} is within tolerance, " * 20
SUMMARY = "Steps 0-{n} were measured; every value was within tolerance; next: step {n1}."


def answer(request: ModelRequest) -> str:
    if request.messages[0].content.startswith(COMPACTION_PROMPT[:40]):
        return "The user reported measurements for many steps; all were within tolerance."
    return "Noted: all values are within tolerance, " + "continuing with the next step. " * 6


async def main() -> None:
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=ScriptedModel(then=answer), system_message="You log data."
        )
        for i in range(TURNS):
            await session.send_and_wait(QUESTION.format(i=i))
        before = estimate_tokens(session.window())
        result = await session.history.compact()
        after = estimate_tokens(session.window())
        print(
            f"manual: {TURNS} turns, window {before} -> {after} tokens "
            f"({result.messages_removed} messages, {result.tokens_removed} tokens removed, "
            f"{100 * (before - after) / before:.0f}% saved)"
        )

        model = ScriptedModel(then=answer)
        auto = await client.create_session(
            provider=model, system_message="You log data.", model_limits={"context_window": 8_000}
        )
        for i in range(TURNS):
            await auto.send_and_wait(QUESTION.format(i=i))
        sizes = [estimate_tokens(r.messages) for r in model.requests]
        compactions = sum(e.type == "session.compaction_complete" for e in await auto.get_events())
        print(
            f"auto (8k window): {compactions} compactions, largest request {max(sizes)} tokens, "
            f"final window {estimate_tokens(auto.window())} tokens; without compaction it would be "
            f"{before} tokens"
        )


if __name__ == "__main__":
    asyncio.run(main())
