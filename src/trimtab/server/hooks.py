"""A client's hooks: the session's hook points (`trimtab._hooks`) answered by the client that
asked for them (`hooks: true` on `session.create`/`session.resume`), each forwarded as a
`hooks.invoke` request. A hook whose client is gone, fails or takes too long is ignored by the
core, as the official clients ignore a failing hook handler."""

from __future__ import annotations

from typing import Any, cast

from trimtab._hooks import HOOK_TIMEOUT, HookHandler, SessionHooks, wire_name
from trimtab.protocol.jsonrpc import Connection

__all__ = ["ClientHooks"]


class ClientHooks:
    """The hooks of one session, forwarded to `target`, the connection that asked for them."""

    def __init__(self, session_id: str, target: Connection) -> None:
        self.session_id = session_id
        self.target: Connection | None = target

    def handlers(self) -> SessionHooks:
        """The session's hooks, every one forwarded."""
        hooks: dict[str, HookHandler] = {
            name: self._forward(wire_name(name)) for name in SessionHooks.__annotations__
        }
        return cast(SessionHooks, hooks)

    def _forward(self, hook_type: str) -> HookHandler:
        async def forward(hook_input: dict[str, Any], invocation: dict[str, str]) -> Any:
            target = self.target
            if target is None or target.closed:
                return None
            # The session the hook is for: a fork of this session gets the source's hooks,
            # and its calls must not read as the source's (a second `sessionStart` of it).
            session_id = invocation.get("session_id", self.session_id)
            params = {"sessionId": session_id, "hookType": hook_type, "input": hook_input}
            answer = await target.request("hooks.invoke", params, timeout=HOOK_TIMEOUT)
            return answer.get("output") if isinstance(answer, dict) else None

        return forward
