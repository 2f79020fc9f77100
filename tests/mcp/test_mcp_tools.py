"""Issue 18: MCP servers' tools are ordinary tools of a session (spec MCP1-MCP4, MCP6-MCP7).

Every test starts real servers: `servers/demo.py` (the `mcp` package's server API) over stdio
and HTTP, and `servers/faulty.py` (an older-era server, for `notifications/tools/list_changed`).
The model is scripted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.mcp.conftest import DEMO, FAULTY, alive, assert_no_orphans, started, stdio
from trimtab import Client, PermissionHandler, Session, ToolInvocation, define_tool
from trimtab.events import (
    PermissionRequestData,
    PermissionRequestedEvent,
    SessionWarningEvent,
    ToolExecutionCompleteEvent,
)
from trimtab.testing import ScriptedModel, tool_call


def outcomes(events: list[Any]) -> list[tuple[str, str, str]]:
    """(tool, outcome, text) of every completed call."""
    done: list[tuple[str, str, str]] = []
    for event in events:
        if isinstance(event, ToolExecutionCompleteEvent):
            data = event.data
            text = data.result.content if data.result else data.error.message if data.error else ""
            done.append((data.tool_name or "", data.outcome, text))
    return done


def by_call(events: list[Any]) -> dict[str, tuple[str, str, str]]:
    """`outcomes`, by tool call id (calls of one batch complete in any order)."""
    calls = [e.data.tool_call_id for e in events if isinstance(e, ToolExecutionCompleteEvent)]
    return dict(zip(calls, outcomes(events), strict=True))


async def open_session(client: Client, model: ScriptedModel, **options: Any) -> Session:
    options.setdefault("on_permission_request", PermissionHandler.approve_all)
    return await client.create_session(provider=model, **options)


async def test_mcp1_tools_of_a_stdio_server_are_called_with_typed_outcomes(pids: Path) -> None:
    model = ScriptedModel(
        [
            [
                tool_call("demo__add", {"a": 2, "b": 3}, id="c1"),
                tool_call("demo__echo", {"text": "hi"}, id="c2"),
                tool_call("demo__fail", {"message": "no such file"}, id="c3"),
                tool_call("demo__picture", {}, id="c4"),
                tool_call("demo__add", {"a": "x"}, id="c5"),
            ],
            "done",
        ]
    )
    asked: list[PermissionRequestData] = []

    def approve(request: PermissionRequestData, invocation: ToolInvocation) -> dict[str, str]:
        asked.append(request)
        return {"kind": "approve-once"}

    async with Client(store="memory") as client:
        servers = {"demo": stdio(DEMO, pids=pids)}
        session = await open_session(
            client, model, mcp_servers=servers, on_permission_request=approve
        )
        reply = await session.send_and_wait("go")
        events = await session.get_events()
    assert reply is not None and reply.data.content == "done"
    calls = by_call(events)
    done = {
        name: calls[f"c{i}"] for i, name in enumerate(("add", "echo", "fail", "picture", "bad"), 1)
    }
    assert done["add"] == ("demo__add", "success", "5")
    assert done["echo"] == ("demo__echo", "success", "hi")
    assert done["fail"][1] == "failure" and "no such file" in done["fail"][2]
    assert done["picture"] == (
        "demo__picture",
        "success",
        "a tiny picture\n[image: image/png, 32 bytes]",
    )
    assert done["bad"][0:2] == ("demo__add", "failure")  # the server refused the arguments
    tools = {t.name: t for t in model.requests[0].tools}
    assert {"demo__add", "demo__echo", "demo__grow", "demo__sleep"} <= set(tools)
    assert tools["demo__add"].parameters["properties"].keys() == {"a", "b"}
    assert tools["demo__add"].description == "Add two numbers."
    echo = next(r for r in asked if r.tool_name == "echo")
    assert (echo.kind, echo.server_name, echo.tool_title, echo.read_only) == (
        "mcp",
        "demo",
        "Echo",
        True,
    )
    assert echo.args == {"text": "hi"} and echo.tool_call_id == "c2"
    requested = [e for e in events if isinstance(e, PermissionRequestedEvent)]
    assert requested[0].data.permission_request.kind == "mcp"
    assert len(model.requests) == 2


async def test_mcp1_calls_are_denied_without_a_permission_handler(pids: Path) -> None:
    model = ScriptedModel([tool_call("demo__add", {"a": 1, "b": 1}), "ok"])
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=model, mcp_servers={"demo": stdio(DEMO, pids=pids)}
        )
        await session.send_and_wait("go")
        assert outcomes(await session.get_events())[0][1] == "denied"


async def test_mcp3_servers_start_on_the_first_run_and_stop_with_the_session(pids: Path) -> None:
    model = ScriptedModel([tool_call("demo__pid"), "ok"])
    async with Client(store="memory") as client:
        session = await open_session(client, model, mcp_servers={"demo": stdio(DEMO, pids=pids)})
        assert started(pids) == []  # created, not run: nothing started
        await session.send_and_wait("go")
        (pid,) = started(pids)
        assert outcomes(await session.get_events())[0][2] == str(pid)
        await session.disconnect()
        assert_no_orphans(pids)  # the client still runs: the session's end stopped it


async def test_mcp3_sessions_with_the_same_server_share_one_process(pids: Path) -> None:
    model = ScriptedModel([tool_call("a__pid"), "one", tool_call("b__pid"), "two"])
    async with Client(store="memory") as client:
        first = await open_session(client, model, mcp_servers={"a": stdio(DEMO, pids=pids)})
        # Another name, another timeout and tool filter: the same process all the same.
        second = await open_session(
            client, model, mcp_servers={"b": stdio(DEMO, pids=pids, timeout=5000, tools=["pid"])}
        )
        await first.send_and_wait("go")
        await second.send_and_wait("go")
        (pid,) = started(pids)
        assert outcomes(await first.get_events())[0][2] == str(pid)
        assert outcomes(await second.get_events())[0][2] == str(pid)
        assert [t.name for t in model.requests[2].tools] == ["b__pid"]
        await first.disconnect()
        assert alive(pid)  # the second session still uses it
    assert_no_orphans(pids)  # the client's exit stopped it


async def test_mcp3_resume_replays_without_starting_servers(pids: Path, tmp_path: Path) -> None:
    store = tmp_path / "trimtab.db"
    servers = {"demo": stdio(DEMO, pids=pids)}
    model = ScriptedModel([tool_call("demo__add", {"a": 1, "b": 2}), "three"])
    async with Client(store=store) as client:
        session = await open_session(client, model, mcp_servers=servers)
        await session.send_and_wait("go")
    assert_no_orphans(pids)
    first = started(pids)
    model = ScriptedModel([tool_call("demo__add", {"a": 3, "b": 4}), "seven"])
    async with Client(store=store) as client:
        session = await client.resume_session(
            session.session_id,
            provider=model,
            mcp_servers=servers,
            on_permission_request=PermissionHandler.approve_all,
        )
        assert started(pids) == first  # replayed; no server started
        assert [o[2] for o in outcomes(await session.get_events())] == ["3"]
        await session.send_and_wait("again")
        assert len(started(pids)) == 2
        assert [o[2] for o in outcomes(await session.get_events())] == ["3", "7"]
    assert_no_orphans(pids)


async def test_mcp6_a_tool_list_change_reaches_the_next_turn(pids: Path) -> None:
    model = ScriptedModel(
        [tool_call("demo__grow", {"name": "shiny"}), tool_call("demo__shiny"), "done"]
    )
    async with Client(store="memory") as client:
        session = await open_session(client, model, mcp_servers={"demo": stdio(DEMO, pids=pids)})
        await session.send_and_wait("go")
        done = outcomes(await session.get_events())
    assert "demo__shiny" not in {t.name for t in model.requests[0].tools}
    assert "demo__shiny" in {t.name for t in model.requests[1].tools}
    assert done[1] == ("demo__shiny", "success", "shiny")


async def test_mcp6_an_older_servers_list_changed_notification_reaches_the_next_turn(
    pids: Path,
) -> None:
    model = ScriptedModel([tool_call("old__grow"), tool_call("old__extra"), "done"])
    async with Client(store="memory") as client:
        servers = {"old": stdio(FAULTY, "changes", pids=pids)}
        session = await open_session(client, model, mcp_servers=servers)
        await session.send_and_wait("go")
        done = outcomes(await session.get_events())
    assert [t.name for t in model.requests[0].tools] == ["old__ok", "old__grow"]
    assert "old__extra" in {t.name for t in model.requests[1].tools}
    assert done == [("old__grow", "success", "grown"), ("old__extra", "success", "extra")]


async def test_mcp4_a_servers_tools_are_deferred_behind_tool_search(pids: Path) -> None:
    model = ScriptedModel(
        [
            tool_call("tool_search", {"query": "add two numbers"}),
            tool_call("demo__add", {"a": 1, "b": 1}),
            "2",
        ]
    )
    async with Client(store="memory") as client:
        session = await open_session(
            client,
            model,
            mcp_servers={"demo": stdio(DEMO, pids=pids)},
            tool_search={"defer_threshold": 3},
        )
        await session.send_and_wait("go")
        done = outcomes(await session.get_events())
    assert [t.name for t in model.requests[0].tools] == ["tool_search"]
    assert "demo__add" in done[0][2]
    assert "demo__add" in {t.name for t in model.requests[1].tools}
    assert done[1] == ("demo__add", "success", "2")


async def test_mcp4_defer_never_keeps_a_servers_tools_loaded(pids: Path) -> None:
    model = ScriptedModel(["hi"])
    async with Client(store="memory") as client:
        servers = {"demo": stdio(DEMO, pids=pids, defer="never")}
        session = await open_session(
            client, model, mcp_servers=servers, tool_search={"defer_threshold": 3}
        )
        await session.send_and_wait("go")
    assert "demo__add" in {t.name for t in model.requests[0].tools}
    assert "tool_search" not in {t.name for t in model.requests[0].tools}


async def test_mcp4_mcp_tools_are_terminal_only_when_configured(pids: Path) -> None:
    model = ScriptedModel([tool_call("demo__echo", {"text": "a"}), "after"])
    async with Client(store="memory") as client:
        session = await open_session(client, model, mcp_servers={"demo": stdio(DEMO, pids=pids)})
        reply = await session.send_and_wait("go")
    assert reply is not None and reply.data.content == "after"  # the result went back
    assert not any(t.is_terminal for t in model.requests[0].tools)

    # Named terminal, its success ends the run (T1), also as the log tells it.
    model = ScriptedModel([tool_call("demo__echo", {"text": "b"})])
    async with Client(store="memory") as client:
        servers = {"demo": stdio(DEMO, pids=pids, terminal=["echo"])}
        session = await open_session(client, model, mcp_servers=servers)
        reply = await session.send_and_wait("go")
        log = await session.get_events()
    assert reply is not None and reply.data.tool_requests  # the calling message: no next call
    start = next(e for e in log if e.type == "tool.execution_start")
    assert start.data.is_terminal is True and len(model.requests) == 1


async def test_mcp4_the_tools_filter_chooses_what_the_model_sees(pids: Path) -> None:
    model = ScriptedModel(["hi"])
    async with Client(store="memory") as client:
        servers = {
            "demo": stdio(DEMO, pids=pids, tools=["add", "echo"]),
            "off": stdio(FAULTY, "ok", pids=pids, tools=[]),
        }
        session = await open_session(client, model, mcp_servers=servers)
        await session.send_and_wait("go")
    assert sorted(t.name for t in model.requests[0].tools) == ["demo__add", "demo__echo"]
    assert len(started(pids)) == 1  # `tools: []` starts nothing


async def test_mcp2_names_never_clash_and_fit_provider_limits(pids: Path) -> None:
    def mine(params: dict[str, Any]) -> str:
        return "host"

    host = define_tool("demo__add", description="the host's own", handler=mine)
    long_name = "a-server-whose-name-is-long-enough-to-push-the-name-past-64"
    model = ScriptedModel([[tool_call("demo__add")], "ok"])
    async with Client(store="memory") as client:
        servers = {
            "demo": stdio(DEMO, pids=pids),
            long_name: stdio(DEMO, pids=pids, tools=["echo"]),
        }
        session = await open_session(client, model, mcp_servers=servers, tools=[host])
        await session.send_and_wait("go")
        done = outcomes(await session.get_events())
    names = [t.name for t in model.requests[0].tools]
    assert len(names) == len(set(names))
    assert all(len(n) <= 64 and n.replace("_", "").replace("-", "").isalnum() for n in names)
    assert done[0] == ("demo__add", "success", "host")  # the host's tool keeps its name
    mcp_add = [n for n in names if n.startswith("demo__add_")]
    assert len(mcp_add) == 1 and len(mcp_add[0]) == len("demo__add_") + 8  # a hash added
    assert any(n.startswith("a-server-whose-name") and len(n) == 64 for n in names)


async def test_mcp7_invalid_configs_are_refused_before_anything_is_stored(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, dict[str, Any]], str]] = [
        ({"x": {"type": "stdio"}}, "MCP server 'x': command"),
        ({"x": {"type": "http", "url": "ftp://h"}}, "MCP server 'x': url"),
        ({"x": {"command": "y", "timeout": 0}}, "MCP server 'x': timeout"),
        ({"x": {"command": "y", "timeout": True}}, "MCP server 'x': timeout"),  # not 1 ms
        ({"x": {"command": "y", "colour": "red"}}, "MCP server 'x': colour"),
        ({"": {"command": "y"}}, "MCP server name ''"),
        (
            {"x": {"type": "http", "url": "http://h", "headers": {"X Key": "1"}}},
            "MCP server 'x': headers.*'X Key' holds a character HTTP cannot carry",
        ),
    ]
    async with Client(store="memory") as client:
        for servers, message in cases:
            with pytest.raises(ValueError, match=message):
                await client.create_session(provider=ScriptedModel(), mcp_servers=servers)
        assert await client.list_sessions() == []


class ClearArgs(BaseModel):
    prompt: str


async def clear(params: ClearArgs, invocation: ToolInvocation) -> str:
    result = await invocation.session.history.clear_context(params.prompt)
    return f"Cleared {result.messages_cleared} messages."


async def test_mcp_seed_scenario_clears_the_context_with_mcp_tools_present(pids: Path) -> None:
    seed = "Reply with exactly FRESH_CONTEXT."
    model = ScriptedModel(
        [
            tool_call("demo__add", {"a": 2, "b": 2}),
            tool_call("clear_context", {"prompt": seed}),
            tool_call("demo__echo", {"text": "still here"}),
            "FRESH_CONTEXT",
        ]
    )
    clear_tool = define_tool(
        "clear_context", params_type=ClearArgs, is_terminal=True, defer="never", handler=clear
    )
    async with Client(store="memory") as client:
        session = await open_session(
            client,
            model,
            system_message="You are a test assistant.",
            tools=[clear_tool],
            mcp_servers={"demo": stdio(DEMO, pids=pids)},
        )
        reply = await session.send_and_wait("Add, then clear.")
        events = await session.get_events()
    assert reply is not None and reply.data.content == "FRESH_CONTEXT"
    assert [e.type for e in events].count("session.context_cleared") == 1
    seeded = model.requests[2]
    assert [(m.role, m.content) for m in seeded.messages] == [
        ("system", "You are a test assistant."),
        ("user", seed),
    ]
    assert {"clear_context", "demo__add", "demo__echo"} <= {t.name for t in seeded.tools}
    assert outcomes(events)[-1] == ("demo__echo", "success", "still here")
    assert not [e for e in events if isinstance(e, SessionWarningEvent)]


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_mcp1_remote_servers_over_streamable_http_and_sse(
    transport: str, http_server: Any, pids: Path
) -> None:
    server = http_server(transport)
    model = ScriptedModel(
        [
            tool_call("web__add", {"a": 20, "b": 22}),
            tool_call("web__grow", {"name": "more"}),
            tool_call("web__more"),
            "42",
        ]
    )
    servers = {"web": {"type": transport, "url": server.url, "headers": {"X-Test": "1"}}}
    async with Client(store="memory") as client:
        session = await open_session(client, model, mcp_servers=servers)
        reply = await session.send_and_wait("go")
        done = outcomes(await session.get_events())
    assert reply is not None and reply.data.content == "42"
    assert done[0] == ("web__add", "success", "42")
    assert done[2] == ("web__more", "success", "more")
    assert json.loads(json.dumps(servers))  # the config stayed plain data
