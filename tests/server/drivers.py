"""One test driver per way of reaching `trimtab serve`, behind one small interface.

The same end-to-end scenarios run through the official Copilot client (`copilot`, over TCP and
over stdio) and through trimtab's own remote client (`Client.connect`). A driver hides only
the spelling differences: tools are written once as `ToolSpec`s, and events are recorded as
the camelCase dicts both clients can produce.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from copilot import CopilotClient, RuntimeConnection
from copilot._jsonrpc import JsonRpcError
from copilot.generated.rpc import HistoryClearContextRequest, PermissionDecisionReject
from copilot.generated.session_events import AssistantMessageData
from copilot.session import CopilotSession, PermissionHandler
from copilot.tools import define_tool as copilot_tool
from pydantic import BaseModel

import trimtab
from trimtab import ClearContextError, PermissionDecision, SessionError
from trimtab.remote import RemoteClient, RemoteSession

Permission = Literal["approve", "reject"] | None


class ClearRefused(Exception):
    """A refused `clear_context`, whichever client saw it."""

    def __init__(self, code: str | None) -> None:
        super().__init__(code)
        self.code = code


class RunFailed(Exception):
    """`send_and_wait` saw its run end in `session.error`, whichever client saw it."""


class Ctx(Protocol):
    """What a tool handler may do with its session, whichever client runs it."""

    async def clear_context(self, prompt: str) -> int: ...


@dataclass
class ToolSpec:
    name: str
    params: type[BaseModel]
    handler: Callable[[Any, Ctx], Awaitable[str]]
    description: str = ""
    is_terminal: bool = False
    skip_permission: bool = True


class DriverSession:
    """A session as the tests see it: its events, and the calls the scenarios make."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.events: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()

    def record(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._arrived.set()

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def of(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == event_type]

    async def wait_for(self, event_type: str, count: int = 1, timeout: float = 15.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.of(event_type)) < count:
                self._arrived.clear()
                await self._arrived.wait()

    async def send_and_wait(self, prompt: str, timeout: float = 30.0) -> str | None:
        raise NotImplementedError

    async def send(self, prompt: str) -> str:
        raise NotImplementedError

    async def clear_context(self, prompt: str) -> int:
        raise NotImplementedError

    async def abort(self) -> None:
        raise NotImplementedError

    async def disconnect(self) -> None:
        raise NotImplementedError

    async def logged(self) -> list[dict[str, Any]]:
        """The session's persisted events, as the server reports them."""
        raise NotImplementedError


class Driver:
    """A client of one server; `create`/`resume` open sessions through it."""

    name = ""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def open(
        self,
        provider: dict[str, Any],
        *,
        tools: Sequence[ToolSpec] = (),
        permission: Permission = "approve",
        session_id: str | None = None,
        resume: bool = False,
    ) -> DriverSession:
        raise NotImplementedError


# --- the official client -------------------------------------------------------------------


class _OfficialSession(DriverSession):
    def __init__(self, session: CopilotSession) -> None:
        super().__init__(session.session_id)
        self.session = session
        session.on(lambda event: self.record(event.to_dict()))

    async def send_and_wait(self, prompt: str, timeout: float = 30.0) -> str | None:
        try:
            reply = await self.session.send_and_wait(prompt, timeout=timeout)
        except JsonRpcError as exc:
            raise RunFailed(exc.message) from None
        if reply is None:
            return None
        assert isinstance(reply.data, AssistantMessageData)
        return reply.data.content

    async def send(self, prompt: str) -> str:
        return await self.session.send(prompt)

    async def clear_context(self, prompt: str) -> int:
        try:
            request = HistoryClearContextRequest(prompt=prompt)
            return (await self.session.rpc.history.clear_context(request)).messages_cleared
        except JsonRpcError as exc:
            raise ClearRefused((exc.data or {}).get("code")) from None

    async def abort(self) -> None:
        await self.session.abort()

    async def disconnect(self) -> None:
        await self.session.disconnect()

    async def logged(self) -> list[dict[str, Any]]:
        return [event.to_dict() for event in await self.session.get_events()]


class OfficialDriver(Driver):
    """`copilot.CopilotClient` over a `RuntimeConnection` (TCP or stdio)."""

    def __init__(self, name: str, connection: RuntimeConnection) -> None:
        self.name = name
        self.client = CopilotClient(connection=connection, log_level="warning")
        self._external = name == "official-tcp"
        self._sessions: list[_OfficialSession] = []

    async def start(self) -> None:
        await self.client.start()

    async def stop(self) -> None:
        if not self._external:
            await self.client.stop()
            return
        # What `stop()` does for a server it did not spawn (detach every session, close the
        # socket), minus the second its reader thread waits before the socket is closed.
        for session in self._sessions:
            await session.session.disconnect()
        self._sessions.clear()
        await self.client.force_stop()

    async def open(
        self,
        provider: dict[str, Any],
        *,
        tools: Sequence[ToolSpec] = (),
        permission: Permission = "approve",
        session_id: str | None = None,
        resume: bool = False,
    ) -> DriverSession:
        holder: list[_OfficialSession] = []
        options: dict[str, Any] = {
            "provider": provider,
            "model": "test-model",
            "system_message": {"content": "You are a test assistant.", "mode": "replace"},
            "tools": [_official_tool(spec, holder) for spec in tools],
            "on_permission_request": _official_permission(permission),
        }
        if resume:
            assert session_id is not None
            session = await self.client.resume_session(session_id, **options)
        else:
            session = await self.client.create_session(session_id=session_id, **options)
        holder.append(_OfficialSession(session))
        self._sessions.append(holder[0])
        return holder[0]


def _official_tool(spec: ToolSpec, holder: list[_OfficialSession]) -> Any:
    async def handler(params: Any, invocation: Any) -> str:
        return await spec.handler(params, holder[0])

    return copilot_tool(
        spec.name,
        description=spec.description,
        handler=handler,
        params_type=spec.params,
        is_terminal=spec.is_terminal,
        skip_permission=spec.skip_permission,
    )


def _official_permission(permission: Permission) -> Any:
    if permission == "approve":
        return PermissionHandler.approve_all
    if permission == "reject":
        return lambda request, invocation: PermissionDecisionReject()
    return None


# --- trimtab's remote client ---------------------------------------------------------------


class _RemoteSession(DriverSession):
    def __init__(self, session: RemoteSession) -> None:
        super().__init__(session.session_id)
        self.session = session
        session.on(
            lambda e: self.record(e.model_dump(by_alias=True, mode="json", exclude_none=True))
        )

    async def send_and_wait(self, prompt: str, timeout: float = 30.0) -> str | None:
        try:
            reply = await self.session.send_and_wait(prompt, timeout=timeout)
        except SessionError as exc:
            raise RunFailed(f"Session error: {exc.message}") from None
        return None if reply is None else reply.data.content

    async def send(self, prompt: str) -> str:
        return await self.session.send(prompt)

    async def clear_context(self, prompt: str) -> int:
        try:
            return (await self.session.history.clear_context(prompt)).messages_cleared
        except ClearContextError as exc:
            raise ClearRefused(exc.code) from None

    async def abort(self) -> None:
        await self.session.abort()

    async def disconnect(self) -> None:
        await self.session.disconnect()

    async def logged(self) -> list[dict[str, Any]]:
        events = await self.session.get_events()
        return [e.model_dump(by_alias=True, mode="json", exclude_none=True) for e in events]


class _RemoteCtx:
    def __init__(self, session: RemoteSession) -> None:
        self.session = session

    async def clear_context(self, prompt: str) -> int:
        # The in-process spelling: a handler written for `Client()` runs unchanged.
        try:
            return (await self.session.history.clear_context(prompt)).messages_cleared
        except ClearContextError as exc:
            raise ClearRefused(exc.code) from None


class RemoteDriver(Driver):
    """`trimtab.Client.connect("tcp://...")`."""

    name = "trimtab-remote"

    def __init__(self, url: str, token: str | None = None) -> None:
        self.client: RemoteClient = trimtab.Client.connect(url, token=token)

    async def start(self) -> None:
        await self.client.start()

    async def stop(self) -> None:
        await self.client.stop()

    async def open(
        self,
        provider: dict[str, Any],
        *,
        tools: Sequence[ToolSpec] = (),
        permission: Permission = "approve",
        session_id: str | None = None,
        resume: bool = False,
    ) -> DriverSession:
        options: dict[str, Any] = {
            "provider": provider,
            "model": "test-model",
            "system_message": "You are a test assistant.",
            "tools": [_remote_tool(spec) for spec in tools],
            "on_permission_request": _remote_permission(permission),
        }
        if resume:
            assert session_id is not None
            session = await self.client.resume_session(session_id, **options)
        else:
            session = await self.client.create_session(session_id=session_id, **options)
        return _RemoteSession(session)


def _remote_tool(spec: ToolSpec) -> trimtab.Tool:
    async def handler(params: Any, invocation: trimtab.ToolInvocation) -> str:
        return await spec.handler(params, _RemoteCtx(invocation.session))  # type: ignore[arg-type]

    return trimtab.define_tool(
        spec.name,
        description=spec.description,
        params_type=spec.params,
        is_terminal=spec.is_terminal,
        skip_permission=spec.skip_permission,
        handler=handler,
    )


def _remote_permission(permission: Permission) -> Any:
    if permission == "approve":
        return trimtab.PermissionHandler.approve_all
    if permission == "reject":
        return lambda request, invocation: PermissionDecision(kind="reject")
    return None
