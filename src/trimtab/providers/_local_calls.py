"""How the embedded model is asked for a tool call: the texts it is shown and what its grammar
lets it write. Pure functions, no model: `local` runs them.

A model of 135M parameters does not follow instructions so much as continue text, and copies
whatever stands nearby. Measured on SmolLM2-135M with `bench/local_arguments.py` (68 requests
for the demo tools, 10 for none), asking it for the tool's name and then for the arguments
against the JSON schema picked the tool meant for 33 requests (7 of 24 arithmetic ones, 5 of
22 asking the time) and wrote the arguments meant for 8: it copied the request's first words
or the schema's descriptions into the values. As below, 65 and 46; 7 of the 10 plain
questions and 20 of the 22 prompts a `clear_context` seeds get a reply. So:

- The choice among `reply` and the tools is not asked for, it is scored (`local._choose_tool`):
  the probability the model gives the user's message after each option's description, as a
  system message (for `reply`, the best of three kinds of plain answer). A description that
  explains the message makes it likelier; the option that makes it likeliest is picked.
  Asking "which step?" let the model's liking for one word win whatever the message said.
- The arguments are asked for with the parameters described in plain lines rather than as a
  JSON schema, and with the message last, next to the answer (`arguments_instruction`).
- What the grammar allows follows the request (`grammar_schema`): a request that quotes text
  for a tool with one text parameter gets exactly one of the quoted texts there, as a person
  who quotes means it verbatim; other text is bounded in length, so that it cannot run on.
  The grammar also keeps the schema's own constraints (`enum`, `pattern`, ...).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from trimtab.events import ToolDefinition

__all__ = [
    "REPLY",
    "REPLY_DESCRIPTIONS",
    "arguments_instruction",
    "grammar_schema",
    "quoted_spans",
]

REPLY = "reply"
"""The option that answers in text, next to the tools."""
REPLY_DESCRIPTIONS = (
    "You are a helpful assistant.",
    "Talk with the user.",
    "Write stories, poems, emails and jokes.",
)
"""What the text answer is conditioned on when choices are scored, the best of them counting:
a message written without a tool in mind is help asked of an assistant, conversation or a
request for writing. Against the first alone, 15 of the 22 prompts `bench/local_arguments.py`'s
`clear_context` cases seed (`Say hello.`, `Write a haiku about rain.`) called a tool in their
fresh run; against the three, 2 (and one time question of 22 gets a reply instead)."""

TEXT_CHARS = 1_000
"""The most characters of free text an argument may take (the grammar's bound): the model
cannot run on until the token limit cuts its JSON off."""

_QUOTES = {"'": "'", '"': '"', "`": "`", "«": "»", "“": "”", "„": "“", "‘": "’", "‹": "›"}
_ASCII_QUOTES = frozenset("'\"`")
"""Quotes that are also apostrophes (and inches, and code): they open only where a word does
not go on before them, and close only where none goes on after."""


def quoted_spans(text: str) -> list[str]:
    """The texts `text` quotes, outermost first-come (a quote inside a quoted text is part of
    it), trimmed, in order; empty quotes are left out."""
    spans: list[str] = []
    start = 0
    while start < len(text):
        opener = text[start]
        closer = _QUOTES.get(opener)
        if closer is None or (opener in _ASCII_QUOTES and _wordy(text, start - 1)):
            start += 1
            continue
        end = _closing(text, start, closer, ascii_quote=opener in _ASCII_QUOTES)
        if end is None:
            start += 1
            continue
        if span := text[start + 1 : end].strip():
            spans.append(span)
        start = end + 1
    return spans


def _closing(text: str, start: int, closer: str, *, ascii_quote: bool) -> int | None:
    """Where the quote opened at `start` closes, if it does."""
    end = text.find(closer, start + 1)
    while end > start:
        if not ascii_quote or (not text[end - 1].isspace() and not _wordy(text, end + 1)):
            return end
        end = text.find(closer, end + 1)
    return None


def _wordy(text: str, index: int) -> bool:
    return 0 <= index < len(text) and (text[index].isalnum() or text[index] == "_")


def grammar_schema(parameters: dict[str, Any], message: str) -> dict[str, Any]:
    """The schema the arguments' grammar is built from: `parameters` with the texts `message`
    quotes as the only values of its one text parameter, and every other text bounded.

    A text parameter is a string (or a string-or-null) without `enum`, `const` or `format`;
    quoted texts that do not match its `pattern` are not offered. With several text
    parameters nothing is forced (which quote is which is the model's to say), and titles and
    descriptions are dropped: they only name rules.
    """
    schema = copy.deepcopy(parameters)
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return schema
    texts = [branch for prop in properties.values() if (branch := _text_branch(prop))]
    spans = quoted_spans(message)
    if len(texts) == 1 and spans:
        [branch] = texts
        fitting = [span for span in spans if _fits(span, branch.get("pattern"))]
        if fitting:
            branch.clear()
            branch["enum"] = fitting
    for branch in texts:
        if "enum" not in branch and "pattern" not in branch:  # a pattern has its own bounds
            branch["maxLength"] = min(branch.get("maxLength", TEXT_CHARS), TEXT_CHARS)
    return schema


def _text_branch(prop: Any) -> dict[str, Any] | None:
    """The string schema of a text parameter (a string's own, or a nullable one's branch)."""
    if not isinstance(prop, dict):
        return None
    branches = prop.get("anyOf", [prop])
    strings = [b for b in branches if isinstance(b, dict) and b.get("type") == "string"]
    if len(strings) != 1 or {"enum", "const", "format"} & strings[0].keys():
        return None
    return strings[0]


def _fits(span: str, pattern: Any) -> bool:
    if not isinstance(pattern, str):
        return True
    try:
        return re.search(pattern, span) is not None
    except re.error:
        return True  # a pattern Python cannot read: the grammar still applies it


def arguments_instruction(tool: ToolDefinition, message: str) -> str:
    """What the model is asked before it writes `tool`'s arguments for `message`.

    The parameters are named with their types, not described: a description's examples are
    what a small model copies ("such as Europe/Paris" made every time zone Europe/Paris).
    """
    about = f": {tool.description.rstrip('.')}" if tool.description else ""
    lines = [f"The tool {tool.name}{about}."]
    parameters = _parameter_lines(tool.parameters)
    if parameters:
        lines += ["Its parameters:", *parameters]
    lines += [
        "",
        f'Message: "{message}"',
        "",
        f"Write the arguments for {tool.name} as a JSON object, with the values the message"
        " gives. Leave out an optional parameter the message does not give.",
    ]
    return "\n".join(lines)


def _parameter_lines(parameters: dict[str, Any]) -> list[str]:
    properties = parameters.get("properties")
    if not isinstance(properties, dict):
        return []
    required = parameters.get("required", [])
    return [
        f"- {name} ({_kind(prop)}{'' if name in required else ', optional'})"
        for name, prop in properties.items()
        if isinstance(prop, dict)
    ]


def _kind(prop: dict[str, Any]) -> str:
    kinds = [b.get("type") for b in prop.get("anyOf", [prop]) if isinstance(b, dict)]
    named = [k for k in kinds if isinstance(k, str) and k != "null"]
    return " or ".join(named) or "any value"
