"""Spec section 4 (events E1-E3) and the session's own behaviour: queueing, abort, errors."""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any

import pytest

from tests.conftest import Recorder, echo_tool, open_session, roles
from trimtab import Client, ProviderError, SessionError, ToolInvocation, define_tool
from trimtab._window import IMAGE_TOKENS
from trimtab.events import Image, UserMessageEvent, new_id
from trimtab.testing import ScriptedModel, tool_call


async def test_plain_reply_event_order(client: Client) -> None:
    model = ScriptedModel(["hello"])
    session = await open_session(client, model)
    rec = Recorder(session)
    reply = await session.send_and_wait("hi")
    assert reply is not None and reply.data.content == "hello"
    assert rec.types == [
        "user.message",
        "assistant.turn_start",
        "assistant.message",
        "assistant.usage",
        "session.usage_info",
        "assistant.turn_end",
        "session.idle",
    ]
    model.assert_done()


async def test_e1_one_idle_per_run_always_last(client: Client) -> None:
    model = ScriptedModel([tool_call("echo", {"text": "a"}), "one", "two"])
    session = await open_session(client, model, echo_tool())
    rec = Recorder(session)
    await session.send_and_wait("first")
    assert rec.types.count("session.idle") == 1 and rec.types[-1] == "session.idle"
    await session.send_and_wait("second")
    assert rec.types.count("session.idle") == 2 and rec.types[-1] == "session.idle"


async def test_e1_provider_failure_is_an_error_then_idle_and_loses_nothing(client: Client) -> None:
    failure = ProviderError("rate_limit", "slow down", status_code=429, retryable=True)
    model = ScriptedModel([failure, "recovered"])
    session = await open_session(client, model)
    rec = Recorder(session)
    with pytest.raises(SessionError) as err:
        await session.send_and_wait("hello?")
    assert err.value.error_type == "rate_limit" and err.value.status_code == 429
    assert rec.types[-2:] == ["session.error", "session.idle"]
    error = rec.of("session.error")[0].data
    assert (error.error_type, error.status_code, error.retryable) == ("rate_limit", 429, True)
    reply = await session.send_and_wait("again")
    assert reply is not None and reply.data.content == "recovered"
    assert roles(model, 1) == [("system", "SYSTEM"), ("user", "hello?"), ("user", "again")]


async def test_e1_a_provider_bug_is_an_internal_error_not_a_crash(client: Client) -> None:
    def broken(request: Any) -> str:
        raise KeyError("oops")

    session = await open_session(client, ScriptedModel([broken, "fine"]))
    with pytest.raises(SessionError) as err:
        await session.send_and_wait("x")
    assert err.value.error_type == "internal"
    assert (await session.send_and_wait("y")) is not None


async def test_e2_idle_and_deltas_are_live_only(client: Client) -> None:
    model = ScriptedModel(["a fairly long streamed answer"], chunk_size=5)
    session = await open_session(client, model, streaming=True)
    rec = Recorder(session)
    await session.send_and_wait("stream please")
    deltas = rec.of("assistant.message_delta")
    assert "".join(d.data.delta_content for d in deltas) == "a fairly long streamed answer"
    assert all(d.ephemeral for d in deltas) and rec.of("session.idle")[0].ephemeral
    persisted = {e.type for e in await session.get_events()}
    assert "assistant.message_delta" not in persisted and "session.idle" not in persisted
    assert model.requests[0].stream


async def test_e3_total_order_uuid_ids_and_parent_chain(client: Client) -> None:
    model = ScriptedModel([tool_call("echo", {"text": "a"}), "done"])
    session = await open_session(client, model, echo_tool())
    await session.send_and_wait("go")
    events = await session.get_events()
    assert events[0].type == "session.start" and events[0].parent_id is None
    for before, after in zip(events, events[1:], strict=False):
        assert after.parent_id == before.id
        assert after.timestamp >= before.timestamp
    assert all(uuid.UUID(e.id).version == 4 for e in events)
    assert len({e.id for e in events}) == len(events)


