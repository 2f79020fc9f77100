"""What idle sessions share, and what each keeps its own (issue 20, item 5: memory per idle
session). Sessions share the containers they do not change; sharing must never let one
session's change reach another."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from tests.conftest import open_session
from trimtab import Client, define_tool
from trimtab.events import Event
from trimtab.testing import ScriptedModel, tool_call


def tools_named(prefix: str) -> list[Any]:
    return [
        define_tool("probe", description="d", handler=lambda params: f"{prefix} ran"),
        define_tool("other", description="d", handler=lambda params: "other"),
    ]


async def test_issue20_5_sessions_given_other_tools_of_the_same_names_run_their_own(
    client: Client,
) -> None:
    first, second = tools_named("first"), tools_named("second")
    results: list[str] = []
    for tools in (first, second, first):
        model = ScriptedModel([tool_call("probe", {}), "done"])
        session = await open_session(client, model, *tools)
        assert list(session.tools.values())[:2] == tools
        await session.send_and_wait("go")
        results.append(model.requests[1].messages[-1].content)
    assert results == ["first ran", "second ran", "first ran"]


async def test_issue20_5_a_handler_that_unsubscribes_while_called_leaves_the_others(
    client: Client,
) -> None:
    session = await open_session(client, ScriptedModel(["a", "b"]))
    seen: list[str] = []

    def once(event: Event) -> None:
        seen.append(f"once {event.type}")
        stop()

    stop = session.on("assistant.message", once)
    session.on("assistant.message", lambda e: seen.append(f"always {e.type}"))
    await session.send_and_wait("1")
    await session.send_and_wait("2")
    assert seen == [
        "once assistant.message",
        "always assistant.message",
        "always assistant.message",
    ]


async def test_issue20_5_a_session_without_hooks_gives_a_fork_none(client: Client) -> None:
    session = await open_session(client, ScriptedModel())
    hooks = session.options().hooks
    assert hooks == {}
    assert hooks is not None
    hooks["on_session_start"] = lambda *args: None  # the caller's own dict: nothing shared
    assert session.options().hooks == {}


async def test_issue20_5_the_client_lets_go_of_a_disconnected_sessions_tools(
    client: Client,
) -> None:
    def probe() -> str:
        return "ran"

    held = weakref.ref(probe)
    tools = [define_tool("probe", description="d", handler=probe)]
    sessions = [await open_session(client, ScriptedModel(), *tools) for _ in range(2)]
    await sessions[0].disconnect()
    del probe, tools
    gc.collect()
    assert held() is not None  # the other session still has it
    await sessions[1].disconnect()
    del sessions
    gc.collect()
    assert held() is None
