"""End to end: `trimtab serve` driven by the official Copilot client (TCP and stdio) and by
trimtab's own remote client, with the model replayed over real HTTP.

Each scenario runs once per transport (see `conftest.TRANSPORTS`); the assertions are the
same for all of them, on what the client saw and on exactly what the model received.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.server.conftest import (
    MakeDriver,
    StartServer,
    assistant,
    call,
    conversation,
    provider,
    request_messages,
    tool,
    user,
)
from tests.server.drivers import ClearRefused, Ctx, RunFailed, ToolSpec
from trimtab.testing import ReplayServer

SYSTEM = ("system", "You are a test assistant.")


class NoArgs(BaseModel):
    pass


class TextArgs(BaseModel):
    text: str


class ClearArgs(BaseModel):
    prompt: str


async def echo(params: TextArgs, ctx: Ctx) -> str:
    return params.text.upper()


ECHO = ToolSpec("echo", TextArgs, echo, description="Upper-case the text")
ECHO_CONVERSATION = conversation(
    user("Use echo on hello"),
    assistant(None, call("call_1", "echo", text="hello")),
    tool("call_1", "HELLO"),
    assistant("The tool said HELLO."),
)


async def test_plain_reply(make_driver: MakeDriver) -> None:
    async with ReplayServer([conversation(user("Say hello"), assistant("Hello there!"))]) as model:
        session = await (await make_driver()).open(provider(model))
        assert await session.send_and_wait("Say hello") == "Hello there!"
    assert [request_messages(model, 0)] == [[SYSTEM, ("user", "Say hello")]]
    types = session.types()
    assert types[0] == "user.message" and types[-1] == "session.idle"
    for expected in ("assistant.turn_start", "assistant.message", "assistant.turn_end"):
        assert expected in types
    sent = session.of("user.message")[0]["data"]["messageId"]
    assert session.of("assistant.message")[0]["data"]["originatingMessageId"] == sent


async def test_custom_tool_runs_on_the_client(make_driver: MakeDriver) -> None:
    async with ReplayServer([ECHO_CONVERSATION]) as model:
        session = await (await make_driver()).open(provider(model), tools=[ECHO])
        assert await session.send_and_wait("Use echo on hello") == "The tool said HELLO."
    assert len(model.requests) == 2
    assert request_messages(model, 1)[-1] == ("tool", "HELLO")
    requested = session.of("external_tool.requested")[0]["data"]
    assert requested["toolName"] == "echo" and requested["arguments"] == {"text": "hello"}
    completed = session.of("external_tool.completed")[0]["data"]
    assert completed["requestId"] == requested["requestId"]
    assert session.of("tool.execution_complete")[0]["data"]["success"] is True


async def test_terminal_tool_ends_the_run(make_driver: MakeDriver) -> None:
    async def finish(params: NoArgs, ctx: Ctx) -> str:
        return "done"

    finishing = ToolSpec("finish", NoArgs, finish, is_terminal=True)
    recorded = conversation(user("Finish now"), assistant(None, call("call_1", "finish")))
    async with ReplayServer([recorded]) as model:
        session = await (await make_driver()).open(provider(model), tools=[finishing])
        # The run's last assistant message is the one that asked for the tool (spec T4).
        assert await session.send_and_wait("Finish now") == ""
    assert len(model.requests) == 1
    assert session.types().count("assistant.turn_start") == 1
    assert session.types()[-3:] == ["tool.execution_complete", "assistant.turn_end", "session.idle"]


SEED = "Reply with exactly FRESH_CONTEXT."
CLEAR_PROMPT = f'Call clear_context with prompt "{SEED}" now.'
CLEAR_CONVERSATIONS = [
    conversation(user(CLEAR_PROMPT), assistant(None, call("call_1", "clear_context", prompt=SEED))),
    conversation(user(SEED), assistant("FRESH_CONTEXT")),
]


async def clear_handler(params: ClearArgs, ctx: Ctx) -> str:
    return f"Cleared {await ctx.clear_context(params.prompt)} messages."


CLEAR = ToolSpec("clear_context", ClearArgs, clear_handler, is_terminal=True, skip_permission=False)


async def test_c8_clear_context_from_a_client_tool_runs_the_seed(make_driver: MakeDriver) -> None:
    async with ReplayServer(CLEAR_CONVERSATIONS) as model:
        session = await (await make_driver()).open(provider(model), tools=[CLEAR])
        assert await session.send_and_wait(CLEAR_PROMPT) == "FRESH_CONTEXT"
    assert len(model.requests) == 2
    assert request_messages(model, 1) == [SYSTEM, ("user", SEED)]
    cleared = session.of("session.context_cleared")[0]["data"]
    assert cleared["messagesCleared"] > 0 and cleared["initialMessage"] == SEED
    assert session.types().count("session.idle") == 1


async def test_x4_clear_context_from_an_idle_client_commits_and_runs_the_seed(
    make_driver: MakeDriver,
) -> None:
    """Outside any tool call, between runs, a client's clear is the host's (spec C1, X4):
    committed with its seed, which runs in the fresh window, with its one idle."""
    recorded = [
        conversation(user("Say hello"), assistant("Hello there!")),
        conversation(user(SEED), assistant("FRESH_CONTEXT")),
    ]
    async with ReplayServer(recorded) as model:
        session = await (await make_driver()).open(provider(model))
        assert await session.send_and_wait("Say hello") == "Hello there!"
        assert await session.clear_context(SEED) == 2
        await session.wait_for("session.idle", count=2)
    assert request_messages(model, 1) == [SYSTEM, ("user", SEED)]
    cleared = session.of("session.context_cleared")[0]["data"]
    assert cleared["messagesCleared"] == 2 and cleared["initialMessage"] == SEED
    types = session.types()
    at = types.index("session.context_cleared")
    assert types[at + 1] == "user.message" and types[-1] == "session.idle"
    assert session.of("assistant.message")[-1]["data"]["content"] == "FRESH_CONTEXT"


async def test_x4_clear_context_from_a_client_during_a_run_is_refused(
    make_driver: MakeDriver,
) -> None:
    """A client's clear while the run calls the model (no tool call to enclose it)."""
    async with ReplayServer([conversation(user("Say hello"), assistant("Hello there!"))]) as model:
        model.stall_next(1.0)  # the model answers slowly: the run is in flight meanwhile
        session = await (await make_driver()).open(provider(model))
        await session.send("Say hello")
        await session.wait_for("assistant.turn_start")
        with pytest.raises(ClearRefused) as refused:
            await session.clear_context("Start over.")
        await session.wait_for("session.idle")
    assert refused.value.code == "run_in_flight"
    assert not session.of("session.context_cleared")