async def test_wire_shape_is_camel_case(client: Client) -> None:
    session = await open_session(client, ScriptedModel(["x"]))
    message_id = await session.send("hi")
    await asyncio.sleep(0.05)
    user = next(e for e in await session.get_events() if e.type == "user.message")
    wire = user.model_dump(by_alias=True, mode="json")
    assert wire["data"]["messageId"] == message_id and "parentId" in wire and "contextEpoch" in wire


async def test_sends_during_a_run_are_queued_in_order(client: Client) -> None:
    gate = asyncio.Event()

    async def wait(params: Any) -> str:
        await gate.wait()
        return "released"

    model = ScriptedModel([tool_call("wait"), "first done", "second done", "third done"])
    session = await open_session(client, model, define_tool("wait", handler=wait))
    rec = Recorder(session)
    first = asyncio.create_task(session.send_and_wait("first"))
    await rec.wait_for("tool.execution_start")
    await session.send("second")
    await session.send("third")
    assert [e.data.content for e in rec.of("user.message")] == ["first"]
    gate.set()
    assert (await first) is not None
    await rec.wait_for("session.idle", 3)
    assert [e.data.content for e in rec.of("user.message")] == ["first", "second", "third"]
    assert [e.data.content for e in rec.of("assistant.message")][-2:] == [
        "second done",
        "third done",
    ]


async def test_abort_cancels_the_running_handler_and_the_session_lives_on(client: Client) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def long(params: Any) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    model = ScriptedModel([tool_call("long"), "after abort"])
    session = await open_session(client, model, define_tool("long", handler=long))
    rec = Recorder(session)
    run = asyncio.create_task(session.send_and_wait("go"))
    await asyncio.wait_for(started.wait(), 5)
    await session.abort()
    assert (await run) is not None  # the tool-requesting message
    assert cancelled.is_set()
    assert rec.of("tool.execution_complete")[0].data.outcome == "cancelled"
    assert rec.types[-2:] == ["abort", "session.idle"]
    assert rec.of("session.idle")[0].data.aborted is True
    reply = await session.send_and_wait("still there?")
    assert reply is not None and reply.data.content == "after abort"
    assert roles(model, 1)[-2] == (
        "tool",
        "The execution of this tool, or a previous tool was interrupted.",
    )


async def test_abort_during_the_model_call(client: Client) -> None:
    called = asyncio.Event()

    async def never(request: Any) -> str:
        called.set()
        await asyncio.Event().wait()
        return "never"

    session = await open_session(client, ScriptedModel([never]))
    rec = Recorder(session)
    run = asyncio.create_task(session.send_and_wait("go"))
    await called.wait()  # the model call is in progress
    await session.abort()
    assert (await run) is None
    assert rec.types[-3:] == ["assistant.turn_end", "abort", "session.idle"]


async def test_send_and_wait_timeout_leaves_the_run_going(client: Client) -> None:
    gate = asyncio.Event()

    async def slow(request: Any) -> str:
        await gate.wait()
        return "late"

    session = await open_session(client, ScriptedModel([slow]))
    rec = Recorder(session)
    with pytest.raises(TimeoutError):
        await session.send_and_wait("go", timeout=0.05)
    gate.set()
    await rec.wait_for("session.idle")
    assert rec.of("assistant.message")[0].data.content == "late"


async def test_waits_that_time_out_or_overlap_each_get_their_own_run(client: Client) -> None:
    """The run ledger follows events only while someone waits (an idle session keeps none):
    a wait given up on, one queued behind it and a later one each still get their run."""
    gate = asyncio.Event()

    async def slow(request: Any) -> str:
        await gate.wait()
        return "first"

    session = await open_session(client, ScriptedModel([slow, "second", "third"]))
    with pytest.raises(TimeoutError):
        await session.send_and_wait("1", timeout=0.05)
    second = asyncio.create_task(session.send_and_wait("2"))
    await asyncio.sleep(0)
    gate.set()
    reply = await asyncio.wait_for(second, 10)
    assert reply is not None and reply.data.content == "second"
    third = await asyncio.wait_for(session.send_and_wait("3"), 10)
    assert third is not None and third.data.content == "third"


