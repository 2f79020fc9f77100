"""The names MCP tools get in a session: `<server>__<tool>`, unique and within providers' limits.

Providers accept tool names of `^[a-zA-Z0-9_-]{1,64}$` (OpenAI; Anthropic allows 128). A name
is the server's name and the tool's, joined by two underscores, each with any other character
replaced by `_`. When that is longer than 64 characters, or already taken (by a host tool, or
by another MCP tool that sanitises to the same text), it is cut to 55 characters and ends in
`_` and 8 hex digits of the SHA-256 of the server and tool names: stable across restarts and
resumes, and distinct. Names are given in sorted order, so the same tools always get the same
names.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from trimtab._tools import MAX_TOOL_NAME

__all__ = ["MAX_NAME", "assign_names"]

MAX_NAME = MAX_TOOL_NAME
"""OpenAI's limit on a tool name, the strictest of the providers (`define_tool`'s too)."""

_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")  # the characters outside `TOOL_NAME`'s
_DIGEST = 8


def _name(server: str, tool: str, salt: int) -> str:
    base = f"{_UNSAFE.sub('_', server)}__{_UNSAFE.sub('_', tool)}"
    if salt == 0 and len(base) <= MAX_NAME:
        return base
    digest = hashlib.sha256(f"{server}\0{tool}\0{salt or ''}".encode()).hexdigest()[:_DIGEST]
    return f"{base[: MAX_NAME - _DIGEST - 1]}_{digest}"


def assign_names(
    tools: Iterable[tuple[str, str]], taken: Iterable[str] = ()
) -> dict[tuple[str, str], str]:
    """A session-wide name for each `(server, tool)` pair, none of them in `taken`."""
    used = set(taken)
    names: dict[tuple[str, str], str] = {}
    for server, tool in sorted(set(tools)):
        salt = 0
        while (name := _name(server, tool, salt)) in used:
            salt += 1
        used.add(name)
        names[server, tool] = name
    return names
