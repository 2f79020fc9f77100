"""Deferred tools and the built-in `tool_search`: policy only, no I/O.

With many tools, sending every schema on every call wastes the window. When tool search is
enabled and the session has more tools than `defer_threshold`, tools whose `defer` is not
`"never"` are left out of the model's tool list; the model finds them with `tool_search`,
and what it finds stays callable for the rest of the run. It works the same for every
provider, because it is only a tool.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict

from trimtab._tools import Tool, ToolResult, define_tool
from trimtab.events import ToolDefinition, ToolSearch

__all__ = ["TOOL_SEARCH", "SearchArgs", "deferred", "make_tool_search", "search"]

TOOL_SEARCH = "tool_search"


class SearchArgs(BaseModel):
    model_config = ConfigDict(defer_build=True)

    query: str
    """Words describing the capability needed, such as "send email" or "weather forecast"."""


def deferred(tools: Mapping[str, Tool], config: ToolSearch) -> frozenset[str]:
    """The names of the tools to leave out of the model's tool list until found."""
    if not config.enabled or len(tools) <= config.defer_threshold:
        return frozenset()
    return frozenset(
        name
        for name, tool in tools.items()
        if tool.definition.defer != "never" and name != TOOL_SEARCH
    )


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if len(w) > 1}


def search(
    query: str, candidates: Iterable[ToolDefinition], *, limit: int = 5
) -> list[ToolDefinition]:
    """The candidates that best match `query`: word overlap, names weighted double."""
    wanted = _words(query)
    scored = []
    for definition in candidates:
        score = 2 * len(wanted & _words(definition.name)) + len(
            wanted & _words(definition.description)
        )
        if score or definition.name.lower() in query.lower():
            scored.append((-score, definition.name, definition))
    return [d for _, _, d in sorted(scored, key=lambda item: item[:2])[:limit]]


def make_tool_search(candidates: Mapping[str, Tool], hidden: frozenset[str]) -> Tool:
    """The built-in `tool_search` over the `hidden` tools of `candidates`."""

    def tool_search(params: SearchArgs) -> ToolResult:
        found = search(params.query, (candidates[name].definition for name in sorted(hidden)))
        if not found:
            return ToolResult(text_result_for_llm=f"No tools match {params.query!r}.")
        lines = [f"- {d.name}: {d.description}" for d in found]
        text = "These tools are now available to call:\n" + "\n".join(lines)
        return ToolResult(text_result_for_llm=text, tool_references=[d.name for d in found])

    return define_tool(
        TOOL_SEARCH,
        description=(
            "Search the tools that are not loaded yet. Describe the capability you need; "
            "the matching tools become callable."
        ),
        params_type=SearchArgs,
        skip_permission=True,
        handler=tool_search,
    )
