"""Spec section K in process: the model, the name, notes and forks of a session, on every store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import Recorder, echo_tool, open_session
from trimtab import (
    Client,
    PermissionDecision,
    ToolInvocation,
    TrimtabError,
    WorkspaceError,
    define_tool,
)
from trimtab._state import state_of
from trimtab.testing import ScriptedModel, tool_call


async def test_k1_switch_model_applies_from_the_next_turn_and_survives_resume(
    client: Client,
) -> None:
    model = ScriptedModel([tool_call("switch", {}), "done", "later"])

    @define_tool(description="Switch the model")
    async def switch(invocation: ToolInvocation) -> str:
        await session.switch_model("big-model", reasoning_effort="high")
        return "switched"

    session = await open_session(client, model, switch, model="small-model")
    rec = Recorder(session)
    await session.send_and_wait("go")
    assert [r.model for r in model.requests] == ["small-model", "big-model"]
    change = rec.of("session.model_change")[0].data
    assert (change.previous_model, change.new_model, change.reasoning_effort) == (
        "small-model",
        "big-model",
        "high",
    )
    await session.set_reasoning_effort("low")
    assert (session.config.model, session.config.reasoning_effort) == ("big-model", "low")

    events = await session.get_events()
    assert state_of(events).config.model == "big-model"  # a full replay agrees
    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=model, tools=[switch])
    assert (resumed.config.model, resumed.config.reasoning_effort) == ("big-model", "low")
    await resumed.send_and_wait("again")
    assert model.requests[-1].model == "big-model"


async def test_k1_switch_model_keeps_the_effort_unless_given(client: Client) -> None:
    session = await open_session(client, ScriptedModel(), model="m1")
    await session.switch_model("m2", reasoning_effort="high")
    await session.switch_model("m3")
    assert session.config.reasoning_effort == "high"
    with pytest.raises(ValueError, match="non-empty"):
        await session.switch_model("  ")
    # A lone surrogate is refused, as in a prompt, not logged as a "?" no provider knows.
    with pytest.raises(ValueError, match="model is not valid Unicode"):
        await session.switch_model("m\ud8004")
    with pytest.raises(ValueError, match="reasoning_effort is not valid Unicode"):
        await session.switch_model("m4", reasoning_effort="hi\udfffgh")
    with pytest.raises(ValueError, match="reasoning_effort is not valid Unicode"):
        await session.set_reasoning_effort("\udfff")
    assert (session.config.model, session.config.reasoning_effort) == ("m3", "high")


async def test_k2_set_name_trims_logs_each_time_and_refuses_blank(client: Client) -> None:
    session = await open_session(client, ScriptedModel())
    rec = Recorder(session)
    await session.set_name(" Notes ")
    await session.set_name("Notes")
    assert [e.data.title for e in rec.of("session.title_changed")] == ["Notes", "Notes"]
    for blank in ("", " \t\n"):
        with pytest.raises(ValueError, match="empty or only whitespace"):
            await session.set_name(blank)
    with pytest.raises(ValueError, match="longer than 100"):
        await session.set_name("x" * 101)
    assert session.name == "Notes"
    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=ScriptedModel())
    assert resumed.name == "Notes"


async def test_k4_log_notes_by_level_and_an_error_note_ends_no_run(client: Client) -> None:
    model = ScriptedModel([tool_call("note", {}), "after the note"])

    @define_tool(description="Write an error note")
    async def note(invocation: ToolInvocation) -> str:
        await session.log("looks bad", level="error")
        return "noted"

    session = await open_session(client, model, note)
    rec = Recorder(session)
    reply = await session.send_and_wait("go")  # the note mid-run does not fail the run
    assert reply is not None and reply.data.content == "after the note"
    error = rec.of("session.error")[0].data
    assert (error.error_type, error.message, error.logged) == ("notification", "looks bad", True)

    await session.log("fyi", kind="tip", url="https://example.com")
    await session.log("careful", level="warning")
    await session.log("just now", ephemeral=True)
    info = rec.of("session.info")
    assert [(e.data.info_type, e.data.message) for e in info] == [
        ("tip", "fyi"),
        ("notification", "just now"),
    ]
    stored = [getattr(e.data, "message", None) for e in await session.get_events()]
    assert "fyi" in stored and "careful" in stored and "just now" not in stored
    assert state_of(await session.get_events()).run_id is None


async def test_k3_fork_to_an_event_excludes_it_and_an_unknown_one_is_named(
    client: Client,
) -> None:
    model = ScriptedModel(["one", "two"])
    session = await open_session(client, model, echo_tool())
    await session.send_and_wait("first")
    await session.send_and_wait("second")
    events = await session.get_events()
    boundary = next(e for e in events if e.type == "user.message" and e.data.content == "second")
    fork = await session.history.fork(boundary.id)
    copied = [e for e in await fork.get_events() if e.type == "user.message"]
    assert [e.data.content for e in copied] == ["first"]
    with pytest.raises(ValueError, match="Event nope not found"):
        await session.history.fork("nope")


async def test_k5_metrics_count_calls_by_model_and_shutdown_logs_them(client: Client) -> None:
    model = ScriptedModel(["one", "two"])
    session = await open_session(client, model, model="m1")
    await session.send_and_wait("first")
    await session.switch_model("m2")
    await session.send_and_wait("second")
    metrics = await session.metrics()
    assert metrics.user_requests == 2
    assert {name: m.requests.count for name, m in metrics.models.items()} == {"m1": 1, "m2": 1}
    assert metrics.models["m2"].usage.output_tokens > 0

    rec = Recorder(session)
    await session.shutdown("error", reason="the host is stopping")
    assert session.closed
    data = rec.of("session.shutdown")[0].data
    assert (data.shutdown_type, data.error_reason) == ("error", "the host is stopping")
    assert data.model_metrics == metrics.models
    with pytest.raises(TrimtabError, match="disconnected"):
        await session.set_name("late")


async def test_k6_approve_all_asks_no_handler_and_is_not_logged(client: Client) -> None:
    asked: list[object] = []

    def refuse(request: object, invocation: object) -> PermissionDecision:
        asked.append(request)
        return PermissionDecision(kind="reject")

    model = ScriptedModel([tool_call("echo", {"text": "a"}), "done"])
    session = await open_session(
        client, model, echo_tool(skip_permission=False), on_permission_request=refuse
    )
    rec = Recorder(session)
    session.approve_all = True
    await session.send_and_wait("go")
    assert asked == [] and rec.of("permission.requested") == []
    assert rec.of("tool.execution_complete")[0].data.outcome == "success"
    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=model)
    assert resumed.approve_all is False


async def test_k7_set_mode_logs_changes_only_and_survives_resume(client: Client) -> None:
    session = await open_session(client, ScriptedModel())
    rec = Recorder(session)
    assert session.mode == "interactive"
    await session.set_mode("plan")
    await session.set_mode("plan")
    assert [(e.data.previous_mode, e.data.new_mode) for e in rec.of("session.mode_changed")] == [
        ("interactive", "plan")
    ]
    with pytest.raises(ValueError, match="interactive, plan or autopilot"):
        await session.set_mode("dreaming")  # type: ignore[arg-type]
    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=ScriptedModel())
    assert resumed.mode == "plan"


async def test_k9_clearing_the_queue_removes_waiting_messages_only(client: Client) -> None:
    release = asyncio.Event()

    @define_tool(description="Wait until released")
    async def hold(invocation: ToolInvocation) -> str:
        await release.wait()
        return "released"

    model = ScriptedModel([tool_call("hold", {}), "first done"])
    session = await open_session(client, model, hold)
    rec = Recorder(session)
    first = asyncio.ensure_future(session.send_and_wait("first"))
    await rec.wait_for("tool.execution_start")  # the first run is in its tool call
    second = asyncio.ensure_future(session.send_and_wait("second"))
    await rec.wait_for("pending_messages.modified")
    third_id = await session.send("third")
    queued = await session.pending_messages()
    assert [m.prompt for m in queued] == ["second", "third"]
    assert queued[1].message_id == third_id

    removed = await session.clear_pending_messages()
    assert removed == [m.message_id for m in queued]
    assert await session.pending_messages() == []
    with pytest.raises(TrimtabError, match="removed from the queue"):
        await second
    release.set()
    reply = await first
    assert reply is not None and reply.data.content == "first done"
    await session.wait_idle()
    prompts = [e.data.content for e in await session.get_events() if e.type == "user.message"]
    assert prompts == ["first"]
    changes = rec.of("pending_messages.modified")
    assert len(changes) == 3 and changes[-1].data.removed == removed
    assert await session.clear_pending_messages() == []


async def test_k5_c11_shutdown_from_a_tool_handler_completes(client: Client) -> None:
    # As `disconnect()`: the abort cancels the handler that asked, and the shutdown goes on.
    async def quit_session(params: Any, invocation: ToolInvocation) -> str:
        await invocation.session.shutdown(reason="the tool ended it")
        return "never returned"

    model = ScriptedModel([tool_call("quit_session")])
    session = await open_session(client, model, define_tool("quit_session", handler=quit_session))
    rec = Recorder(session)
    await asyncio.wait_for(session.send_and_wait("go"), 10)  # aborted: no reply
    await asyncio.wait_for(rec.wait_for("session.shutdown"), 10)
    for _ in range(100):
        if session.closed:
            break
        await asyncio.sleep(0.05)
    assert session.closed
    types = [e.type for e in rec.events]
    assert types[-3:] == ["abort", "session.idle", "session.shutdown"], types


async def test_k12_an_auto_name_never_replaces_the_users(client: Client) -> None:
    session = await open_session(client, ScriptedModel())
    assert await session.set_auto_name("  " + "x" * 150 + "\nsecond line") is True
    assert (session.name, session.named_automatically) == ("x" * 100, True)
    await session.set_name("Mine")
    assert await session.set_auto_name("Summary") is False
    assert (session.name, session.named_automatically) == ("Mine", False)
    with pytest.raises(ValueError, match="summary must be a string"):
        await session.set_auto_name(None)  # type: ignore[arg-type]
    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=ScriptedModel())
    assert (resumed.name, resumed.named_automatically) == ("Mine", False)


async def test_k13_a_command_nobody_answers_lets_the_queue_go_on_after_its_wait(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("trimtab._runner.COMMAND_TIMEOUT", 0.2)
    session = await open_session(client, ScriptedModel(["after"]))
    rec = Recorder(session)
    request_id = await session.enqueue_command("/deploy prod", display_text="Deploy")
    reply = await asyncio.wait_for(session.send_and_wait("then this"), 10)
    assert reply is not None and reply.data.content == "after"
    types = [e.type for e in rec.events if e.type.startswith("command.")]
    assert types == ["command.queued", "command.completed"]
    assert rec.of("command.queued")[0].data.request_id == request_id
    assert session.respond_to_command(request_id) is False  # its wait is over
    for bad in ("deploy", "/", "  "):
        with pytest.raises(ValueError):
            await session.enqueue_command(bad)


async def test_k13_disconnecting_while_a_command_waits_for_its_host_does_not_wait(
    client: Client,
) -> None:
    session = await open_session(client, ScriptedModel())
    rec = Recorder(session)
    await session.enqueue_command("/wait")
    await rec.wait_for("command.queued")
    await asyncio.wait_for(session.disconnect(), 5)
    assert [e.type for e in rec.events if e.type.startswith("command.")] == [
        "command.queued",
        "command.completed",
    ]


async def test_k16_the_workspace_is_a_fold_of_the_log_on_every_store(client: Client) -> None:
    session = await open_session(client, ScriptedModel())
    ws = session.workspace
    assert await ws.write("docs/a.md", "one") is True
    assert await ws.write("docs/a.md", "two") is False
    await ws.make_directory("empty")
    await ws.rename("docs", "notes")
    await ws.write_plan("# Plan")
    assert await ws.files() == ["notes/a.md"]
    assert (await ws.stat("empty")).is_file is False
    with pytest.raises(WorkspaceError, match="outside the workspace files directory"):
        await ws.write("../x", "no")
    events = await session.get_events()
    await session.disconnect()

    resumed = await client.resume_session(session.session_id, provider=ScriptedModel())
    assert await resumed.workspace.read("notes/a.md") == "two"
    assert await resumed.workspace.read_plan() == "# Plan"
    assert await resumed.workspace.delete_plan() is True
    assert await resumed.workspace.delete_plan() is False
    kinds = [e.type for e in events if e.type.startswith("session.workspace")]
    assert kinds == [
        "session.workspace_file_changed",
        "session.workspace_file_changed",
        "session.workspace_path_changed",
        "session.workspace_path_changed",
    ]
