"""Permission policy: asking the host whether a tool call may run.

Deny by default: with no handler, or a handler that fails, the call is `denied`. A `reject`
decision means the user halted the agent: the call is `rejected` and the run ends after the
batch (spec O2). Every decision kind the Copilot SDKs send, in process or over the wire, is
read from one table (`_KINDS`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeAlias

from pydantic import BaseModel, ConfigDict, field_validator

from trimtab._errors import contained
from trimtab._tools import CallOutcome, ToolInvocation
from trimtab.events import PermissionRequestData

__all__ = [
    "APPROVED",
    "APPROVED_FOR_SESSION",
    "CANCELLED",
    "NO_HANDLER",
    "Approval",
    "PermissionDecision",
    "PermissionHandler",
    "PermissionHandlerFn",
    "approval",
    "ask_permission",
    "decide",
]

log = logging.getLogger("trimtab")

PermissionHandlerFn: TypeAlias = Callable[[PermissionRequestData, ToolInvocation], Any]
"""`handler(request, invocation) -> PermissionDecision | dict`, sync or async."""

_Meaning = Literal["once", "session", "reject", "unavailable"]

_KINDS: dict[str, _Meaning] = {
    "approve-once": "once",
    "approved": "once",  # legacy
    "approve-for-location": "once",  # trimtab has no locations: it counts once
    "approve-for-session": "session",
    "approve-read-only-for-session": "session",
    "approve-permanently": "session",  # a session is as long as trimtab remembers approvals
    "reject": "reject",
    "denied-interactively-by-user": "reject",  # legacy
    "user-not-available": "unavailable",
    "denied-no-approval-rule-and-could-not-request-from-user": "unavailable",  # legacy
    "denied-by-rules": "unavailable",
    "denied-by-content-exclusion-policy": "unavailable",
}
"""Every decision kind of the Copilot SDKs (protocol section 4.3), and what it means here."""


class PermissionDecision(BaseModel):
    """A host's answer, in the Copilot SDK's decision kinds: `approve-once`,
    `approve-for-session`, `reject`, `user-not-available` (and the others of `_KINDS`)."""

    model_config = ConfigDict(defer_build=True)

    kind: str
    feedback: str | None = None

    @field_validator("kind")
    @classmethod
    def _known(cls, kind: str) -> str:
        if kind not in _KINDS:
            raise ValueError(f"unknown permission decision kind {kind!r}")
        return kind


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


class Approval(NamedTuple):
    """What a permission decision means for the call."""

    refusal: CallOutcome | None
    """The call's outcome when it may not run (`denied` or `rejected`); None: it may."""
    kind: str
    """The `permission.completed` result kind logged."""
    for_session: bool = False
    """Approved for the rest of the session."""


APPROVED = Approval(None, "approved")
APPROVED_FOR_SESSION = "approved-for-session"
"""The `permission.completed` result kind of an `approve-for-session` decision."""
CANCELLED = "cancelled"
"""The `permission.completed` result kind of a request the run was aborted during."""
_UNAVAILABLE = Approval(
    CallOutcome("denied", "Permission denied and could not request permission from user"),
    "denied-no-approval-rule-and-could-not-request-from-user",
)
NO_HANDLER = _UNAVAILABLE._replace(
    refusal=CallOutcome(
        "denied", "Permission denied: no permission handler is configured for this session."
    )
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
    except BaseException as exc:
        if not contained(exc):
            raise
        log.exception("the permission handler failed; denying")
        return None


async def ask_permission(
    handler: PermissionHandlerFn, request: PermissionRequestData, invocation: ToolInvocation
) -> Approval:
    """Ask `handler`; any failure to get a valid answer is a denial, never a crash."""
    decision = await decide(handler, request, invocation)
    return _UNAVAILABLE if decision is None else approval(decision)


def approval(decision: PermissionDecision) -> Approval:
    """What `decision` means for the call it answers."""
    match _KINDS[decision.kind]:
        case "once":
            return APPROVED
        case "session":
            # Logged as such, so that the approval survives a resume (a fact of the log).
            return Approval(None, APPROVED_FOR_SESSION, for_session=True)
        case "reject":
            text = "The user rejected this tool call."
            if decision.feedback:
                text += f" Feedback: {decision.feedback}"
            return Approval(CallOutcome("rejected", text), "denied-interactively-by-user")
        case "unavailable":
            return _UNAVAILABLE
