"""Client hooks: `hooks.invoke` requests to the client that created a session with `hooks: true`.

trimtab's core has no hook points yet, so the server calls the hooks where an adapter can:
around client-side tool calls (`preToolUse` after the permission check, `postToolUse`,
`postToolUseFailure`), on `session.send` (`userPromptSubmitted`), and when a session is
opened or let go (`sessionStart`, `sessionEnd`). A hook that fails or times out is ignored,
as the official clients ignore a failing hook handler.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import pydantic_core

from trimtab import PromptBlockedError, ToolResult
from trimtab.protocol.jsonrpc import Connection, RpcError

__all__ = ["HOOK_TIMEOUT", "Hooks", "PreToolUse"]

log = logging.getLogger("trimtab.server")

HOOK_TIMEOUT = 30.0
"""Seconds a hook may take before the server goes on without its output."""


def _storable(value: Any) -> bool:
    """Whether the event log can hold `value` (what a hook returns may end up in an event):
    JSON the store can encode, with no lone surrogates."""
    try:
        pydantic_core.to_json(value)
    except pydantic_core.PydanticSerializationError:
        return False
    return True


@dataclass(frozen=True)
class PreToolUse:
    """What `preToolUse` decided: the arguments to use, or why the call is denied."""

    arguments: Any
    denied: str | None = None


class Hooks:
    """The hook calls of one session. `target` is the connection that asked for hooks."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.target: Connection | None = None

    async def invoke(self, hook_type: str, data: dict[str, Any]) -> dict[str, Any]:
        """The hook's output, or `{}` when there is no hook or it failed."""
        target = self.target
        if target is None or target.closed:
            return {}
        hook_input = {
            **data,
            "sessionId": self.session_id,
            "timestamp": int(time.time() * 1000),
            "cwd": os.getcwd(),
        }
        params = {"sessionId": self.session_id, "hookType": hook_type, "input": hook_input}
        try:
            answer = await target.request("hooks.invoke", params, timeout=HOOK_TIMEOUT)
        except (RpcError, ConnectionError, TimeoutError) as exc:
            log.warning("hook %s of session %s failed: %s", hook_type, self.session_id, exc)
            return {}
        output = answer.get("output") if isinstance(answer, dict) else None
        if not isinstance(output, dict) or not _storable(output):
            return {}
        return output

    async def pre_tool_use(self, name: str, arguments: Any) -> PreToolUse:
        """`preToolUse`: a `deny` decision stops the call; `modifiedArgs` replace the arguments."""
        output = await self.invoke("preToolUse", {"toolName": name, "toolArgs": arguments})
        if output.get("permissionDecision") == "deny":
            reason = output.get("permissionDecisionReason")
            return PreToolUse(arguments, str(reason or f"The preToolUse hook denied {name}."))
        return PreToolUse(output.get("modifiedArgs", arguments))

    async def post_tool_use(self, name: str, arguments: Any, result: ToolResult) -> ToolResult:
        """`postToolUse` (may replace the result text) or `postToolUseFailure`."""
        if result.result_type != "success":
            failure = {"toolName": name, "toolArgs": arguments, "error": result.text_result_for_llm}
            await self.invoke("postToolUseFailure", failure)
            return result
        output = await self.invoke(
            "postToolUse",
            {"toolName": name, "toolArgs": arguments, "toolResult": result.text_result_for_llm},
        )
        modified = output.get("modifiedResult")
        if isinstance(modified, str):
            return result.model_copy(update={"text_result_for_llm": modified})
        return result

    async def user_prompt_submitted(self, prompt: str) -> str:
        """`userPromptSubmitted`: the prompt to send (`modifiedPrompt`), or `PromptBlockedError`."""
        output = await self.invoke("userPromptSubmitted", {"prompt": prompt})
        if output.get("decision") == "block":
            raise PromptBlockedError(str(output.get("reason") or "blocked by a hook"))
        modified = output.get("modifiedPrompt")
        return modified if isinstance(modified, str) and modified.strip() else prompt

    async def session_start(self, source: str) -> None:
        """`sessionStart` with source `new` or `resume`; its output is not used."""
        await self.invoke("sessionStart", {"source": source})

    async def session_end(self, reason: str) -> None:
        """`sessionEnd` when the hook's connection lets the session go."""
        await self.invoke("sessionEnd", {"reason": reason})
