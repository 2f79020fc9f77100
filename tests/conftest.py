"""Shared fixtures: a Client on each real store, and helpers to read what a session did."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from trimtab import Client, Event, PermissionHandler, Session, Tool, ToolInvocation, define_tool
from trimtab.testing import ScriptedModel


class ClearArgs(BaseModel):
    prompt: str


class EchoArgs(BaseModel):
    text: str


@pytest.fixture(params=["memory", "sqlite"])
async def client(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Client]:
    """A runtime on each real store backend."""
    store = "memory" if request.param == "memory" else tmp_path / "trimtab.db"
    async with Client(store=store) as runtime:
        yield runtime


class Recorder:
    """Collects every event a session delivers, ephemeral ones included."""

    def __init__(self, session: Session) -> None:
        self.events: list[Event] = []
        self._arrived = asyncio.Event()
        session.on(self._record)

    def _record(self, event: Event) -> None:
        self.events.append(event)
        self._arrived.set()

    async def wait_for(self, event_type: str, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until `count` events of `event_type` arrived."""
        async with asyncio.timeout(timeout):
            while len(self.of(event_type)) < count:
                self._arrived.clear()
                await self._arrived.wait()

    @property
    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def of(self, event_type: str) -> list[Any]:
        return [e for e in self.events if e.type == event_type]


async def clear_handler(params: ClearArgs, invocation: ToolInvocation) -> str:
    result = await invocation.session.history.clear_context(params.prompt)
    return f"Cleared {result.messages_cleared} messages."


def clear_tool(*, is_terminal: bool = True, handler: Callable[..., Any] = clear_handler) -> Tool:
    return define_tool(
        "clear_context",
        description="Clear the conversation and start a fresh context window",
        params_type=ClearArgs,
        is_terminal=is_terminal,
        defer="never",
        handler=handler,
    )


def echo_tool(**options: Any) -> Tool:
    return define_tool(
        "echo", description="Echo text", params_type=EchoArgs, handler=lambda p: p.text, **options
    )


async def open_session(
    client: Client, scripted: ScriptedModel, /, *tools: Tool, **options: Any
) -> Session:
    options.setdefault("on_permission_request", PermissionHandler.approve_all)
    options.setdefault("system_message", "SYSTEM")
    return await client.create_session(provider=scripted, tools=list(tools), **options)


def roles(model: ScriptedModel, index: int) -> list[tuple[str, str]]:
    """The (role, content) pairs of the model's request number `index`."""
    return [(m.role, m.content) for m in model.requests[index].messages]
