"""Spec section 3: `session.history.clear_context` (rules C1-C11)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import (
    ClearArgs,
    Recorder,
    clear_handler,
    clear_tool,
    echo_tool,
    open_session,
    roles,
)
from trimtab import ClearContextError, Client, ToolError, ToolInvocation, define_tool
from trimtab.testing import ScriptedModel, tool_call

SEED = "Reply with exactly FRESH_CONTEXT."
ASK = f'Call clear_context with prompt "{SEED}" now.'


async def test_seed_scenario_event_order_and_two_requests(client: Client) -> None:
    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH_CONTEXT"])
    session = await open_session(client, model, clear_tool(), developer_messages=["DEV"])
    rec = Recorder(session)

    reply = await session.send_and_wait(ASK)

    assert reply is not None and reply.data.content == "FRESH_CONTEXT"
    assert len(model.requests) == 2
    assert roles(model, 0) == [("system", "SYSTEM"), ("developer", "DEV"), ("user", ASK)]
    assert roles(model, 1) == [("system", "SYSTEM"), ("developer", "DEV"), ("user", SEED)]
    tail = rec.types[rec.types.index("tool.execution_complete") :]
    assert tail == [
        "tool.execution_complete",
        "session.context_cleared",
        "assistant.turn_end",
        "user.message",
        "assistant.turn_start",
        "assistant.message",
        "assistant.usage",
        "session.usage_info",
        "assistant.turn_end",
        "session.idle",
    ]
    model.assert_done()


async def test_c1_clear_outside_a_tool_call_is_refused(client: Client) -> None:
    session = await open_session(client, ScriptedModel())
    before = await session.get_events()
    with pytest.raises(ClearContextError) as err:
        await session.history.clear_context(SEED)
    assert err.value.code == "no_tool_call_in_flight"
    assert await session.get_events() == before


async def test_c1_clear_from_another_sessions_tool_is_refused(client: Client) -> None:
    other = await open_session(client, ScriptedModel())
    errors: list[str] = []

    async def handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        try:
            await other.history.clear_context(params.prompt)
        except ClearContextError as exc:
            errors.append(exc.code)
        return "done"

    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED})])
    session = await open_session(client, model, clear_tool(handler=handler))
    await session.send_and_wait(ASK)
    assert errors == ["no_tool_call_in_flight"]


@pytest.mark.parametrize("prompt", ["", "   \n\t"])
async def test_c2_empty_prompt_is_refused_and_changes_nothing(client: Client, prompt: str) -> None:
    codes: list[str] = []

    async def handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        try:
            await invocation.session.history.clear_context(params.prompt)
        except ClearContextError as exc:
            codes.append(exc.code)
            raise ToolError(str(exc)) from exc
        return "cleared"

    model = ScriptedModel([tool_call("clear_context", {"prompt": prompt}), "gave up"])
    session = await open_session(client, model, clear_tool(handler=handler))
    rec = Recorder(session)
    await session.send_and_wait(ASK)
    assert codes == ["empty_prompt"]
    assert rec.of("session.context_cleared") == []
    assert roles(model, 1)[1] == ("user", ASK)


async def test_c3_clear_on_a_remote_session_is_refused(tmp_path: Any) -> None:
    db = tmp_path / "shared.db"
    async with Client(store=db) as owner, Client(store=db) as other:
        session = await open_session(owner, ScriptedModel())
        remote = await other.resume_session(session.session_id, provider=ScriptedModel())
        assert remote.is_remote
        with pytest.raises(ClearContextError) as err:
            await remote.history.clear_context(SEED)
        assert err.value.code == "remote_session"
        assert "is run by another runtime" in str(err.value)


async def test_c4_second_clear_in_the_same_run_is_refused_and_seed_sent_once(
    client: Client,
) -> None:
    codes: list[str] = []

    async def handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        await invocation.session.history.clear_context(params.prompt)
        try:
            await invocation.session.history.clear_context("another seed")
        except ClearContextError as exc:
            codes.append(exc.code)
        return "ok"

    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH_CONTEXT"])
    session = await open_session(client, model, clear_tool(handler=handler))
    rec = Recorder(session)
    await session.send_and_wait(ASK)
    assert codes == ["clear_pending"]
    assert len(rec.of("session.context_cleared")) == 1
    seeds = [e for e in rec.of("user.message") if e.data.source == "context_cleared"]
    assert [e.data.content for e in seeds] == [SEED]


async def test_c4_parallel_clears_in_one_batch_commit_once(client: Client) -> None:
    model = ScriptedModel(
        [
            [
                tool_call("clear_context", {"prompt": SEED}),
                tool_call("clear_context", {"prompt": "other"}),
            ],
            "FRESH",
        ]
    )
    session = await open_session(client, model, clear_tool())
    rec = Recorder(session)
    await session.send_and_wait(ASK)
    outcomes = [e.data.outcome for e in rec.of("tool.execution_complete")]
    assert sorted(outcomes) == ["failure", "success"]
    assert len(rec.of("session.context_cleared")) == 1
    assert len(model.requests) == 2


async def test_c5_messages_cleared_counts_the_conversation(client: Client) -> None:
    counts: list[int] = []

    async def handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        counts.append(
            (await invocation.session.history.clear_context(params.prompt)).messages_cleared
        )
        return "ok"

    model = ScriptedModel(
        [
            "first answer",
            tool_call("echo", {"text": "x"}),
            tool_call("clear_context", {"prompt": SEED}),
            "FRESH",
        ]
    )
    session = await open_session(client, model, echo_tool(), clear_tool(handler=handler))
    await session.send_and_wait("hello")
    rec = Recorder(session)
    await session.send_and_wait(ASK)
    # user, assistant | user, assistant(echo), tool, assistant(clear_context)
    assert counts == [6]
    assert rec.of("session.context_cleared")[0].data.messages_cleared == 6


async def test_c6_committed_clear_keeps_system_developer_and_drops_sibling_results(
    client: Client,
) -> None:
    model = ScriptedModel(
        [
            [tool_call("echo", {"text": "sibling"}), tool_call("clear_context", {"prompt": SEED})],
            "FRESH",
        ]
    )
    session = await open_session(
        client, model, echo_tool(), clear_tool(), developer_messages=["DEV"]
    )
    await session.send_and_wait(ASK)
    assert roles(model, 1) == [("system", "SYSTEM"), ("developer", "DEV"), ("user", SEED)]
    completes = [e for e in await session.get_events() if e.type == "tool.execution_complete"]
    assert {e.data.tool_name for e in completes} == {"echo", "clear_context"}


async def test_c7_clear_whose_tool_then_fails_is_rolled_back(client: Client) -> None:
    async def handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        await invocation.session.history.clear_context(params.prompt)
        raise ToolError("disk full")

    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "I could not clear."])
    session = await open_session(client, model, clear_tool(handler=handler))
    rec = Recorder(session)
    reply = await session.send_and_wait(ASK)
    assert reply is not None and reply.data.content == "I could not clear."
    assert rec.of("session.context_cleared") == []
    assert session.context_epoch == 0
    second = roles(model, 1)
    assert second[:2] == [("system", "SYSTEM"), ("user", ASK)]
    assert second[-1] == ("tool", "disk full")


async def test_c7_clear_rolled_back_when_the_call_times_out(client: Client) -> None:
    async def handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        await invocation.session.history.clear_context(params.prompt)
        await asyncio.sleep(10)
        return "never"

    tool = define_tool(
        "clear_context", params_type=ClearArgs, is_terminal=True, timeout=0.05, handler=handler
    )
    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "timed out"])
    session = await open_session(client, model, tool)
    rec = Recorder(session)
    await session.send_and_wait(ASK)
    assert [e.data.outcome for e in rec.of("tool.execution_complete")] == ["timeout"]
    assert rec.of("session.context_cleared") == []


async def test_c7_a_retry_after_a_rolled_back_clear_can_commit(client: Client) -> None:
    attempts: list[int] = []

    async def handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        await invocation.session.history.clear_context(params.prompt)
        attempts.append(1)
        if len(attempts) == 1:
            raise ToolError("try again")
        return "ok"

    model = ScriptedModel(
        [
            tool_call("clear_context", {"prompt": SEED}),
            tool_call("clear_context", {"prompt": SEED}),
            "FRESH",
        ]
    )
    session = await open_session(client, model, clear_tool(handler=handler))
    reply = await session.send_and_wait(ASK)
    assert reply is not None and reply.data.content == "FRESH"
    assert roles(model, 2) == [("system", "SYSTEM"), ("user", SEED)]


async def test_c8_non_terminal_clear_makes_no_call_against_the_cleared_window(
    client: Client,
) -> None:
    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH"])
    session = await open_session(client, model, clear_tool(is_terminal=False))
    rec = Recorder(session)
    reply = await session.send_and_wait(ASK)
    assert reply is not None and reply.data.content == "FRESH"
    assert len(model.requests) == 2
    assert roles(model, 1) == [("system", "SYSTEM"), ("user", SEED)]
    assert rec.types.count("session.idle") == 1
    seed = [e for e in rec.of("user.message") if e.data.source == "context_cleared"]
    assert len(seed) == 1 and seed[0].data.content == SEED


async def test_c8_seeded_reply_keeps_the_original_message_id(client: Client) -> None:
    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH"])
    session = await open_session(client, model, clear_tool())
    message_id = await session.send(ASK)
    rec = Recorder(session)
    await rec.wait_for("session.idle")
    replies = rec.of("assistant.message")
    assert {e.data.originating_message_id for e in replies} == {message_id}


async def test_c9_clear_preserves_identity_config_log_and_usage(client: Client) -> None:
    model = ScriptedModel(
        ["before", tool_call("clear_context", {"prompt": SEED}), "FRESH", "after"]
    )
    session = await open_session(
        client, model, clear_tool(), developer_messages=["DEV"], model="m-1"
    )
    await session.send_and_wait("hi")
    before = await session.get_events()
    await session.send_and_wait(ASK)
    await session.send_and_wait("again")
    events = await session.get_events()
    assert events[: len(before)] == before
    assert session.config.model == "m-1" and [t.name for t in session.config.tools] == [
        "clear_context"
    ]
    assert roles(model, 3) == [
        ("system", "SYSTEM"),
        ("developer", "DEV"),
        ("user", SEED),
        ("assistant", "FRESH"),
        ("user", "again"),
    ]
    usage = [e for e in events if e.type == "assistant.usage"]
    assert len(usage) == 4
    cleared = next(i for i, e in enumerate(events) if e.type == "session.context_cleared")
    assert {e.context_epoch for e in events[:cleared]} == {0}
    assert {e.context_epoch for e in events[cleared:]} == {1}
    assert session.context_epoch == 1


async def test_c11_handler_can_call_back_into_the_session(client: Client) -> None:
    seen: list[int] = []

    def sync_handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        # A sync handler clears without awaiting: the result is usable directly.
        return f"Cleared {invocation.session.history.clear_context(params.prompt).messages_cleared}"

    async def probe(params: Any, invocation: ToolInvocation) -> str:
        seen.append(len(await invocation.session.get_events()))
        await invocation.session.send("queued from a handler")
        return "probed"

    model = ScriptedModel(
        [
            [tool_call("probe"), tool_call("clear_context", {"prompt": SEED})],
            "FRESH",
            "queued answer",
        ]
    )
    tools = [define_tool("probe", handler=probe), clear_tool(handler=sync_handler)]
    session = await open_session(client, model, *tools)
    rec = Recorder(session)
    reply = await asyncio.wait_for(session.send_and_wait(ASK), 5)
    assert reply is not None and reply.data.content == "FRESH"
    await rec.wait_for("session.idle", 2)
    assert seen and seen[0] > 0
    assert roles(model, 2)[-1] == ("user", "queued from a handler")


async def test_c11_clear_through_rpc_spelling(client: Client) -> None:
    async def handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        result = await invocation.session.rpc.history.clear_context(prompt=params.prompt)
        return str(result.messages_cleared)

    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH"])
    session = await open_session(client, model, clear_tool(handler=handler))
    assert (await session.send_and_wait(ASK)) is not None
    assert roles(model, 1)[-1] == ("user", SEED)


async def test_example_handler_shape_is_the_public_one(client: Client) -> None:
    # The handler used by the README: awaits clear_context through the invocation.
    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH"])
    session = await open_session(client, model, clear_tool(handler=clear_handler))
    reply = await session.send_and_wait(ASK)
    assert reply is not None and reply.data.content == "FRESH"