async def test_event_handlers_by_type_and_unsubscribe(client: Client) -> None:
    session = await open_session(client, ScriptedModel(["a", "b"]))
    seen: list[str] = []
    stop = session.on("assistant.message", lambda e: seen.append(e.type))
    session.on(lambda e: 1 / 0)  # a broken subscriber does not break the run
    await session.send_and_wait("1")
    stop()
    await session.send_and_wait("2")
    assert seen == ["assistant.message"]
    with pytest.raises(TypeError):
        session.on(print_async)


async def print_async(event: Any) -> None:
    pass


@pytest.mark.parametrize("prompt", ["", "  ", None, 3])
async def test_send_rejects_bad_prompts_and_logs_nothing(client: Client, prompt: Any) -> None:
    session = await open_session(client, ScriptedModel())
    before = await session.get_events()
    with pytest.raises(ValueError, match="non-empty string"):
        await session.send(prompt)
    assert await session.get_events() == before


async def test_invocation_carries_ids_and_session(client: Client) -> None:
    seen: list[ToolInvocation] = []
    tool = define_tool("probe", handler=lambda p, inv: seen.append(inv))
    model = ScriptedModel([tool_call("probe", {"a": 1}, id="call_x"), "ok"])
    session = await open_session(client, model, tool)
    await session.send_and_wait("go")
    invocation = seen[0]
    assert (invocation.session_id, invocation.tool_call_id, invocation.tool_name) == (
        session.session_id,
        "call_x",
        "probe",
    )
    assert invocation.arguments == {"a": 1} and invocation.session is session


async def test_disconnect_aborts_and_releases(client: Client) -> None:
    called = asyncio.Event()

    async def never(request: Any) -> str:
        called.set()
        await asyncio.Event().wait()
        return "never"

    session = await open_session(client, ScriptedModel([never]))
    await session.send("go")
    await called.wait()  # the model call is in progress
    await session.disconnect()
    with pytest.raises(Exception, match="disconnected"):
        await session.send("more")
    assert session.session_id in {r.session_id for r in await client.list_sessions()}


async def test_deltas_carry_the_id_of_their_assistant_message(client: Client) -> None:
    session = await open_session(
        client, ScriptedModel(["streamed words"], chunk_size=4), streaming=True
    )
    rec = Recorder(session)
    await session.send_and_wait("go")
    message_id = rec.of("assistant.message")[0].data.message_id
    assert {d.data.message_id for d in rec.of("assistant.message_delta")} == {message_id}


async def test_lone_surrogates_never_break_a_run(client: Client) -> None:
    bad = "broken \udc80 text"
    model = ScriptedModel([tool_call("probe"), bad])
    session = await open_session(client, model, define_tool("probe", handler=lambda p: bad))
    with pytest.raises(ValueError, match="lone surrogate"):
        await session.send(bad)
    reply = await session.send_and_wait("go")
    assert reply is not None and reply.data.content == "broken ? text"
    assert roles(model, 1)[-1] == ("tool", "broken ? text")


async def test_D10_user_prompt_transformed_sees_and_replaces_the_transformed_prompt(
    client: Client,
) -> None:
    seen: list[dict[str, Any]] = []

    def transformed(data: dict[str, Any], invocation: dict[str, str]) -> dict[str, Any]:
        seen.append(data)
        return {"modifiedTransformedPrompt": data["transformedPrompt"] + " (checked)"}

    hooks: Any = {
        "on_user_prompt_submitted": lambda data, invocation: {"modifiedPrompt": "Say hi"},
        "on_user_prompt_transformed": transformed,
    }
    model = ScriptedModel(["hi"])
    session = await open_session(client, model, hooks=hooks)
    await session.send_and_wait("Say hello")
    assert [(d["prompt"], d["transformedPrompt"]) for d in seen] == [("Say hello", "Say hi")]
    assert seen[0]["workingDirectory"] and seen[0]["sessionId"] == session.session_id
    assert roles(model, 0)[-1] == ("user", "Say hi (checked)")


