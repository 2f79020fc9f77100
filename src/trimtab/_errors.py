"""The exceptions trimtab raises to its callers, and which exceptions of the host's code it
contains."""

from __future__ import annotations

import asyncio
from typing import Generic, Literal, TypeAlias, TypeVar

__all__ = [
    "BudgetExceededError",
    "ClearContextError",
    "ClearContextErrorCode",
    "LeaseLostError",
    "LogTailLostError",
    "PolicyRefusedError",
    "PromptBlockedError",
    "PruneError",
    "PruneErrorCode",
    "ProviderError",
    "QueueEditError",
    "QueueEditErrorCode",
    "ProviderErrorType",
    "SessionError",
    "SessionNotFoundError",
    "StoreUnavailableError",
    "ToolError",
    "TrimtabError",
    "contained",
    "session_error",
]


def contained(exc: BaseException) -> bool:
    """Whether `exc`, out of the host's code (a tool or permission handler, a hook, an event
    handler), is that code failing, which trimtab contains, rather than a stop it must pass on.

    Everything is a failure but Ctrl-C and a cancellation of the running task (an abort, the
    runtime closing): `SystemExit` (a command-line `main()` called as a tool), a
    `CancelledError` the code raised on its own (a future it cancelled) and other frameworks'
    `BaseException`s included.
    """
    if isinstance(exc, KeyboardInterrupt):
        return False
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        return task is not None and not task.cancelling()
    return True


class TrimtabError(Exception):
    """Base of every trimtab exception."""


class ToolError(TrimtabError):
    """Raised by a tool handler to show `message` to the model as the call's failure text.

    Any other exception a handler raises is hidden from the model behind a generic text, so
    internal details (paths, secrets, stack traces) never leak into the conversation.
    """


_Code = TypeVar("_Code", bound=str)


class RefusedError(TrimtabError, Generic[_Code]):
    """A call refused for the reason its `code` names (the message starts with it)."""

    def __init__(self, code: _Code, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code: _Code = code


ClearContextErrorCode: TypeAlias = Literal[
    "no_tool_call_in_flight",
    "empty_prompt",
    "invalid_prompt",
    "clear_pending",
    "remote_session",
    "run_in_flight",
]


class ClearContextError(RefusedError[ClearContextErrorCode]):
    """A `clear_context` call that was refused; nothing changed (spec C1-C4, X4)."""


PruneErrorCode: TypeAlias = Literal[
    "run_in_flight", "session_open", "follower_behind", "log_changed", "remote_session"
]


class PruneError(RefusedError[PruneErrorCode]):
    """A prune that was refused; nothing was removed (spec X8)."""


QueueEditErrorCode: TypeAlias = Literal[
    "item_not_waiting", "not_a_message", "not_steerable", "queue_already_paused", "remote_session"
]


class QueueEditError(RefusedError[QueueEditErrorCode]):
    """An edit of the session's queue that was refused; nothing changed (spec K18, K19)."""


ProviderErrorType: TypeAlias = Literal[
    "rate_limit",
    "provider_unavailable",
    "authentication",
    "context_length",
    "bad_request",
    "bad_response",
    "timeout",
    "script_exhausted",
]


class ProviderError(TrimtabError):
    """A model call that failed; the loop turns it into a `session.error` event."""

    def __init__(
        self,
        error_type: ProviderErrorType,
        message: str,
        *,
        status_code: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.error_type: ProviderErrorType = error_type
        self.message = message
        self.status_code = status_code
        self.retryable = retryable
        self.retry_after = retry_after


class SessionError(TrimtabError):
    """`send_and_wait` saw its run end in a `session.error` event."""

    def __init__(self, error_type: str, message: str, *, status_code: int | None = None) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message
        self.status_code = status_code


class BudgetExceededError(SessionError):
    """A budget was reached (spec U3, U5): the run ended in a `budget_exceeded` error, or the
    session's budget refused a `send` (nothing was stored) until the host raises it."""

    def __init__(self, message: str) -> None:
        super().__init__("budget_exceeded", message)


def session_error(error_type: str, message: str, *, status_code: int | None = None) -> SessionError:
    """The exception for a run that ended in `session.error` of `error_type`."""
    if error_type == "budget_exceeded":
        return BudgetExceededError(message)
    return SessionError(error_type, message, status_code=status_code)


class SessionNotFoundError(TrimtabError, KeyError):
    """No session with that id exists in the store."""

    def __str__(self) -> str:
        return f"no session with id {self.args[0]!r}"


class LeaseLostError(TrimtabError):
    """This runtime no longer holds the lease of the session it tried to write (spec R1)."""


class LogTailLostError(LeaseLostError):
    """The append was refused because the log no longer ends with the events this runtime
    stored: the database lost its last commits in a crash (spec P5). The lease is still
    this runtime's: the session goes on from the log as it is (P6)."""


class StoreUnavailableError(TrimtabError):
    """The store could not be reached (a database restart, a failover). Whether the write
    went through is unknown; appending the same events again is safe (appends are idempotent
    by event id)."""


class PromptBlockedError(TrimtabError):
    """A `userPromptSubmitted` hook blocked the prompt: no run, no user message (its reason
    is this error's message)."""


class PolicyRefusedError(TrimtabError):
    """A server's operator does not let its clients make the host do this: run a command a
    client named, read a file outside the directory allowed, reach a host not allowed (spec
    S11). Nothing was stored.

    Args:
        policy: Which policy refused (`mcp_commands`, `files`, `hosts`).
        flag: The `trimtab serve` flag with which the operator would allow it.
        message: What was refused, and why.
    """

    def __init__(self, policy: str, flag: str, message: str) -> None:
        super().__init__(f"{policy}: {message} (the server's operator allows it with {flag})")
        self.policy = policy
        self.flag = flag