async def test_c2_clear_context_with_an_empty_prompt_is_refused(make_driver: MakeDriver) -> None:
    async def clear_blank(params: ClearArgs, ctx: Ctx) -> str:
        try:
            await ctx.clear_context(params.prompt)
        except ClearRefused as exc:
            return f"refused: {exc.code}"
        return "cleared"

    recorded = conversation(
        user("Clear with a blank prompt"),
        assistant(None, call("call_1", "clear_context", prompt="  ")),
        tool("call_1", "refused: empty_prompt"),
        assistant("Nothing was cleared."),
    )
    spec = ToolSpec("clear_context", ClearArgs, clear_blank)
    async with ReplayServer([recorded]) as model:
        session = await (await make_driver()).open(provider(model), tools=[spec])
        assert await session.send_and_wait("Clear with a blank prompt") == "Nothing was cleared."
    assert not session.of("session.context_cleared")


async def test_c3_clear_context_on_a_remote_session_is_refused(
    make_driver: MakeDriver, start_server: StartServer, transport: str, tmp_path: Path
) -> None:
    store = tmp_path / "shared.db"
    tcp = transport != "official-stdio"  # a stdio client spawns its own server on `store`
    owner = start_server(store) if tcp else None  # holds the session's lease (spec R1)
    other = start_server(store) if tcp else None
    async with ReplayServer([]) as model:
        created = await (await make_driver(server=owner, store=store)).open(provider(model))
        session = await (await make_driver(server=other, store=store)).open(
            provider(model), session_id=created.session_id, resume=True
        )
        with pytest.raises(ClearRefused) as refused:
            await session.clear_context("Start over.")
    assert refused.value.code == "remote_session"


