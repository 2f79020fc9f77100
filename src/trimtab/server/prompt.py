"""The system message of a session opened by a Copilot client (spec D1, D2).

The reference runtime always sends the model a system message of its own, made of named
sections, and a client's `systemMessage` adds to it (`append`), replaces it (`replace`) or
edits it section by section (`customize`). trimtab's default is a short one made of a few of
those sections, so that a client written for the reference runtime gets the same shape of
request, and the same edits mean the same thing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from trimtab.protocol.wire import SectionOverride, SystemMessage

__all__ = ["DEFAULT_SECTIONS", "SECTION_ORDER", "Transform", "system_prompt"]

DEFAULT_SECTIONS: dict[str, str] = {
    "identity": (
        "You are an AI assistant working inside an application built on trimtab, an agent "
        "session runtime. You help the application's user with the task at hand."
    ),
    "tone": "Be concise and direct. Say so when you are unsure or cannot do something.",
    "tool_efficiency": (
        "Use the tools you are given when they help; call independent tools in parallel. "
        "Report what a tool returned rather than guessing it."
    ),
}
"""trimtab's default system message, by section (written in `SECTION_ORDER`)."""

SECTION_ORDER = (
    "preamble",
    "identity",
    "tone",
    "tool_efficiency",
    "environment_context",
    "code_change_rules",
    "guidelines",
    "safety",
    "tool_instructions",
    "custom_instructions",
    "runtime_instructions",
    "last_instructions",
)
"""The sections the Copilot SDKs name, in the order the prompt is written."""

_IDENTITY_GROUP = ("identity", "preamble", "tone", "tool_efficiency")
"""What removing `identity` removes (the group of sub-sections it heads), unless preserved."""

Transform = Callable[[dict[str, str]], Awaitable[dict[str, str]]]
"""Asks the client to rewrite sections (`systemMessage.transform`): {id: text} in and out."""


async def system_prompt(message: SystemMessage | None, transform: Transform | None) -> str:
    """The system message a session is created with.

    No `systemMessage`, or `append`: the default, then the client's content. `replace`: the
    content alone (empty: no system message at all). `customize`: the default with each named
    section replaced, removed, appended or prepended to, or rewritten by the client
    (`transform`, when one is given: else the section is kept), then the content.
    """
    if message is None:
        return _join(DEFAULT_SECTIONS.values())
    if message.mode == "replace":
        return message.content or ""
    sections = dict(DEFAULT_SECTIONS)
    if message.mode == "customize":
        sections = await _customize(sections, message.sections or {}, transform)
    ordered = [sections[s] for s in SECTION_ORDER if s in sections]
    ordered += [text for s, text in sections.items() if s not in SECTION_ORDER]
    return _join([*ordered, message.content or ""])


async def _customize(
    sections: dict[str, str], overrides: dict[str, SectionOverride], transform: Transform | None
) -> dict[str, str]:
    if (group := overrides.get("identity")) is not None and group.action == "remove":
        kept = {s for s, o in overrides.items() if o.action != "remove"}
        sections = {s: t for s, t in sections.items() if s not in _IDENTITY_GROUP or s in kept}
    rewrite: dict[str, str] = {}
    for section, override in overrides.items():
        current, content = sections.get(section, ""), override.content or ""
        match override.action:
            case "remove":
                sections.pop(section, None)
            case "replace":
                sections[section] = content
            case "append":
                sections[section] = _join([current, content])
            case "prepend":
                sections[section] = _join([content, current])
            case "transform":
                rewrite[section] = current
            case "preserve":
                pass
    if rewrite and transform is not None:
        answer = await transform(rewrite)
        sections.update({s: answer[s] for s in rewrite if s in answer})
    return {s: t for s, t in sections.items() if t}


def _join(parts: Iterable[str]) -> str:
    return "\n\n".join(part for part in parts if part)