async def test_D10_an_agent_stop_hook_that_blocks_makes_the_run_go_on(client: Client) -> None:
    seen: list[bool] = []

    def agent_stop(data: dict[str, Any], invocation: dict[str, str]) -> dict[str, Any] | None:
        seen.append(data["stopHookActive"])
        return None if data["stopHookActive"] else {"decision": "block", "reason": "Check again"}

    model = ScriptedModel(["first", "second"])
    session = await open_session(client, model, hooks={"on_agent_stop": agent_stop})
    reply = await session.send_and_wait("Go")
    assert reply is not None and reply.data.content == "second"
    assert seen == [False, True]
    assert roles(model, 1)[-3:] == [("user", "Go"), ("assistant", "first"), ("user", "Check again")]
    events = await session.get_events()
    [again] = [e for e in events if e.type == "user.message" and e.data.source == "agent_stop"]
    assert again.data.message_id == reply.data.originating_message_id


async def test_D13_session_start_context_is_in_the_window_and_kept_on_resume(
    client: Client,
) -> None:
    answers = iter(["Project uses Vitest.", None, "Now it uses pytest.", "  "])
    sources: list[str] = []

    def start(data: dict[str, Any], invocation: dict[str, str]) -> dict[str, Any]:
        sources.append(data["source"])
        answer = next(answers)
        return {} if answer is None else {"additionalContext": answer}

    model = ScriptedModel(["one", "two", "three", "four"])
    session = await open_session(client, model, hooks={"on_session_start": start})
    await session.send_and_wait("Go")
    assert roles(model, 0) == [
        ("system", "SYSTEM"),
        ("user", "Project uses Vitest."),
        ("user", "Go"),
    ]
    # Resumed three times: the hook answers nothing (kept), another context (replaced),
    # a blank one (removed).
    for context in ("Project uses Vitest.", "Now it uses pytest.", None):
        await session.disconnect()
        session = await client.resume_session(
            session.session_id, provider=model, hooks={"on_session_start": start}
        )
        await session.send_and_wait("Again")
        head = [("system", "SYSTEM"), *([("user", context)] if context else [])]
        assert roles(model, len(model.requests) - 1)[: len(head)] == head
        assert session.config.start_context == context
    assert sources == ["new", "resume", "resume", "resume"]


async def test_D13_tool_hooks_suppress_output_and_add_context(client: Client) -> None:
    def pre(data: dict[str, Any], invocation: dict[str, str]) -> dict[str, Any]:
        return {"suppressOutput": True, "additionalContext": "Mind the quotes."}

    def failed(data: dict[str, Any], invocation: dict[str, str]) -> dict[str, Any]:
        return {"additionalContext": "Try another tool."}

    hooks: Any = {"on_pre_tool_use": pre, "on_post_tool_use_failure": failed}
    model = ScriptedModel([tool_call("echo", {"text": "secret"}, id="c1"), "done"])
    session = await open_session(client, model, echo_tool(), hooks=hooks)
    rec = Recorder(session)
    reply = await session.send_and_wait("Echo")
    assert reply is not None and reply.data.content == "done"
    assert roles(model, 1)[-3:] == [
        ("assistant", ""),
        ("tool", "The output of this tool call was suppressed by a hook."),
        (
            "user",
            'Tool "echo" was called. Additional context from preToolUse hooks:\nMind the quotes.',
        ),
    ]
    [note] = [e for e in rec.of("user.message") if e.data.source == "hook"]
    assert rec.types.count("session.idle") == 1 and rec.types[-1] == "session.idle"
    assert (await session.metrics()).user_requests == 1

    # A failed call: the failure hook's guidance, in the reference runtime's words.
    def boom(params: Any) -> str:
        raise RuntimeError("boom")

    model2 = ScriptedModel([tool_call("boom", {}, id="c2"), "ok"])
    tool = define_tool("boom", description="Fails", handler=boom)
    other = await open_session(client, model2, tool, hooks={"on_post_tool_use_failure": failed})
    await other.send_and_wait("Call it")
    assert roles(model2, 1)[-1] == (
        "user",
        'Tool "boom" failed. Additional guidance from postToolUseFailure hooks:\nTry another tool.',
    )
    assert note.data.message_id is None


