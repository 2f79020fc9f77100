"""Permission policy: asking the host whether a tool call may run.

Deny by default: with no handler, or a handler that fails, the call is `denied`. A `reject`
decision means the user halted the agent: the call is `rejected` and the run ends after the
batch (spec O2).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeAlias, assert_never

from pydantic import BaseModel, ConfigDict

from trimtab._tools import ToolInvocation
from trimtab.events import PermissionRequestData

__all__ = [
    "APPROVED_FOR_SESSION",
    "CANCELLED",
    "NO_HANDLER",
    "PermissionDecision",
    "PermissionHandler",
    "PermissionHandlerFn",
    "Verdict",
    "ask_permission",
    "decide",
]

log = logging.getLogger("trimtab")

PermissionHandlerFn: TypeAlias = Callable[[PermissionRequestData, ToolInvocation], Any]
"""`handler(request, invocation) -> PermissionDecision | dict`, sync or async."""


class PermissionDecision(BaseModel):
    """A host's answer, in the Copilot SDK's decision kinds."""

    model_config = ConfigDict(defer_build=True)

    kind: Literal[
        "approve-once",
        "approve-for-session",
        "reject",
        "user-not-available",
        # Legacy kinds some Copilot clients still send.
        "approved",
        "denied-interactively-by-user",
        "denied-no-approval-rule-and-could-not-request-from-user",
    ]
    feedback: str | None = None


class PermissionHandler:
    """Ready-made permission handlers."""

    @staticmethod
    def approve_all(
        request: PermissionRequestData, invocation: ToolInvocation
    ) -> PermissionDecision:
        """Approve every tool call."""
        return PermissionDecision(kind="approve-once")

    @staticmethod
    def deny_all(request: PermissionRequestData, invocation: ToolInvocation) -> PermissionDecision:
        """Deny every tool call; the model is told it could not get permission."""
        return PermissionDecision(kind="user-not-available")


class Verdict(NamedTuple):
    allowed: bool
    outcome: Literal["success", "denied", "rejected"]
    """`success` when allowed."""
    wire_kind: str
    """The `permission.completed` result kind."""
    text: str
    """What the model sees when the call does not run."""
    for_session: bool = False


_APPROVED = Verdict(True, "success", "approved", "")
APPROVED_FOR_SESSION = "approved-for-session"
"""The `permission.completed` result kind of an `approve-for-session` decision."""
CANCELLED = "cancelled"
"""The `permission.completed` result kind of a request the run was aborted during."""
_NOT_AVAILABLE = Verdict(
    False,
    "denied",
    "denied-no-approval-rule-and-could-not-request-from-user",
    "Permission denied and could not request permission from user.",
)
NO_HANDLER = _NOT_AVAILABLE._replace(
    text="Permission denied: no permission handler is configured for this session."
)


async def decide(
    handler: PermissionHandlerFn, request: PermissionRequestData, invocation: ToolInvocation
) -> PermissionDecision | None:
    """`handler`'s decision, sync or async; None when it fails to give a valid one."""
    try:
        answer = handler(request, invocation)
        if inspect.isawaitable(answer):
            answer = await answer
        return PermissionDecision.model_validate(answer)
    except Exception:
        log.exception("the permission handler failed; denying")
        return None


async def ask_permission(
    handler: PermissionHandlerFn, request: PermissionRequestData, invocation: ToolInvocation
) -> Verdict:
    """Ask `handler`; any failure to get a valid answer is a denial, never a crash."""
    decision = await decide(handler, request, invocation)
    if decision is None:
        return _NOT_AVAILABLE
    match decision.kind:
        case "approve-once" | "approved":
            return _APPROVED
        case "approve-for-session":
            # Logged as such, so that the approval survives a resume (a fact of the log).
            return _APPROVED._replace(wire_kind=APPROVED_FOR_SESSION, for_session=True)
        case "reject" | "denied-interactively-by-user":
            text = "The user rejected this tool call."
            if decision.feedback:
                text += f" Feedback: {decision.feedback}"
            return Verdict(False, "rejected", "denied-interactively-by-user", text)
        case "user-not-available" | "denied-no-approval-rule-and-could-not-request-from-user":
            return _NOT_AVAILABLE
        case _:
            assert_never(decision.kind)
