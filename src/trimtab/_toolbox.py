"""`Toolbox`: the tools a session can call and the ones its model is shown.

The host's own tools, the tools of a tool source (MCP servers) that may change between turns,
the tools other hosts offer while the session is open (a second Copilot client's, spec D5),
and, when there are more than the session's threshold, the built-in `tool_search` in front of
the deferred ones (see `_toolsearch`), and the built-in `recall` when the session opts in
(`_recall`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from trimtab._recall import RECALL, make_recall
from trimtab._tools import Tool, ToolSource
from trimtab._toolsearch import TOOL_SEARCH, deferred, make_tool_search
from trimtab.events import SessionConfigData, ToolDefinition

__all__ = ["Toolbox"]

log = logging.getLogger("trimtab")

_NOTHING: frozenset[str] = frozenset()
"""Shared: nothing is deferred in most sessions, and an empty frozenset is not a singleton."""

_NO_TOOLS: Mapping[str, Tool] = MappingProxyType({})
"""Shared by every toolbox without source or offered tools."""


class Toolbox:
    """A session's tools."""

    __slots__ = ("_cache", "_guests", "_offered", "_own", "_source", "_sourced", "_tools")

    def __init__(self, tools: Mapping[str, Tool], source: ToolSource | None = None) -> None:
        # The client hands over a dict of its own, which sessions given the same tools share.
        self._own = tools if type(tools) is dict else dict(tools)
        """The tools the host gave: they win a name clash with the source's."""
        self._tools = self._own
        self._source = source
        self._sourced = _NO_TOOLS
        """The tool source's tools, as last refreshed."""
        self._guests = _NO_TOOLS
        """The offered tools in use."""
        self._offered: Mapping[str, Tool] | None = None
        """Tools offered since the last refresh (None: no change)."""
        self._cache: tuple[SessionConfigData, frozenset[str], dict[str, Tool]] | None = None

    @property
    def own(self) -> Mapping[str, Tool]:
        """The host's own tools (what a fork is given)."""
        return self._own

    @property
    def source_options(self) -> Mapping[str, Any] | None:
        """The tool source's configuration as given (what a fork is given again)."""
        return None if self._source is None else self._source.options

    def callable(self, config: SessionConfigData) -> Mapping[str, Tool]:
        """Every callable tool, the built-in `tool_search` included when tools are deferred
        (and `recall` when asked for)."""
        return self._deferral(config)[1]

    def deferred(self, config: SessionConfigData) -> frozenset[str]:
        """Tools left out of the model's list until `tool_search` finds them."""
        return self._deferral(config)[0]

    def shown(self, config: SessionConfigData, discovered: frozenset[str]) -> list[ToolDefinition]:
        """The tool definitions the model is sent: all but the deferred ones not found yet."""
        hidden, tools = self._deferral(config)
        return [t.definition for n, t in tools.items() if n not in hidden or n in discovered]

    def _deferral(self, config: SessionConfigData) -> tuple[frozenset[str], dict[str, Tool]]:
        # Recomputed only when the configuration changes (it is replaced, never mutated).
        if self._cache is None or self._cache[0] is not config:
            hidden = deferred(self._tools, config.tool_search) or _NOTHING
            tools = self._tools
            if hidden and TOOL_SEARCH not in tools:
                tools = {**tools, TOOL_SEARCH: make_tool_search(self._tools, hidden)}
            recall = config.recall
            if recall is not None and recall.enabled and RECALL not in tools:
                # (A host's own tool of that name wins: the built-in is opt-in, X7.)
                tools = {**tools, RECALL: make_recall(recall)}
            self._cache = (config, hidden, tools)
        return self._cache[1], self._cache[2]

    def offer(self, tools: Mapping[str, Tool]) -> None:
        """Offer `tools` too, in place of those offered before, from the next refresh on
        (the host's own tools win a name clash)."""
        self._offered = dict(tools)

    @property
    def settled(self) -> bool:
        """`refresh` has nothing to take in: no tool source, nothing offered since."""
        return self._source is None and self._offered is None

    async def refresh(self) -> Sequence[str]:
        """Take in what changed in the tool source (MCP servers started, their lists changed)
        and what was offered, before a turn, never during one, so that a batch sees one set
        of tools; returns the source's warnings for the log."""
        warnings: Sequence[str] = ()
        changed = self._offered is not None
        if self._offered is not None:
            self._guests, self._offered = self._offered, None
        if self._source is not None:
            try:
                tools, warnings = await self._source.refresh()
            except Exception:
                log.exception("a tool source failed")
                tools = None
            if tools is not None:
                self._sourced, changed = tools, True
        if changed:
            tools = {**self._sourced, **self._own} if self._sourced else self._own
            # Offered last: the session's own list stays the start of the model's.
            guests = {n: t for n, t in self._guests.items() if n not in tools}
            self._tools = {**tools, **guests} if guests else tools
            self._cache = None
        return warnings

    async def close(self) -> None:
        if self._source is not None:
            await self._source.close()