async def test_D13_the_failure_hook_is_asked_for_calls_that_cannot_be_made(client: Client) -> None:
    asked: list[tuple[str, Any, str]] = []

    def failed(data: dict[str, Any], invocation: dict[str, str]) -> dict[str, Any]:
        asked.append((data["toolName"], data["toolArgs"], data["error"]))
        return {"additionalContext": f"Not {data['toolName']}."}

    model = ScriptedModel(
        [
            [tool_call("nope", {}, id="c1"), tool_call("echo", {"txt": 1}, id="c2")],
            "done",
        ]
    )
    session = await open_session(
        client, model, echo_tool(), hooks={"on_post_tool_use_failure": failed}
    )
    await session.send_and_wait("Go")
    assert [(name, args) for name, args, _ in asked] == [("nope", {}), ("echo", {"txt": 1})]
    assert "does not exist" in asked[0][2]
    hook_notes = [content for role, content in roles(model, 1) if role == "user"][-2:]
    assert [note.splitlines()[-1] for note in hook_notes] == ["Not nope.", "Not echo."]


async def test_D13_user_prompt_submitted_context_follows_the_prompt(client: Client) -> None:
    hooks: Any = {
        "on_user_prompt_submitted": lambda data, i: {"additionalContext": "User prefers brevity."}
    }
    model = ScriptedModel(["hi"])
    session = await open_session(client, model, hooks=hooks)
    await session.send_and_wait("Say hello")
    assert roles(model, 0)[-1] == ("user", "Say hello\n\nUser prefers brevity.")


PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(8)).decode()


async def test_D14_images_are_stored_with_the_message_and_kept_in_the_window(
    client: Client,
) -> None:
    gate = asyncio.Event()

    async def slow(request: Any) -> str:
        await gate.wait()
        return "first"

    model = ScriptedModel([slow, "second"])
    session = await open_session(client, model)
    await session.send("Plain")
    # Queued behind the run: its image is held until its message is stored.
    queued = await session.send("Look", images=[{"mime_type": "image/jpeg", "data": PNG}])
    gate.set()
    await session.wait_idle()
    assert [m.images for m in model.requests[1].messages if m.role == "user"] == [
        (),
        (Image(mime_type="image/jpeg", data=PNG),),
    ]
    with pytest.raises(ValueError, match="invalid image"):
        await session.send("Bad", images=[{"mime_type": "image/svg+xml", "data": PNG}])
    with pytest.raises(ValueError, match="not base64"):
        await session.send("Bad", images=[{"mime_type": "image/png", "data": "%%%"}])
    before = len(await session.get_events())
    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=model)
    [looked] = [m for m in resumed.window() if m.images]
    assert looked.content == "Look" and looked.images[0].mime_type == "image/jpeg"
    events = await resumed.get_events()
    assert [e.data.message_id for e in events if e.type == "user.message"][-1] == queued
    assert len(events) == before + 1  # the resume; the refused sends stored nothing
    context = resumed.get_context()
    assert context.messages[-2].tokens >= IMAGE_TOKENS


async def test_D5_offered_tools_are_callable_from_the_next_turn_until_withdrawn(
    client: Client,
) -> None:
    model = ScriptedModel([tool_call("shout", {"text": "hi"}, id="s1"), "done", "again"])
    session = await open_session(client, model, echo_tool())
    shout = define_tool("shout", description="Shout", handler=lambda p: "HI")
    echo_twin = define_tool("echo", description="Not the session's own", handler=lambda p: "?")
    session.offer_tools([shout, echo_twin])
    await session.send_and_wait("Shout")
    assert [t.name for t in model.requests[0].tools] == ["echo", "shout"]
    assert roles(model, 1)[-1] == ("tool", "HI")
    assert session.tools["echo"].definition.description == "Echo text"  # its own wins
    session.offer_tools([])
    await session.send_and_wait("Again")
    assert [t.name for t in model.requests[2].tools] == ["echo"]
    assert "shout" not in [t.name for t in session.config.tools]  # never logged


