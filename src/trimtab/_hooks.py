"""Hooks: the host's say at fixed points of a session, in the Copilot SDK's shape.

`create_session(hooks={"on_pre_tool_use": handler, ...})` takes the Copilot SDK's session hooks:
each handler is called with the hook's input (a dict with camelCase keys, as the Copilot
clients receive it over the wire) and `{"session_id": ...}`, sync or async, and may return an
output dict or None. The loop calls them at its hook points; `trimtab serve` plugs a client's
hooks in the same way (it forwards each call as `hooks.invoke`). A hook that fails, returns
nonsense or takes longer than `HOOK_TIMEOUT` is ignored, as the official clients ignore a
failing handler: a hook can shape a session, never break it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import pydantic_core
from typing_extensions import TypedDict

from trimtab._errors import PromptBlockedError, contained

__all__ = [
    "HOOK_TIMEOUT",
    "SUPPRESSED",
    "HookHandler",
    "Hooks",
    "PostToolUse",
    "PreToolUse",
    "SessionHooks",
]

log = logging.getLogger("trimtab")

HOOK_TIMEOUT = 30.0
"""Seconds a hook may take before the session goes on without its output."""

HookHandler: TypeAlias = Callable[[dict[str, Any], dict[str, str]], Any]
"""`handler(input, invocation) -> output | None`, sync or async; `invocation` holds the
`session_id`."""


class SessionHooks(TypedDict, total=False):
    """The Copilot SDK's session hooks that trimtab calls."""

    on_pre_tool_use: HookHandler
    """Before a tool call runs: `permissionDecision` `deny` (with a reason) refuses it,
    `allow` runs it without asking the permission handler; `modifiedArgs` replace its
    arguments; `suppressOutput` keeps its result from the model; `additionalContext` is
    added to the conversation after the call (spec D13)."""
    on_post_tool_use: HookHandler
    """After a call succeeded: `modifiedResult` (text) replaces what the model sees;
    `suppressOutput` and `additionalContext` as for `on_pre_tool_use`."""
    on_post_tool_use_failure: HookHandler
    """After a call ended any other way; told the failure text; `additionalContext` as for
    `on_pre_tool_use`."""
    on_user_prompt_submitted: HookHandler
    """Before a prompt is sent: `modifiedPrompt` replaces it, `decision: "block"` refuses it
    (`PromptBlockedError`; nothing is stored), `additionalContext` follows it (spec D13)."""
    on_user_prompt_transformed: HookHandler
    """Then, told the `prompt` as sent and the `transformedPrompt` the model will read (after
    `userPromptSubmitted`): `modifiedTransformedPrompt` replaces the latter (spec D10)."""
    on_agent_stop: HookHandler
    """When a run is about to end with the model's answer (`stopReason` `end_turn`,
    `stopHookActive`: whether this run already went on because of this hook): `decision:
    "block"` makes it go on, with the `reason` as the next user message (spec D10)."""
    on_session_start: HookHandler
    """When a session is created or resumed (`source`: `new` or `resume`), before that is
    logged: `additionalContext` is the session's start context (spec D13)."""
    on_session_end: HookHandler
    """When a session is let go (`reason`)."""


_WIRE_NAMES = {
    "on_pre_tool_use": "preToolUse",
    "on_post_tool_use": "postToolUse",
    "on_post_tool_use_failure": "postToolUseFailure",
    "on_user_prompt_submitted": "userPromptSubmitted",
    "on_user_prompt_transformed": "userPromptTransformed",
    "on_agent_stop": "agentStop",
    "on_session_start": "sessionStart",
    "on_session_end": "sessionEnd",
}
"""Each hook's `hookType` on the wire."""


@dataclass(frozen=True, slots=True)
class PreToolUse:
    """What `preToolUse` decided about a call."""

    arguments: Any
    """The arguments to run it with (the model's, or the hook's `modifiedArgs`)."""
    denied: str | None = None
    """Why the hook refused the call; None: not refused."""
    approved: bool = False
    """The hook approved the call: the permission handler is not asked."""
    suppressed: bool = False
    """`suppressOutput`: the model does not see the call's result (`SUPPRESSED` instead)."""
    note: str | None = None
    """The hook's `additionalContext`, as the model reads it after the call."""


@dataclass(frozen=True, slots=True)
class PostToolUse:
    """What `postToolUse` made of a successful call's result."""

    text: str
    """The result the model sees (the call's, or the hook's `modifiedResult`)."""
    suppressed: bool = False
    note: str | None = None


SUPPRESSED = "The output of this tool call was suppressed by a hook."
"""What the model reads of a successful call whose output a hook suppressed (spec D13)."""