async def test_permission_approved(make_driver: MakeDriver) -> None:
    asked = ToolSpec("echo", TextArgs, echo, skip_permission=False)
    async with ReplayServer([ECHO_CONVERSATION]) as model:
        session = await (await make_driver()).open(provider(model), tools=[asked])
        assert await session.send_and_wait("Use echo on hello") == "The tool said HELLO."
    request = session.of("permission.requested")[0]["data"]
    assert request["permissionRequest"]["kind"] == "custom-tool"
    assert request["permissionRequest"]["toolName"] == "echo"
    completed = session.of("permission.completed")[0]["data"]
    assert completed["requestId"] == request["requestId"]
    assert completed["result"]["kind"] == "approved"


async def test_o2_permission_rejected_ends_the_run(make_driver: MakeDriver) -> None:
    ran: list[str] = []

    async def recording_echo(params: TextArgs, ctx: Ctx) -> str:
        ran.append(params.text)
        return params.text

    asked = ToolSpec("echo", TextArgs, recording_echo, skip_permission=False)
    recorded = conversation(
        user("Use echo on hello"), assistant(None, call("c1", "echo", text="hi"))
    )
    async with ReplayServer([recorded]) as model:
        session = await (await make_driver()).open(
            provider(model), tools=[asked], permission="reject"
        )
        assert await session.send_and_wait("Use echo on hello") == ""
    assert ran == [] and len(model.requests) == 1
    completed = session.of("permission.completed")[0]["data"]
    assert completed["result"]["kind"] == "denied-interactively-by-user"
    outcome = session.of("tool.execution_complete")[0]["data"]
    assert outcome["success"] is False and "rejected" in outcome["error"]["message"]
    assert not session.of("external_tool.requested")


async def test_tool_handler_exception_is_hidden_from_the_model(make_driver: MakeDriver) -> None:
    async def locate(params: NoArgs, ctx: Ctx) -> str:
        raise RuntimeError("Melbourne")

    failing = ToolSpec("get_user_location", NoArgs, locate)
    asked = (user("Where am I?"), assistant(None, call("c1", "get_user_location")))
    # The official runtime's text for a client-reported error, and trimtab's in-process one
    # (the remote client runs the handler with trimtab's own tool machinery).
    texts = [
        "Failed to execute `get_user_location` tool with arguments: {} due to error: "
        "Error: Tool execution failed",
        "Failed to execute 'get_user_location': tool execution failed.",
    ]
    recorded = [
        conversation(*asked, tool("c1", text), assistant("Your location is unknown."))
        for text in texts
    ]
    async with ReplayServer(recorded) as model:
        session = await (await make_driver()).open(provider(model), tools=[failing])
        assert await session.send_and_wait("Where am I?") == "Your location is unknown."
    assert "Melbourne" not in json.dumps(model.requests)
    assert session.of("tool.execution_complete")[0]["data"]["success"] is False


async def test_abort_cancels_the_client_tool_and_keeps_the_session(make_driver: MakeDriver) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def wait_forever(params: NoArgs, ctx: Ctx) -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    waiting = ToolSpec("wait_forever", NoArgs, wait_forever)
    recorded = conversation(
        user("Wait forever"),
        assistant(None, call("c1", "wait_forever")),
        tool("c1", "The execution of this tool, or a previous tool was interrupted."),
        user("Are you there?"),
        assistant("Yes, still here."),
    )
    async with ReplayServer([recorded]) as model:
        session = await (await make_driver()).open(provider(model), tools=[waiting])
        await session.send("Wait forever")
        await asyncio.wait_for(started.wait(), 15)
        await session.abort()
        await session.wait_for("session.idle")
        await asyncio.wait_for(cancelled.wait(), 15)
        assert session.of("session.idle")[0]["data"]["aborted"] is True
        assert {"abort", "external_tool.completed"} <= set(session.types())
        assert session.of("tool.execution_complete")[0]["data"]["error"]["code"] == "cancelled"
        assert await session.send_and_wait("Are you there?") == "Yes, still here."