async def test_D9_request_headers_reach_the_provider_over_http(client: Client) -> None:
    from trimtab.testing import Conversation, ConversationMessage, ReplayServer

    hello = Conversation(
        messages=[
            ConversationMessage(role="user", content="Say hello"),
            ConversationMessage(role="assistant", content="Hello!"),
        ]
    )
    async with ReplayServer([hello]) as model:
        byok = {"type": "openai", "base_url": model.base_url, "api_key": "k"}
        session = await client.create_session(provider=byok)
        refused = [
            ({"X-Bad": "a\r\nb"}, "cannot carry"),
            ({"X Bad": "1"}, "cannot carry"),  # not a token: h11 would refuse it mid-run
            ({"X-Bad": "caf\u00e9"}, "cannot carry"),  # not ASCII: the client cannot encode it
            ({"Host": "other.example"}, "the HTTP client's to set"),  # the key to another host
            ({"content-length": "5"}, "the HTTP client's to set"),
            ({"Transfer-Encoding": "chunked"}, "the HTTP client's to set"),
        ]
        for headers, message in refused:
            with pytest.raises(ValueError, match=message):
                await session.send_and_wait("Say hello", request_headers=headers)
        assert model.received == []  # nothing was sent
        await session.send_and_wait("Say hello", request_headers={"X-Trace": "a\tbc"})
    assert model.received[0].headers["x-trace"] == "a\tbc"
    assert model.received[0].headers["host"].startswith("127.0.0.1:")


def test_event_ids_are_distinct_uuid4s() -> None:
    # The Copilot clients parse every event id as a UUID (spec E3's ids).
    ids = [new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


async def test_D14_send_and_wait_takes_what_send_takes(client: Client) -> None:
    model = ScriptedModel(["Seen."])
    session = await open_session(client, model)
    image = Image(mime_type="image/png", data=PNG)
    reply = await session.send_and_wait(
        "Look", images=[image], attachments=[{"type": "note", "text": "from the editor"}]
    )
    assert reply is not None and reply.data.content == "Seen."
    [message] = [e for e in await session.get_events() if isinstance(e, UserMessageEvent)]
    assert message.data.attachments == [{"type": "note", "text": "from the editor"}]
    assert model.requests[0].messages[-1].images == (image,)


async def test_e4_an_abort_ends_the_calls_in_flight_in_the_order_asked(client: Client) -> None:
    # Running in the reverse order: an asyncio task group would cancel them in the order of
    # its set of tasks, which follows their addresses and so differs from one process to the
    # next (and so did the log).
    count = 8
    running = [asyncio.Event() for _ in range(count)]
    order: list[str] = []

    async def hang(params: Any, invocation: ToolInvocation) -> str:
        index = int(invocation.tool_call_id[1:])
        if index + 1 < count:
            await running[index + 1].wait()
        order.append(invocation.tool_call_id)
        running[index].set()
        await asyncio.Event().wait()
        return "never"

    calls = [tool_call("hang", id=f"c{i}") for i in range(count)]
    session = await open_session(client, ScriptedModel([calls]), define_tool("hang", handler=hang))
    rec = Recorder(session)
    await session.send("go")
    await asyncio.wait_for(running[0].wait(), 10)
    await session.abort()
    asked = [f"c{i}" for i in range(count)]
    assert order == asked[::-1]
    assert [e.data.tool_call_id for e in rec.of("tool.execution_complete")] == asked
    stored = await session.get_events()
    assert [e.data.tool_call_id for e in stored if e.type == "tool.execution_complete"] == asked