class Hooks:
    """A session's hooks, called at the loop's hook points."""

    __slots__ = ("_handlers", "_session_id")

    def __init__(self, session_id: str, handlers: SessionHooks | None) -> None:
        self._session_id = session_id
        # None, not an empty dict, in the many sessions without hooks.
        self._handlers = handlers or None

    @property
    def handlers(self) -> SessionHooks:
        """The host's handlers, by hook name."""
        return self._handlers or {}

    def __bool__(self) -> bool:
        return bool(self._handlers)

    async def _call(self, name: str, data: dict[str, Any]) -> dict[str, Any]:
        """The hook's output, or `{}` when there is none or it failed."""
        handler = cast("HookHandler | None", self._handlers and self._handlers.get(name))
        if handler is None:
            return {}
        hook_input = {
            **data,
            "sessionId": self._session_id,
            "timestamp": int(time.time() * 1000),
            # `workingDirectory` is the protocol's name; `cwd` stays for hooks written before.
            "workingDirectory": (cwd := os.getcwd()),
            "cwd": cwd,
        }
        try:
            async with asyncio.timeout(HOOK_TIMEOUT):
                output = handler(hook_input, {"session_id": self._session_id})
                if inspect.isawaitable(output):
                    output = await output
        except BaseException as exc:
            if not contained(exc):
                raise
            log.warning(
                "hook %s of session %s failed: %s", _WIRE_NAMES[name], self._session_id, exc
            )
            return {}
        if not isinstance(output, dict) or not _storable(output):
            return {}  # what a hook returns may end up in the log
        return output

    async def pre_tool_use(self, name: str, arguments: Any) -> PreToolUse:
        output = await self._call("on_pre_tool_use", {"toolName": name, "toolArgs": arguments})
        decision = output.get("permissionDecision")
        note = _note(output, f'Tool "{name}" was called. Additional context from preToolUse')
        if decision == "deny":
            reason = output.get("permissionDecisionReason")
            denied = str(reason or f"The preToolUse hook denied {name}.")
            return PreToolUse(arguments, denied=denied, note=note)
        return PreToolUse(
            output.get("modifiedArgs", arguments),
            approved=decision == "allow",
            suppressed=output.get("suppressOutput") is True,
            note=note,
        )

    async def post_tool_use(self, name: str, arguments: Any, result: str) -> PostToolUse:
        """What the model sees after a successful call."""
        data = {"toolName": name, "toolArgs": arguments, "toolResult": result}
        output = await self._call("on_post_tool_use", data)
        modified = output.get("modifiedResult")
        return PostToolUse(
            modified if isinstance(modified, str) else result,
            suppressed=output.get("suppressOutput") is True,
            note=_note(output, f'Tool "{name}" succeeded. Additional context from postToolUse'),
        )

    async def post_tool_use_failure(self, name: str, arguments: Any, error: str) -> str | None:
        """The note the model reads after the failed call, if the hook gave one."""
        data = {"toolName": name, "toolArgs": arguments, "error": error}
        output = await self._call("on_post_tool_use_failure", data)
        # The reference runtime's words, so that recorded conversations replay unchanged.
        return _note(output, f'Tool "{name}" failed. Additional guidance from postToolUseFailure')

    async def user_prompt_submitted(self, prompt: str) -> str:
        """The prompt to send, as `userPromptSubmitted` then `userPromptTransformed` shaped
        it (the former's `additionalContext` follows it, after a blank line), or
        `PromptBlockedError`."""
        output = await self._call("on_user_prompt_submitted", {"prompt": prompt})
        if output.get("decision") == "block":
            raise PromptBlockedError(str(output.get("reason") or "blocked by a hook"))
        modified = output.get("modifiedPrompt")
        transformed = modified if isinstance(modified, str) and modified.strip() else prompt
        if (context := _context(output)) is not None:
            transformed = f"{transformed}\n\n{context}"
        data = {"prompt": prompt, "transformedPrompt": transformed}
        output = await self._call("on_user_prompt_transformed", data)
        final = output.get("modifiedTransformedPrompt")
        return final if isinstance(final, str) and final.strip() else transformed

    async def agent_stop(self, active: bool) -> str | None:
        """What the run goes on with (the hook blocked its end), or None: it ends."""
        data = {"stopReason": "end_turn", "stopHookActive": active}
        output = await self._call("on_agent_stop", data)
        if output.get("decision") != "block":
            return None
        reason = output.get("reason")
        return reason if isinstance(reason, str) and reason.strip() else "Continue."

    async def session_start(self, source: str) -> str | None:
        """The hook's `additionalContext` (`""` when it answered a blank one), or None when
        it gave none."""
        context = (await self._call("on_session_start", {"source": source})).get(
            "additionalContext"
        )
        return context.strip() if isinstance(context, str) else None

    async def session_end(self, reason: str) -> None:
        await self._call("on_session_end", {"reason": reason})


def wire_name(hook: str) -> str:
    """A hook's `hookType` on the wire (`on_pre_tool_use` -> `preToolUse`)."""
    return _WIRE_NAMES[hook]


def _context(output: dict[str, Any]) -> str | None:
    """A hook's `additionalContext`, if it gave a non-blank one."""
    context = output.get("additionalContext")
    return context.strip() if isinstance(context, str) and context.strip() else None


def _note(output: dict[str, Any], intro: str) -> str | None:
    """A tool hook's `additionalContext` as the model reads it: `<intro> hooks:` and the
    context on the next line."""
    context = _context(output)
    return None if context is None else f"{intro} hooks:\n{context}"


def _storable(value: Any) -> bool:
    """Whether the event log can hold `value`: JSON the store can encode, with no lone
    surrogates."""
    try:
        pydantic_core.to_json(value)
    except pydantic_core.PydanticSerializationError:
        return False
    return True
