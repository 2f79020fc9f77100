"""Which built-in tools a served session gets, and where they work (spec B8, B9).

Whether they run for a server's clients at all is its host policy's word
(`HostPolicy.allows_builtin_tools`: over stdio yes, over a socket when the operator says
so, S11); a session's `workingDirectory` is a path its client names, which the policy's
rule for files allows or refuses (S13).
"""

from __future__ import annotations

from pathlib import Path

from trimtab import Tool
from trimtab.builtin import (
    BUILTIN_TOOLS,
    DEFAULT_BUILTIN_TOOLS,
    AskUser,
    ask_user_tool,
    builtin_tools,
)
from trimtab.protocol.wire import SessionOptionsParams
from trimtab.server.policy import HostPolicy

__all__ = ["session_builtins"]


def session_builtins(
    policy: HostPolicy, params: SessionOptionsParams, ask: AskUser | None
) -> list[Tool]:
    """The built-in tools of a session created or resumed with `params`.

    The CLI's default set when the policy allows the built-in tools, and `report_intent`
    when `availableTools` names it, working in the session's `workingDirectory` (else the
    server's current directory); `ask_user` when the client answers `userInput.request`.
    Each only if `availableTools` / `excludedTools` let the model have it and the client
    declared no tool of that name (the client's own replaces it).

    Raises:
        PolicyRefusedError: The policy reads no file the client names there (S13).
        ValueError: The `workingDirectory` is not a directory.
    """
    declared = {tool.name for tool in params.tools or ()}

    def wanted(name: str) -> bool:
        return name not in declared and params.offers(name)

    tools: list[Tool] = []
    named = set(params.available_tools or ()) & set(BUILTIN_TOOLS)
    names = [n for n in BUILTIN_TOOLS if wanted(n) and (n in DEFAULT_BUILTIN_TOOLS or n in named)]
    if names and policy.allows_builtin_tools():
        tools += builtin_tools(_root(policy, params.working_directory), names=names)
    if ask is not None and params.request_user_input and wanted("ask_user"):
        tools.append(ask_user_tool(ask))
    return tools


def _root(policy: HostPolicy, working_directory: str | None) -> Path:
    if not working_directory:
        return Path.cwd()
    path = Path(working_directory).expanduser()
    path = policy.check_path(path if path.is_absolute() else Path.cwd() / path, "workingDirectory")
    if not path.is_dir():
        raise ValueError(f"workingDirectory {working_directory!r} is not a directory")
    return path
