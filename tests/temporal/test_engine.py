"""Sessions on Temporal, with the workers in this process (spec section 15): runs, inputs,
the questions runs ask outside themselves, parking, aborts.

A `Client` on an engine runs no loop: every run here executes in a `Worker` (an activity of
the session's workflow) and reaches the client through the store, as it would from another
host. The crash and takeover cases, with real worker processes, are in `test_takeover.py`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from tests.conftest import Recorder
from tests.temporal.conftest import StartWorker, types
from trimtab import Client, PermissionDecision, PermissionHandler, ToolInvocation, define_tool
from trimtab.events import PermissionRequestData
from trimtab.testing import ScriptedModel, tool_call

pytestmark = pytest.mark.usefixtures("temporal_server")


class Text(BaseModel):
    text: str


def echo_tool() -> Any:
    return define_tool("echo", params_type=Text, skip_permission=True, handler=lambda p: p.text)


async def parked(engine: Any, session_id: str, within: float = 10.0) -> None:
    """Return once the session's workflow has no activity in flight: no worker holds its
    run (Temporal is polled: it tells nobody)."""
    from trimtab.temporal._workflow import workflow_id

    handle = engine.client.get_workflow_handle(workflow_id(session_id))
    for _ in range(int(within / 0.05)):
        described = await handle.describe()
        if not described.raw_description.pending_activities:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"an activity still runs session {session_id} after {within} s")


async def test_en2_each_input_runs_once_in_order_each_run_to_one_idle(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    model = ScriptedModel(then=lambda request: f"re: {request.messages[-1].content}")
    await start_worker(pg_dsn, provider=model)
    async with Client(store=pg_dsn, engine=engine) as client:
        session = await client.create_session(provider=model)
        seen = Recorder(session)
        assert session.is_remote  # this process runs none of it

        ids = [await session.send(f"m{n}") for n in range(3)]
        await seen.wait_for("session.idle", 3, timeout=20)
        reply = await session.send_and_wait("last", timeout=20)

        assert reply is not None and reply.data.content == "re: last"
        log = await session.get_events()
        messages = [e.data.message_id for e in log if e.type == "user.message"]
        assert messages[:3] == ids and len(messages) == 4  # each once, in order
        assert [e.data.content for e in log if e.type == "assistant.message"] == [
            "re: m0",
            "re: m1",
            "re: m2",
            "re: last",
        ]
        await seen.wait_for("session.idle", 4, timeout=10)
        assert len(seen.of("session.idle")) == 4  # one per run (E1)


async def test_en2_a_repeated_input_id_runs_once(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    model = ScriptedModel(then=lambda request: "ok")
    await start_worker(pg_dsn, provider=model)
    await start_worker(pg_dsn, provider=model)
    async with (
        Client(store=pg_dsn, engine=engine) as one,
        Client(store=pg_dsn, engine=engine) as two,
    ):
        session = await one.create_session(provider=model)
        other = await two.resume_session(session.session_id, provider=model)
        seen = Recorder(session)
        store = await one._open_store()
        # A retried send: the same message id, stored and submitted through both clients.
        for client_store in (store, await two._open_store()):
            await client_store.enqueue_input(session.session_id, "once", "same-id")
        await engine.submit(session.session_id, "same-id")
        await engine.submit(session.session_id, "same-id")
        await other.send_and_wait("after", timeout=20)
        await seen.wait_for("session.idle", 2, timeout=10)

        log = await session.get_events()
        assert [e.data.message_id for e in log if e.type == "user.message"].count("same-id") == 1
        assert len(seen.of("session.idle")) == 2


async def test_en6_worker_tools_run_in_the_worker_the_sessions_other_tools_in_its_client(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    ran: list[str] = []

    def on_client(params: Text, invocation: ToolInvocation) -> str:
        ran.append(f"client:{params.text}")
        return f"client saw {params.text}"

    def in_worker(params: Text) -> str:
        ran.append(f"worker:{params.text}")
        return f"worker saw {params.text}"

    client_tool = define_tool("local", params_type=Text, skip_permission=True, handler=on_client)
    worker_tool = define_tool("remote", params_type=Text, skip_permission=True, handler=in_worker)
    # The client has a `remote` of its own, which never runs: the worker holds that one.
    shadow = define_tool(
        "remote", params_type=Text, skip_permission=True, handler=lambda p: ran.append("shadow")
    )
    model = ScriptedModel(
        [
            [
                tool_call("local", {"text": "a"}, id="c1"),
                tool_call("remote", {"text": "b"}, id="c2"),
            ],
            "done",
        ]
    )
    await start_worker(pg_dsn, provider=model, tools=[worker_tool])
    async with Client(store=pg_dsn, engine=engine) as client:
        session = await client.create_session(provider=model, tools=[client_tool, shadow])
        reply = await session.send_and_wait("go", timeout=20)

        assert reply is not None and reply.data.content == "done"
        assert sorted(ran) == ["client:a", "worker:b"]
        log = await session.get_events()
        results = {
            e.data.tool_call_id: e.data.result.content
            for e in log
            if e.type == "tool.execution_complete" and e.data.result is not None
        }
        assert results == {"c1": "client saw a", "c2": "worker saw b"}
        # The client's call went through the log: announced, then settled.
        assert types(log).count("external_tool.requested") == 1
        assert types(log).count("external_tool.completed") == 1


async def test_en6_a_permission_is_asked_of_the_client_that_has_the_session_open(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    asked: list[str] = []

    def decide(request: PermissionRequestData, invocation: ToolInvocation) -> PermissionDecision:
        asked.append(request.tool_name)
        return PermissionDecision(kind="approve-once")

    echo = define_tool("echo", params_type=Text, handler=lambda p: p.text)
    model = ScriptedModel([tool_call("echo", {"text": "hi"}), "done"])
    await start_worker(pg_dsn, provider=model, tools=[echo])
    async with Client(store=pg_dsn, engine=engine) as client:
        session = await client.create_session(
            provider=model, tools=[echo], on_permission_request=decide
        )
        reply = await session.send_and_wait("go", timeout=20)

        assert reply is not None and reply.data.content == "done"
        assert asked == ["echo"]
        log = await session.get_events()
        assert [e.data.result.kind for e in log if e.type == "permission.completed"] == ["approved"]
        assert "session.resume" not in types(log)  # answered within park_after: not parked


async def test_en5_a_run_parks_on_an_unanswered_question_holding_no_worker_then_goes_on(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    decided = asyncio.Event()

    async def slow(request: PermissionRequestData, invocation: ToolInvocation) -> Any:
        await decided.wait()
        return PermissionDecision(kind="approve-once")

    echo = define_tool("echo", params_type=Text, handler=lambda p: p.text)
    model = ScriptedModel([tool_call("echo", {"text": "hi"}), "done"])
    await start_worker(pg_dsn, provider=model, tools=[echo])
    async with Client(store=pg_dsn, engine=engine) as client:
        session = await client.create_session(
            provider=model, tools=[echo], on_permission_request=slow
        )
        seen = Recorder(session)
        waiting = asyncio.ensure_future(session.send_and_wait("go", timeout=30))
        await seen.wait_for("permission.requested", timeout=20)

        # Parked: the attempt ended, and no worker holds the run while nobody decides.
        await parked(engine, session.session_id)
        assert not waiting.done()
        decided.set()
        reply = await waiting

        assert reply is not None and reply.data.content == "done"
        log = await session.get_events()
        assert types(log).count("session.resume") == 1  # the parked run went on
        assert types(log).count("permission.requested") == 1  # asked once
        assert [e.data.outcome for e in log if e.type == "tool.execution_complete"] == ["success"]
        await seen.wait_for("session.idle", timeout=10)
        assert len(seen.of("session.idle")) == 1


async def test_en5_d6_a_parked_question_nobody_answers_is_given_up_after_the_pending_timeout(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    engine.pending_timeout = 1.0  # (for the workflows this engine starts)
    echo = define_tool("echo", params_type=Text, handler=lambda p: p.text)
    model = ScriptedModel([tool_call("echo", {"text": "hi"}), "gave up"])
    await start_worker(pg_dsn, provider=model, tools=[echo])
    async with Client(store=pg_dsn, engine=engine) as client:
        # No permission handler here, nor anywhere: nobody answers.
        session = await client.create_session(provider=model, tools=[echo])
        reply = await session.send_and_wait("go", timeout=30)

        assert reply is not None and reply.data.content == "gave up"
        log = await session.get_events()
        kinds = [e.data.result.kind for e in log if e.type == "permission.completed"]
        assert kinds == ["denied-no-approval-rule-and-could-not-request-from-user"]
        assert [e.data.outcome for e in log if e.type == "tool.execution_complete"] == ["denied"]


async def test_e4_en4_an_abort_ends_a_parked_run_with_its_question_closed(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    echo = define_tool("echo", params_type=Text, handler=lambda p: p.text)
    model = ScriptedModel([tool_call("echo", {"text": "hi"})])
    await start_worker(pg_dsn, provider=model, tools=[echo])
    async with Client(store=pg_dsn, engine=engine) as client:
        session = await client.create_session(provider=model, tools=[echo])
        seen = Recorder(session)
        await session.send("go")
        await seen.wait_for("permission.requested", timeout=20)
        await parked(engine, session.session_id)

        await session.abort()

        await seen.wait_for("session.idle", timeout=10)
        log = await session.get_events()
        assert types(log)[-4:] == [
            "permission.completed",
            "tool.execution_complete",
            "assistant.turn_end",
            "abort",
        ]
        assert [e.data.outcome for e in log if e.type == "tool.execution_complete"] == ["cancelled"]
        idle = seen.of("session.idle")
        assert len(idle) == 1 and idle[0].data.aborted


async def test_e4_en4_an_abort_ends_the_run_a_worker_executes(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    started = asyncio.Event()

    async def forever(params: Text) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    hang = define_tool("hang", params_type=Text, skip_permission=True, handler=forever)
    model = ScriptedModel([tool_call("hang", {"text": "x"}), "after"])
    await start_worker(pg_dsn, provider=model, tools=[hang])
    async with Client(store=pg_dsn, engine=engine) as client:
        session = await client.create_session(
            provider=model, tools=[hang], on_permission_request=PermissionHandler.approve_all
        )
        seen = Recorder(session)
        await session.send("go")
        async with asyncio.timeout(20):
            await started.wait()

        await session.abort()

        await seen.wait_for("session.idle", timeout=10)
        log = await session.get_events()
        assert types(log)[-1] == "abort"
        assert [e.data.outcome for e in log if e.type == "tool.execution_complete"] == ["cancelled"]
        assert seen.of("session.idle")[0].data.aborted
        # The session goes on: the next input runs.
        reply = await session.send_and_wait("again", timeout=20)
        assert reply is not None and reply.data.content == "after"


async def test_c8_c10_a_clear_from_a_worker_tool_seeds_one_run(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    async def clear(params: Text, invocation: ToolInvocation) -> str:
        result = invocation.session.history.clear_context(params.text)
        return f"cleared {result.messages_cleared}"

    clearing = define_tool(
        "clear", params_type=Text, skip_permission=True, is_terminal=True, handler=clear
    )
    model = ScriptedModel([tool_call("clear", {"text": "fresh start"}), "seeded answer"])
    await start_worker(pg_dsn, provider=model, tools=[clearing])
    async with Client(store=pg_dsn, engine=engine) as client:
        session = await client.create_session(provider=model, tools=[clearing])
        seen = Recorder(session)
        reply = await session.send_and_wait("go", timeout=20)

        assert reply is not None and reply.data.content == "seeded answer"
        log = await session.get_events()
        seeds = [e for e in log if e.type == "user.message" and e.data.source == "context_cleared"]
        assert len(seeds) == 1 and seeds[0].data.content == "fresh start"
        assert [m.role for m in model.requests[1].messages] == ["user"]
        await seen.wait_for("session.idle", timeout=10)
        assert len(seen.of("session.idle")) == 1  # no idle between the clear and its seed


@pytest.mark.parametrize(
    "option",
    [{"hooks": {"on_pre_tool_use": lambda *a: None}}, {"mcp_servers": {"x": {"command": "x"}}}],
    ids=["hooks", "mcp_servers"],
)
async def test_en1_a_session_on_an_engine_refuses_what_only_its_own_process_could_run(
    pg_dsn: str, engine: Any, option: dict[str, Any]
) -> None:
    async with Client(store=pg_dsn, engine=engine) as client:
        with pytest.raises(ValueError, match="cannot be given to a session on an engine"):
            await client.create_session(provider=ScriptedModel(), **option)
        assert await client.list_sessions() == []  # nothing stored


async def test_en2_the_workflow_of_a_session_deleted_elsewhere_ends(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    from trimtab.temporal._workflow import workflow_id

    model = ScriptedModel(then=lambda request: "ok")
    await start_worker(pg_dsn, provider=model)
    async with Client(store=pg_dsn, engine=engine) as client:
        session = await client.create_session(provider=model)
    async with Client(store=pg_dsn) as elsewhere:  # not on the engine: it tells it nothing
        await elsewhere.delete_session(session.session_id)

    await engine.submit(session.session_id, "late")  # an attempt finds the session gone

    handle = engine.client.get_workflow_handle(workflow_id(session.session_id))
    async with asyncio.timeout(20):
        await handle.result()  # ended, rather than retrying for ever