async def test_p1_resume_after_a_server_restart(
    make_driver: MakeDriver, start_server: StartServer, transport: str, tmp_path: Path
) -> None:
    store = tmp_path / "restart.db"
    recorded = conversation(
        user("Remember the number 42."),
        assistant("I will remember 42."),
        user("Which number?"),
        assistant("42."),
    )
    async with ReplayServer([recorded]) as model:
        first = start_server(store) if transport != "official-stdio" else None
        driver = await make_driver(server=first, store=store)
        session = await driver.open(provider(model))
        assert await session.send_and_wait("Remember the number 42.") == "I will remember 42."
        await driver.stop()  # detaches: the lease is released
        if first is not None:
            assert first.stop() == 0
        second = start_server(store) if transport != "official-stdio" else None
        driver = await make_driver(server=second, store=store)
        resumed = await driver.open(provider(model), session_id=session.session_id, resume=True)
        assert await resumed.send_and_wait("Which number?") == "42."
    assert request_messages(model, 1) == [
        SYSTEM,
        ("user", "Remember the number 42."),
        ("assistant", "I will remember 42."),
        ("user", "Which number?"),
    ]


async def test_two_clients_share_one_session(make_driver: MakeDriver, transport: str) -> None:
    if transport == "official-stdio":
        pytest.skip("a stdio server has exactly one client")
    followup = conversation(
        *ECHO_CONVERSATION.model_dump()["messages"],
        user("Thanks"),
        assistant("You are welcome."),
    )
    async with ReplayServer([followup]) as model:
        owner = await (await make_driver()).open(provider(model), tools=[ECHO])
        # The second client brings no tools: the first client's tool stays (protocol 3.2).
        guest = await (await make_driver()).open(
            provider(model), session_id=owner.session_id, resume=True
        )
        assert await guest.send_and_wait("Use echo on hello") == "The tool said HELLO."
        assert owner.of("external_tool.completed") and guest.of("external_tool.requested")
        await guest.disconnect()
        assert await owner.send_and_wait("Thanks") == "You are welcome."
    assert guest.of("session.idle") and len(owner.of("session.idle")) == 2


async def test_e1_a_provider_error_fails_send_and_wait(make_driver: MakeDriver) -> None:
    recorded = conversation(user("Say hello"), user("Say hello"), assistant("Hello there!"))
    async with ReplayServer([recorded]) as model:
        session = await (await make_driver()).open(provider(model))
        model.fail_next(400)  # not retried: the run ends in session.error
        with pytest.raises(RunFailed, match="Session error"):
            await session.send_and_wait("Say hello")
        await session.wait_for("session.idle")
        # The user message stays and the session goes on (spec section 4).
        assert await session.send_and_wait("Say hello") == "Hello there!"
    assert session.types().count("session.error") == 1
    assert request_messages(model, 1) == [SYSTEM, ("user", "Say hello"), ("user", "Say hello")]


async def test_logged_events_parse_and_chain(make_driver: MakeDriver) -> None:
    async with ReplayServer([ECHO_CONVERSATION]) as model:
        session = await (await make_driver()).open(provider(model), tools=[ECHO])
        await session.send_and_wait("Use echo on hello")
        logged = await session.logged()
    parents = [event.get("parentId") for event in logged]
    assert parents == [None, *(event["id"] for event in logged[:-1])]
    live = [event["id"] for event in session.events if not event.get("ephemeral")]
    assert live == [event["id"] for event in logged if event["type"] != "session.start"]
