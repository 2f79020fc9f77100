"""Spec section 3: `session.history.clear_context` (rules C1-C11)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
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
from trimtab import (
    ClearContextError,
    Client,
    Session,
    ToolError,
    ToolInvocation,
    TrimtabError,
    define_tool,
)
from trimtab._tools import SessionHandle
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


async def test_c1_clear_outside_a_tool_call_during_a_run_is_refused(client: Client) -> None:
    """Outside any tool call, a clear is the host's (X4), which a run in flight refuses."""
    answering, answer = asyncio.Event(), asyncio.Event()

    async def slow(request: Any) -> str:
        answering.set()
        await answer.wait()
        return "done"

    session = await open_session(client, ScriptedModel([slow]))
    await session.send("hello")
    await asyncio.wait_for(answering.wait(), 10)
    before = await session.get_events()
    with pytest.raises(ClearContextError) as err:
        await session.history.clear_context(SEED)
    assert err.value.code == "run_in_flight"
    assert await session.get_events() == before
    answer.set()
    await session.wait_idle()


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


SELF_WAITS: dict[str, Callable[[Session], Awaitable[object]]] = {
    "send_and_wait": lambda session: session.send_and_wait("inner"),
    "wait_idle": lambda session: session.wait_idle(),
    "compact": lambda session: session.history.compact(),
    "truncate": lambda session: session.history.truncate("any"),
}


@pytest.mark.parametrize("where", ["tool", "permission", "pre_tool_use", "post_tool_use"])
@pytest.mark.parametrize("call", list(SELF_WAITS))
async def test_c11_a_wait_for_its_own_run_from_what_the_run_awaits_is_refused(
    client: Client, where: str, call: str
) -> None:
    # Host code the run awaits (a tool handler, a permission handler, a hook) that waits for
    # the run's end could only wait for itself: refused at once, and the run goes on.
    outcomes: list[str] = []
    holder: list[Session] = []

    async def attempt() -> None:
        try:
            await asyncio.wait_for(SELF_WAITS[call](holder[0]), 3)
            outcomes.append("returned")
        except TrimtabError as exc:
            outcomes.append(f"refused: {exc}")
        except TimeoutError:
            outcomes.append("hung")

    async def tool(params: Any) -> str:
        if where == "tool":
            await attempt()
        return "ok"

    async def permission(request: Any, invocation: ToolInvocation) -> dict[str, str]:
        if where == "permission":
            await attempt()
        return {"kind": "approve-once"}

    async def hook(hook_input: Any, context: Any) -> None:
        await attempt()

    hooks = {f"on_{where}": hook} if where.endswith("tool_use") else {}
    model = ScriptedModel([tool_call("t"), "done"])
    session = await open_session(
        client,
        model,
        define_tool("t", handler=tool),
        on_permission_request=permission,
        hooks=hooks,
    )
    holder.append(session)
    reply = await asyncio.wait_for(session.send_and_wait(ASK), 10)
    assert reply is not None and reply.data.content == "done"
    assert len(outcomes) == 1 and outcomes[0].startswith("refused: "), outcomes


async def test_c11_a_task_a_handler_leaves_behind_may_wait_for_the_run(client: Client) -> None:
    # Only what the run awaits is refused: another session's run, or the session's own from
    # code the run does not wait for, is waited for as usual.
    other_model = ScriptedModel(["other done"])
    other = await open_session(client, other_model)
    replies: list[str] = []

    async def tool(params: Any) -> str:
        reply = await other.send_and_wait("for the other session")
        replies.append(reply.data.content if reply else "")
        return "ok"

    model = ScriptedModel([tool_call("t"), "done", "later"])
    session = await open_session(client, model, define_tool("t", handler=tool))
    await asyncio.wait_for(session.send_and_wait(ASK), 10)
    later = await asyncio.wait_for(session.send_and_wait("later"), 10)
    assert replies == ["other done"]
    assert later is not None and later.data.content == "later"


@pytest.mark.parametrize("where", ["permission", "pre_tool_use"])
async def test_c1_a_permission_handler_or_hook_is_not_a_tool_handler(
    client: Client, where: str
) -> None:
    # A clear from them is refused: their call is not running yet, and another call of the
    # batch (which knows nothing of it), in flight meanwhile, must not carry it.
    refusals: list[str] = []
    running, tried = asyncio.Event(), asyncio.Event()

    async def clear(session: SessionHandle) -> None:
        await asyncio.wait_for(running.wait(), 10)  # the other call is in flight
        try:
            session.history.clear_context(SEED)
        except ClearContextError as exc:
            refusals.append(exc.code)
        finally:
            tried.set()

    async def slow(params: Any) -> str:
        running.set()
        await asyncio.wait_for(tried.wait(), 10)  # in flight while the other call is asked
        return "slow done"

    async def permission(request: Any, invocation: ToolInvocation) -> dict[str, str]:
        if where == "permission" and request.tool_call_id == "b":
            await clear(invocation.session)
        return {"kind": "approve-once"}

    async def hook(hook_input: Any, context: Any) -> None:
        if hook_input["toolName"] == "fast":
            await clear(holder[0])

    holder: list[Session] = []
    model = ScriptedModel([[tool_call("slow", id="a"), tool_call("fast", id="b")], "done"])
    session = await open_session(
        client,
        model,
        define_tool("slow", handler=slow),
        define_tool("fast", handler=lambda params: "fast done"),
        on_permission_request=permission,
        hooks={"on_pre_tool_use": hook} if where == "pre_tool_use" else {},
    )
    holder.append(session)
    await asyncio.wait_for(session.send_and_wait(ASK), 10)
    assert refusals == ["no_tool_call_in_flight"]
    assert session.context_epoch == 0
    assert roles(model, 1)[1] == ("user", ASK)
