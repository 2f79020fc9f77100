"""How runtime errors cross the wire: one table, read by the server to answer and by the
remote client to raise the same exception the in-process runtime would."""

from __future__ import annotations

from typing import cast, get_args

from pydantic import ValidationError

from trimtab._errors import (
    ClearContextError,
    ClearContextErrorCode,
    PolicyRefusedError,
    PromptBlockedError,
    QueueEditError,
    QueueEditErrorCode,
    SessionError,
    SessionNotFoundError,
    TrimtabError,
    session_error,
)
from trimtab.protocol.jsonrpc import INVALID_PARAMS, RpcError

__all__ = [
    "AUTHENTICATION_FAILED",
    "POLICY_REFUSED",
    "RUN_FAILED",
    "SERVER_BUSY",
    "SESSION_NOT_FOUND",
    "error_from_rpc",
    "rpc_error",
    "session_not_open",
]

RUN_FAILED = -32000
"""A refused runtime operation: a failed run, a refused clear, a blocked prompt."""
AUTHENTICATION_FAILED = -32001
"""A missing or wrong connection token (the message starts with `AUTHENTICATION_FAILED`)."""
SESSION_NOT_FOUND = -32002
"""A session id that is not open on this connection (or not stored at all)."""
SERVER_BUSY = -32003
"""The server has as many connections open as it takes."""
POLICY_REFUSED = -32005
"""What the server's operator does not let clients make its host do (the message starts with
`POLICY_REFUSED`; `data` names the `policy` and the `flag` that allows it, spec S15).
(-32004 is the connection's: too many requests in flight.)"""

_CLEAR_CODES: frozenset[str] = frozenset(get_args(ClearContextErrorCode))
_QUEUE_CODES: frozenset[str] = frozenset(get_args(QueueEditErrorCode))


def rpc_error(exc: Exception) -> RpcError | None:
    """The JSON-RPC error a runtime exception is answered with; None for an unexpected one
    (a bug: the connection answers it as an internal error)."""
    match exc:
        case RpcError():
            return exc
        case ValidationError():
            return RpcError(INVALID_PARAMS, f"Invalid params: {_summary(exc)}")
        case ClearContextError():
            code = INVALID_PARAMS if exc.code in ("empty_prompt", "invalid_prompt") else RUN_FAILED
            return RpcError(code, str(exc), {"code": exc.code})
        case QueueEditError():
            return RpcError(RUN_FAILED, str(exc), {"code": exc.code})
        case SessionNotFoundError():
            return _not_found(str(exc.args[0]), "not stored")
        case PolicyRefusedError():
            data = {"code": "policy_refused", "policy": exc.policy, "flag": exc.flag}
            return RpcError(POLICY_REFUSED, f"POLICY_REFUSED: {exc}", data)
        case PromptBlockedError():
            return RpcError(RUN_FAILED, f"prompt_blocked: {exc}", {"code": "prompt_blocked"})
        case SessionError():
            detail: dict[str, object] = {"errorType": exc.error_type, "message": exc.message}
            if exc.status_code is not None:
                detail["statusCode"] = exc.status_code
            return RpcError(RUN_FAILED, f"Session error: {exc.message}", detail)
        case ValueError():
            return RpcError(INVALID_PARAMS, f"Invalid params: {exc}")
        case RecursionError():
            return RpcError(INVALID_PARAMS, "Invalid params: nested too deeply")
        case TrimtabError():
            return RpcError(RUN_FAILED, str(exc))
        case _:
            return None


def error_from_rpc(exc: RpcError) -> Exception:
    """The runtime exception a JSON-RPC error stands for (the inverse of `rpc_error`)."""
    data = exc.data if isinstance(exc.data, dict) else {}
    code = data.get("code")
    if code in _CLEAR_CODES:
        return ClearContextError(cast(ClearContextErrorCode, code), exc.message)
    if code in _QUEUE_CODES:
        message = exc.message.removeprefix(f"{code}: ")
        return QueueEditError(cast(QueueEditErrorCode, code), message)
    if code == "session_not_found":
        return SessionNotFoundError(data.get("sessionId", exc.message))
    if code == "policy_refused":
        # The message holds the policy and the flag already: keep it as the server said it.
        refused = PolicyRefusedError(str(data.get("policy")), str(data.get("flag")), "")
        refused.args = (exc.message.removeprefix("POLICY_REFUSED: "),)
        return refused
    if code == "prompt_blocked":
        return PromptBlockedError(exc.message.removeprefix("prompt_blocked: "))
    if "errorType" in data:
        message = str(data.get("message", exc.message))
        return session_error(str(data["errorType"]), message, status_code=data.get("statusCode"))
    if exc.code == INVALID_PARAMS:
        return ValueError(exc.message)
    return TrimtabError(exc.message)


def session_not_open(session_id: str) -> RpcError:
    """The error for a session the connection has not created or resumed."""
    return _not_found(session_id, "not open on this connection: create or resume it")


def _not_found(session_id: str, why: str) -> RpcError:
    # "Session not found: <id>" is what the Copilot clients (and programs) match on (spec D4).
    message = f"Session not found: {session_id} ({why})"
    return RpcError(
        SESSION_NOT_FOUND, message, {"code": "session_not_found", "sessionId": session_id}
    )


def _summary(exc: ValidationError) -> str:
    """The first few validation errors, one `field: message` each."""
    parts = [
        f"{'.'.join(str(p) for p in error['loc']) or '(root)'}: {error['msg']}"
        for error in exc.errors()[:3]
    ]
    return "; ".join(parts)
