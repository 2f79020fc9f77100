"""The agent's own tools, as the Copilot CLI has them: `view`, `create`, `edit`, `bash`,
`grep`, `glob` (and `report_intent` on request), with the CLI's names, parameters, result
texts and permission requests (spec section 14).

```python
session = await client.create_session(
    tools=[*builtin_tools(root="."), my_tool], on_permission_request=...
)
```

The file tools use only files under `root`; `bash` runs in it, in a process group of its
own that is killed when the command ends, runs out of time, or its call is cancelled.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping

from pydantic import BaseModel, ConfigDict, Field

from trimtab._durations import check_seconds
from trimtab._tools import Tool
from trimtab.builtin._ask import AskUser, ask_user_tool
from trimtab.builtin._base import BuiltinTool, builtin
from trimtab.builtin._directory import WorkingDirectory
from trimtab.builtin._files import create_tool, edit_tool, view_tool
from trimtab.builtin._search import glob_tool, grep_tool
from trimtab.builtin._shell import bash_tool, command_environment

__all__ = [
    "BUILTIN_TOOLS",
    "DEFAULT_BUILTIN_TOOLS",
    "AskUser",
    "BuiltinTool",
    "ask_user_tool",
    "builtin_tools",
    "command_environment",
]

DEFAULT_BUILTIN_TOOLS = ("view", "create", "edit", "bash", "grep", "glob")
"""The tools `builtin_tools` gives unless told which (spec B1)."""
BUILTIN_TOOLS = (*DEFAULT_BUILTIN_TOOLS, "report_intent")
"""Every built-in tool: `report_intent` is given only when named, as the current CLI no
longer has it (its recorded conversations answer "Tool 'report_intent' does not exist.")."""

SHELL_TIMEOUT = 120.0
"""Seconds a `bash` command, a `grep` or a `glob` may run."""
OUTPUT_LIMIT = 64 * 1024
"""Bytes of output one call returns (`bash` keeps the first and last halves)."""


class IntentParams(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    intent: str = Field(description="What you are doing now, in a few words.")


def builtin_tools(
    root: str | os.PathLike[str],
    *,
    names: Collection[str] = DEFAULT_BUILTIN_TOOLS,
    shell_timeout: float = SHELL_TIMEOUT,
    output_limit: int = OUTPUT_LIMIT,
    env: Mapping[str, str] | None = None,
) -> list[Tool]:
    """The built-in tools working in `root` (spec section 14).

    Args:
        root: An existing directory: the file tools use only files under it (its links
            resolved), and `bash` runs in it.
        names: Which tools, among `BUILTIN_TOOLS`.
        shell_timeout: Seconds a `bash` command may run before its process group is killed
            (the call ends `timeout`); also the time `grep` and `glob` may search.
        output_limit: Bytes of output one call returns at most.
        env: The environment of `bash` commands; by default this process's, without the
            variables that hold credentials (spec B6).

    Raises:
        ValueError: `root` is not a directory, a name is not a built-in tool, or a limit is
            not positive.
    """
    unknown = set(names) - set(BUILTIN_TOOLS)
    if unknown:
        raise ValueError(
            f"not built-in tools: {', '.join(sorted(unknown))} "
            f"(they are {', '.join(BUILTIN_TOOLS)})"
        )
    check_seconds("shell_timeout", shell_timeout)
    if output_limit < 1024:
        raise ValueError("output_limit must be at least 1024 bytes")
    directory = WorkingDirectory.at(root)
    made: dict[str, Callable[[], Tool]] = {
        "view": lambda: view_tool(directory, output_limit),
        "create": lambda: create_tool(directory),
        "edit": lambda: edit_tool(directory),
        "bash": lambda: bash_tool(directory, output_limit, shell_timeout, env),
        "grep": lambda: grep_tool(directory, output_limit, shell_timeout),
        "glob": lambda: glob_tool(directory, output_limit, shell_timeout),
        "report_intent": _report_intent,
    }
    return [made[name]() for name in BUILTIN_TOOLS if name in names]


def _report_intent() -> BuiltinTool:
    return builtin(
        "report_intent",
        "Say what you are doing now, in a few words, for the user to follow.",
        IntentParams,
        lambda params: "Intent logged",
    )
