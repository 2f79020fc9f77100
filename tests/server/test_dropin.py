"""Copilot drop-in behaviour (spec "Copilot drop-in behaviour", D rules): what programs written
for the reference runtime rely on, checked through the official client against a real
`trimtab serve` subprocess."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from copilot import CopilotClient, RuntimeConnection
from copilot.generated.rpc import (
    ModelSetReasoningEffortRequest,
    ModelSwitchToRequest,
    PermissionDecisionReject,
    PermissionDecisionUserNotAvailable,
    SessionsForkRequest,
)
from copilot.rpc import HandlePendingToolCallRequest
from copilot.session import PermissionHandler
from copilot.tools import ToolResult, define_tool
from pydantic import BaseModel

import trimtab
from tests.server.conftest import (
    ServerProcess,
    StartServer,
    assistant,
    call,
    conversation,
    provider,
    tool,
    user,
)
from trimtab.server.attachments import MAX_TEXT_BYTES
from trimtab.server.prompt import DEFAULT_SECTIONS
from trimtab.testing import ReplayServer

DEFAULT = "\n\n".join(DEFAULT_SECTIONS.values())
HELLO = conversation(user("Say hello"), assistant("Hello!"))


@pytest.fixture
async def official(shared_server: ServerProcess) -> AsyncIterator[CopilotClient]:
    client = CopilotClient(connection=shared_server.connection())
    await client.start()
    yield client
    await client.force_stop()


@pytest.fixture
async def model() -> AsyncIterator[ReplayServer]:
    async with ReplayServer([HELLO]) as replay:
        yield replay


def system_sent(model: ReplayServer, index: int = 0) -> str | None:
    """The system message of the model's request number `index`, if it had one."""
    messages = model.requests[index]["messages"]
    found = [m["content"] for m in messages if m["role"] == "system"]
    assert len(found) <= 1, found
    return found[0] if found else None


async def say_hello(client: CopilotClient, model: ReplayServer, **options: Any) -> str | None:
    session = await client.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        on_permission_request=PermissionHandler.approve_all,
        **options,
    )
    reply = await session.send_and_wait("Say hello", timeout=30)
    assert reply is not None and reply.data.content == "Hello!"  # type: ignore[union-attr]
    await session.disconnect()
    return system_sent(model)


# --- D1, D2: the system message ------------------------------------------------------------


async def test_D1_a_session_without_system_message_sends_the_default(
    official: CopilotClient, model: ReplayServer
) -> None:
    assert await say_hello(official, model) == DEFAULT
    assert "trimtab" in DEFAULT and len(DEFAULT) < 600  # short, and says what runs it


async def test_D1_append_adds_to_the_default(official: CopilotClient, model: ReplayServer) -> None:
    suffix = "End each answer with 'Have a nice day!'"
    sent = await say_hello(official, model, system_message={"mode": "append", "content": suffix})
    assert sent == f"{DEFAULT}\n\n{suffix}"


async def test_D1_replace_replaces_the_default(
    official: CopilotClient, model: ReplayServer
) -> None:
    mine = "You are Testy. Reply succinctly."
    sent = await say_hello(official, model, system_message={"mode": "replace", "content": mine})
    assert sent == mine


async def test_D2_customize_edits_sections_and_appends_content(
    official: CopilotClient, model: ReplayServer
) -> None:
    customized = {
        "mode": "customize",
        "sections": {
            "tone": {"action": "replace", "content": "Be warm and thorough."},
            "tool_efficiency": {"action": "remove"},
            "identity": {"action": "prepend", "content": "FIRST."},
            "safety": {"action": "append", "content": "Never share secrets."},
            "code_change_rules": {"action": "remove"},  # a section trimtab has not: no-op
        },
        "content": "Mention quarterly earnings.",
    }
    sent = await say_hello(official, model, system_message=customized)
    assert sent == "\n\n".join(
        [
            "FIRST.",
            DEFAULT_SECTIONS["identity"],
            "Be warm and thorough.",
            "Never share secrets.",
            "Mention quarterly earnings.",
        ]
    )


async def test_D2_removing_the_identity_group_keeps_what_is_preserved(
    official: CopilotClient, model: ReplayServer
) -> None:
    customized = {
        "mode": "customize",
        "sections": {"identity": {"action": "remove"}, "tone": {"action": "preserve"}},
    }
    assert await say_hello(official, model, system_message=customized) == DEFAULT_SECTIONS["tone"]


async def test_D2_a_transform_section_is_rewritten_by_the_client(
    official: CopilotClient, model: ReplayServer
) -> None:
    seen: list[str] = []

    async def shout(content: str) -> str:
        seen.append(content)
        return content.upper()

    customized = {"mode": "customize", "sections": {"tone": {"action": shout}}}
    sent = await say_hello(official, model, system_message=customized)
    assert seen == [DEFAULT_SECTIONS["tone"]]
    assert sent is not None and DEFAULT_SECTIONS["tone"].upper() in sent
    assert DEFAULT_SECTIONS["identity"] in sent


async def test_D2_an_unknown_action_is_refused_before_anything_is_created(
    official: CopilotClient, model: ReplayServer
) -> None:
    customized = {"mode": "customize", "sections": {"tone": {"action": "shuffle"}}}
    with pytest.raises(Exception, match="action"):
        await official.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            on_permission_request=PermissionHandler.approve_all,
            system_message=customized,  # type: ignore[arg-type]
        )
    assert model.requests == []


async def test_D1_resume_keeps_the_system_message_unless_given_a_new_one(
    official: CopilotClient, shared_server: ServerProcess
) -> None:
    again = conversation(user("Say hello"), assistant("Hello!"), user("Again"), assistant("Hi!"))
    async with ReplayServer([again]) as model:
        first: Any = {"mode": "replace", "content": "FIRST"}
        options: dict[str, Any] = {
            "provider": provider(model),
            "on_permission_request": PermissionHandler.approve_all,
        }
        session = await official.create_session(system_message=first, **options)
        await session.send_and_wait("Say hello", timeout=30)
        await session.disconnect()
        resumed = await official.resume_session(session.session_id, **options)
        await resumed.send_and_wait("Again", timeout=30)
        await resumed.disconnect()
        assert [system_sent(model, i) for i in (0, 1)] == ["FIRST", "FIRST"]

        second: Any = {"mode": "append", "content": "SECOND"}
        resumed = await official.resume_session(
            session.session_id, system_message=second, **options
        )
        # Recorded answers end after "Again": the request itself is what is checked.
        with pytest.raises(Exception):  # noqa: B017 - the replay has no answer for it
            await resumed.send_and_wait("And again", timeout=30)
        await resumed.disconnect()
        assert system_sent(model, 2) == f"{DEFAULT}\n\nSECOND"


async def test_D1_trimtab_remote_sessions_have_no_default(
    shared_server: ServerProcess, model: ReplayServer
) -> None:
    # trimtab's own client behaves as in-process sessions do: no system message unless given.
    async with shared_server.remote() as client:
        session = await client.create_session(provider=provider(model))
        reply = await session.send_and_wait("Say hello", timeout=30)
        assert reply is not None and reply.data.content == "Hello!"
        await session.disconnect()
    assert system_sent(model) is None


# --- D4: failures a client reports ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--bogus-flag"], "No such option '--bogus-flag'"),
        (["--store", "{bad}"], "cannot open the session store: file is not a database"),
    ],
)
async def test_D4_a_server_that_cannot_start_fails_the_clients_start(
    stdio_executable: Path, tmp_path: Path, args: list[str], reason: str
) -> None:
    bad = tmp_path / "not-a-database.db"
    bad.write_text("this is no SQLite file\n")
    args = [str(bad) if a == "{bad}" else a for a in args]
    connection = RuntimeConnection.for_stdio(path=str(stdio_executable), args=args)
    client = CopilotClient(connection=connection, log_level="none")
    with pytest.raises(RuntimeError, match="process exited") as caught:
        await asyncio.wait_for(client.start(), 60)
    assert reason in str(caught.value)
    await client.force_stop()


async def test_D4_unknown_sessions_are_session_not_found(
    official: CopilotClient, model: ReplayServer
) -> None:
    session = await official.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        on_permission_request=PermissionHandler.approve_all,
    )
    await session.disconnect()
    with pytest.raises(Exception, match=f"Session not found: {session.session_id}"):
        await session.get_events()
    with pytest.raises(Exception, match="Session not found: no-such-session"):
        await official.resume_session(
            "no-such-session", on_permission_request=PermissionHandler.approve_all
        )
    with pytest.raises(Exception, match="Failed to delete session no-such-session"):
        await official.delete_session("no-such-session")


# --- D5: resume ----------------------------------------------------------------------------


def resumes(events: list[Any]) -> list[bool | None]:
    """`continuePendingWork` of each `session.resume` event."""
    return [e.data.continue_pending_work for e in events if e.type.value == "session.resume"]


async def test_D5_every_resume_logs_one_resume_event_with_continue_pending_work(
    official: CopilotClient, shared_server: ServerProcess, model: ReplayServer
) -> None:
    options: Any = {
        "provider": provider(model),
        "on_permission_request": PermissionHandler.approve_all,
    }
    session = await official.create_session(**options)
    await session.send_and_wait("Say hello", timeout=30)
    await session.disconnect()
    # Cold: the session is opened from the store again.
    cold = await official.resume_session(session.session_id, continue_pending_work=True, **options)
    assert resumes(await cold.get_events()) == [True]
    # Warm: a second client resumes the session while the first still has it open.
    second = CopilotClient(connection=shared_server.connection())
    await second.start()
    try:
        warm = await second.resume_session(session.session_id, **options)
        assert resumes(await warm.get_events()) == [True, False]
        assert resumes(await cold.get_events()) == [True, False]
    finally:
        await second.force_stop()
    await cold.disconnect()


# --- D6: tool calls outlive their client's connection ----------------------------------------


class LookupArgs(BaseModel):
    value: str


LOOKUP = conversation(
    user("Look up beta"),
    assistant(None, call("c1", "lookup", value="beta")),
    tool("c1", "RESUMED-BETA"),
    assistant("It is RESUMED-BETA."),
)


class Blocked:
    """A client whose `lookup` tool never answers, stopped once the call reached it."""

    def __init__(self, server: ServerProcess) -> None:
        self.client = CopilotClient(connection=server.connection())
        self.started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.requests: list[str] = []

    async def start_call(self, model: ReplayServer) -> str:
        """Create a session, have the model call `lookup`, drop the connection; the id."""

        async def never(params: LookupArgs, invocation: Any) -> str:
            self.started.set_result(params.value)
            await asyncio.Event().wait()
            return "never"

        def on_event(event: Any) -> None:
            if event.type.value == "external_tool.requested":
                self.requests.append(event.data.request_id)

        await self.client.start()
        session = await self.client.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            tools=[lookup(never)],
            on_permission_request=PermissionHandler.approve_all,
        )
        session.on(on_event)
        await session.send("Look up beta")
        assert await asyncio.wait_for(self.started, 30) == "beta"
        await self.client.force_stop()  # the connection drops; the call stays pending
        return session.session_id


def lookup(handler: Any) -> Any:
    return define_tool(
        "lookup", description="Look a value up", params_type=LookupArgs, handler=handler
    )


async def last_reply(session: Any, timeout: float = 30) -> str:
    """The content of the session's next `assistant.message` with text."""
    reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_event(event: Any) -> None:
        if event.type.value == "assistant.message" and event.data.content and not reply.done():
            reply.set_result(event.data.content)

    session.on(on_event)
    return await asyncio.wait_for(reply, timeout)


async def test_D6_a_resuming_client_answers_a_call_by_request_id(
    official: CopilotClient, shared_server: ServerProcess
) -> None:
    async with ReplayServer([LOOKUP]) as model:
        blocked = Blocked(shared_server)
        session_id = await blocked.start_call(model)
        resumed = await official.resume_session(
            session_id,
            provider=provider(model),  # type: ignore[arg-type]
            on_permission_request=PermissionHandler.approve_all,
            continue_pending_work=True,
        )
        reply = asyncio.create_task(last_reply(resumed))
        answer = await resumed.rpc.tools.handle_pending_tool_call(
            HandlePendingToolCallRequest(request_id=blocked.requests[0], result="RESUMED-BETA")
        )
        assert answer.success
        assert await reply == "It is RESUMED-BETA."
        await resumed.disconnect()


async def test_D6_a_pending_call_is_redelivered_to_a_resuming_client_with_the_tool(
    official: CopilotClient, shared_server: ServerProcess
) -> None:
    async with ReplayServer([LOOKUP]) as model:
        session_id = await Blocked(shared_server).start_call(model)
        resumed = await official.resume_session(
            session_id,
            provider=provider(model),  # type: ignore[arg-type]
            tools=[lookup(lambda params, invocation: f"RESUMED-{params.value.upper()}")],
            on_permission_request=PermissionHandler.approve_all,
        )
        assert await last_reply(resumed) == "It is RESUMED-BETA."
        await resumed.disconnect()


async def test_D6_unanswered_calls_fail_after_the_pending_timeout(
    start_server: StartServer,
) -> None:
    server = start_server(None, "--pending-timeout", "1")
    async with ReplayServer([LOOKUP]) as model:
        session_id = await Blocked(server).start_call(model)
        for _ in range(300):  # nobody resumes: the call fails and the run goes on
            if len(model.requests) > 1:
                break
            await asyncio.sleep(0.1)
        [*_, last] = model.requests[1]["messages"]
        assert last["role"] == "tool" and "Failed to execute `lookup`" in last["content"]
    async with server.remote() as client:
        events = await (await client.resume_session(session_id)).get_events()
    completed = [e for e in events if e.type == "external_tool.completed"]
    assert len(completed) == 1


async def test_D5_D6_a_resume_on_another_server_after_a_crash_runs_the_pending_call_again(
    start_server: StartServer, tmp_path: Path
) -> None:
    store = tmp_path / "crash.db"
    crashed = start_server(store, "--lease-ttl", "1")
    async with ReplayServer([LOOKUP]) as model:
        blocked = Blocked(crashed)
        started = asyncio.ensure_future(blocked.start_call(model))
        await asyncio.wait_for(asyncio.shield(blocked.started), 30)
        crashed.process.kill()  # SIGKILL while the client's tool call is pending
        crashed.process.wait()
        session_id = await asyncio.wait_for(started, 30)
        async with trimtab.Client(store=store) as reader:  # the dead server's lease lapses
            for _ in range(100):
                if (await reader.get_session_record(session_id)).lease_owner is None:
                    break
                await asyncio.sleep(0.05)

        other = start_server(store)
        client = CopilotClient(connection=other.connection())
        await client.start()
        try:
            ran: list[str] = []

            def answer(params: LookupArgs, invocation: Any) -> str:
                ran.append(params.value)
                return f"RESUMED-{params.value.upper()}"

            resumed = await client.resume_session(
                session_id,
                provider=provider(model),  # type: ignore[arg-type]
                tools=[lookup(answer)],
                on_permission_request=PermissionHandler.approve_all,
                continue_pending_work=True,
            )
            assert await last_reply(resumed) == "It is RESUMED-BETA."
            events = await resumed.get_events()
            await resumed.disconnect()
        finally:
            await client.force_stop()
    assert ran == ["beta"]  # the call the crash cut ran again, on the resuming client
    assert resumes(events) == [True]
    types = [e.type.value for e in events]
    assert types.count("tool.execution_start") == types.count("tool.execution_complete") == 1


# --- D8: lifecycle notifications -----------------------------------------------------------


async def test_D8_clients_hear_of_sessions_created_updated_and_deleted(
    official: CopilotClient, shared_server: ServerProcess
) -> None:
    watcher = CopilotClient(connection=shared_server.connection())
    await watcher.start()
    seen: list[tuple[str, str]] = []
    created: list[str] = []
    dropped: list[str] = []
    stop_all = watcher.on_lifecycle(lambda e: seen.append((e.type, e.session_id)))
    watcher.on_lifecycle("session.created", lambda e: created.append(f"{e.type} {e.session_id}"))
    stop_dropped = watcher.on_lifecycle(lambda e: dropped.append(e.session_id))
    stop_dropped()
    twice = conversation(user("Say hello"), assistant("Hello!"), user("Again"), assistant("Hi!"))
    try:
        async with ReplayServer([twice]) as model:
            session = await official.create_session(
                provider=provider(model),  # type: ignore[arg-type]
                on_permission_request=PermissionHandler.approve_all,
            )
            await session.send_and_wait("Say hello", timeout=30)
            await session.send_and_wait("Again", timeout=30)  # no second update: same summary
            await session.disconnect()
        await official.delete_session(session.session_id)
        mine = [("session.created", "session.updated", "session.deleted")]
        for _ in range(100):
            if [tuple(t for t, s in seen if s == session.session_id)] == mine:
                break
            await asyncio.sleep(0.1)
        assert [tuple(t for t, s in seen if s == session.session_id)] == mine
        assert created == [f"session.created {session.session_id}"]  # the type filter
        assert dropped == []
    finally:
        stop_all()
        await watcher.force_stop()


async def test_D8_an_unauthenticated_connection_hears_nothing(
    start_server: StartServer,
) -> None:
    server = start_server(None, "--token", "right")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        async with trimtab.Client.connect(server.url, token="right") as client:
            async with ReplayServer([HELLO]) as model:
                session = await client.create_session(provider=provider(model))
                await session.disconnect()
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing was sent to the connection without the token


# --- D9: options ---------------------------------------------------------------------------


async def test_D9_wire_model_is_the_model_named_on_the_wire(
    official: CopilotClient, model: ReplayServer
) -> None:
    byok: Any = {**provider(model), "wire_model": "my-deployment"}
    session = await official.create_session(
        provider=byok, model="session-model", on_permission_request=PermissionHandler.approve_all
    )
    await session.send_and_wait("Say hello", timeout=30)
    start: Any = (await session.get_events())[0]
    await session.disconnect()
    assert model.requests[0]["model"] == "my-deployment"
    assert start.data.selected_model == "session-model"


async def test_D9_model_id_stands_for_the_model_when_none_is_given(
    official: CopilotClient, model: ReplayServer
) -> None:
    byok: Any = {**provider(model), "model_id": "base-model"}
    session = await official.create_session(
        provider=byok, on_permission_request=PermissionHandler.approve_all
    )
    await session.send_and_wait("Say hello", timeout=30)
    start: Any = (await session.get_events())[0]
    await session.disconnect()
    assert model.requests[0]["model"] == "base-model"
    assert start.data.selected_model == "base-model"


async def test_D9_the_client_name_is_in_the_user_agent(
    official: CopilotClient, model: ReplayServer
) -> None:
    await say_hello(official, model, client_name="my-copilot-app")
    agent = model.received[0].headers["user-agent"]
    assert agent.startswith("my-copilot-app trimtab/"), agent


async def test_D9_excluded_and_available_tools_filter_what_the_model_is_offered(
    official: CopilotClient, model: ReplayServer
) -> None:
    tools = [
        define_tool(name, description=name, params_type=LookupArgs, handler=lambda p, i: "x")
        for name in ("alpha", "beta", "gamma", "delta")
    ]
    await say_hello(
        official,
        model,
        tools=tools,
        available_tools=["alpha", "beta", "gamma"],
        excluded_tools=["beta"],
        default_agent={"excluded_tools": ["gamma"]},
    )
    assert [t["function"]["name"] for t in model.requests[0]["tools"]] == ["alpha"]


async def test_D9_a_low_infinite_sessions_threshold_compacts(official: CopilotClient) -> None:
    long_prompt = "Remember these words: " + " ".join(f"word{i}" for i in range(500))
    long_answer = "Noted: " + " ".join(f"word{i}" for i in range(800))
    # Under 2% of a 128k window at the first send, past it at the second (the long answer):
    # the summary request has no recording (it fails), so the oldest unit (the long prompt)
    # is dropped, and what is left is answered.
    noted = conversation(user(long_prompt), assistant(long_answer))
    after = conversation(assistant(long_answer), user("Say hello"), assistant("Hello!"))
    async with ReplayServer([noted, after]) as model:
        byok: Any = {**provider(model), "max_retries": 0}
        session = await official.create_session(
            provider=byok,
            on_permission_request=PermissionHandler.approve_all,
            infinite_sessions={
                "background_compaction_threshold": 0.02,
                "buffer_exhaustion_threshold": 0.03,
            },
        )
        reply = await session.send_and_wait(long_prompt, timeout=30)
        assert reply is not None and reply.data.content == long_answer  # type: ignore[union-attr]
        hello = await session.send_and_wait("Say hello", timeout=30)
        assert hello is not None and hello.data.content == "Hello!"  # type: ignore[union-attr]
        events: list[Any] = await session.get_events()
        await session.disconnect()
    starts = [e for e in events if e.type.value == "session.compaction_start"]
    completes = [e for e in events if e.type.value == "session.compaction_complete"]
    assert starts and len(starts) == len(completes)
    assert {e.data.trigger.value for e in starts + completes} == {"threshold"}
    assert all(e.data.success is True for e in completes)


# --- D12: reasoning effort -----------------------------------------------------------------


async def test_D12_reasoning_effort_of_create_switch_and_set_is_sent(
    official: CopilotClient,
) -> None:
    thrice = conversation(
        user("Say hello"),
        assistant("Hello!"),
        user("Again"),
        assistant("Hi!"),
        user("More"),
        assistant("Done."),
    )
    async with ReplayServer([thrice]) as model:
        session = await official.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            model="test-model",
            reasoning_effort="high",
            on_permission_request=PermissionHandler.approve_all,
        )
        await session.send_and_wait("Say hello", timeout=30)
        await session.rpc.model.switch_to(
            ModelSwitchToRequest(model_id="other-model", reasoning_effort="medium")
        )
        await session.send_and_wait("Again", timeout=30)
        await session.rpc.model.set_reasoning_effort(
            ModelSetReasoningEffortRequest(reasoning_effort="low")
        )
        await session.send_and_wait("More", timeout=30)
        session_id = session.session_id
        await session.disconnect()
        resumed = await official.resume_session(
            session_id,
            provider=provider(model),  # type: ignore[arg-type]
            reasoning_effort="xhigh",
            on_permission_request=PermissionHandler.approve_all,
        )
        current = await resumed.rpc.model.get_current()
        await resumed.disconnect()
    sent = [(body["model"], body.get("reasoning_effort")) for body in model.requests]
    assert sent == [("test-model", "high"), ("other-model", "medium"), ("other-model", "low")]
    assert (current.model_id, current.reasoning_effort) == ("other-model", "xhigh")


async def test_D12_the_events_that_carry_a_reasoning_effort_carry_the_sessions(
    official: CopilotClient, model: ReplayServer
) -> None:
    session = await official.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        model="test-model",
        reasoning_effort="high",
        on_permission_request=PermissionHandler.approve_all,
    )
    await session.send_and_wait("Say hello", timeout=30)
    await session.disconnect()
    resumed = await official.resume_session(
        session.session_id,
        provider=provider(model),  # type: ignore[arg-type]
        reasoning_effort="low",
        on_permission_request=PermissionHandler.approve_all,
    )
    events: list[Any] = await resumed.get_events()  # as the official client parses them
    await resumed.disconnect()
    efforts = {
        e.type.value: e.data.reasoning_effort
        for e in events
        if e.type.value in ("session.start", "assistant.usage", "session.resume")
    }
    assert efforts == {"session.start": "high", "assistant.usage": "high", "session.resume": "low"}


async def test_D12_a_trimtab_remote_session_sends_its_reasoning_effort(
    shared_server: ServerProcess, model: ReplayServer
) -> None:
    async with shared_server.remote() as client:
        session = await client.create_session(provider=provider(model), reasoning_effort="low")
        await session.send_and_wait("Say hello", timeout=30)
        await session.disconnect()
    assert model.requests[0]["reasoning_effort"] == "low"


# --- D10: hooks ----------------------------------------------------------------------------


async def test_D10_the_user_prompt_transformed_hook_of_an_official_client(
    official: CopilotClient,
) -> None:
    seen: list[tuple[str, str]] = []

    def transformed(data: Any, invocation: Any) -> dict[str, str]:
        seen.append((data["prompt"], data["transformedPrompt"]))
        return {"modifiedTransformedPrompt": "Say hello"}

    hooks: Any = {"on_user_prompt_transformed": transformed}
    async with ReplayServer([HELLO]) as model:
        assert await say_hello_as(official, model, "Greet me", hooks=hooks) == "Hello!"
    assert seen == [("Greet me", "Greet me")]


async def test_D10_an_official_clients_agent_stop_hook_keeps_the_run_going(
    official: CopilotClient,
) -> None:
    def agent_stop(data: Any, invocation: Any) -> dict[str, str] | None:
        return None if data["stopHookActive"] else {"decision": "block", "reason": "Once more"}

    recorded = conversation(
        user("Say hello"), assistant("Hello!"), user("Once more"), assistant("Hello again!")
    )
    async with ReplayServer([recorded]) as model:
        hooks: Any = {"on_agent_stop": agent_stop}
        assert await say_hello_as(official, model, "Say hello", hooks=hooks) == "Hello again!"


async def test_D13_an_official_clients_session_start_context_reaches_the_model(
    official: CopilotClient,
) -> None:
    calls: list[tuple[str, str, str]] = []

    def start(data: Any, invocation: Any) -> dict[str, str]:
        calls.append((data["sessionId"], invocation["session_id"], data["source"]))
        return {"additionalContext": "Session start hook context."}

    recorded = conversation(user("Session start hook context."), user("Say hi"), assistant("Hi!"))
    async with ReplayServer([recorded]) as model:
        session = await official.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            on_permission_request=PermissionHandler.approve_all,
            hooks={"on_session_start": start},  # type: ignore[arg-type]
        )
        reply = await session.send_and_wait("Say hi", timeout=30)
        assert reply is not None and reply.data.content == "Hi!"  # type: ignore[union-attr]
        # A fork gets the source's hooks, but its calls carry its own id: the client does
        # not take them for a second start of the source.
        fork = await official.rpc.sessions.fork(SessionsForkRequest(session_id=session.session_id))
        await session.disconnect()
    assert [m["role"] for m in model.requests[0]["messages"]] == ["system", "user", "user"]
    assert calls == [(session.session_id, session.session_id, "new")]
    assert fork.session_id != session.session_id


async def test_D13_an_official_clients_pre_tool_use_suppresses_output_and_adds_context(
    official: CopilotClient,
) -> None:
    def pre(data: Any, invocation: Any) -> dict[str, Any]:
        return {
            "permissionDecision": "allow",
            "suppressOutput": True,
            "additionalContext": "Use PostgreSQL syntax.",
        }

    lookup = define_tool(
        "lookup", description="Look up", params_type=LookupArgs, handler=lambda p, i: "SECRET"
    )
    recorded = conversation(
        user("Query"),
        assistant(None, call("c1", "lookup", value="k")),
        tool("c1", "The output of this tool call was suppressed by a hook."),
        user(
            'Tool "lookup" was called. Additional context from preToolUse hooks:\n'
            "Use PostgreSQL syntax."
        ),
        assistant("Done."),
    )
    async with ReplayServer([recorded]) as model:
        reply = await say_hello_as(
            official, model, "Query", tools=[lookup], hooks={"on_pre_tool_use": pre}
        )
    assert reply == "Done."


async def say_hello_as(
    client: CopilotClient, model: ReplayServer, prompt: str, **options: Any
) -> str | None:
    session = await client.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        on_permission_request=PermissionHandler.approve_all,
        **options,
    )
    reply = await session.send_and_wait(prompt, timeout=30)
    await session.disconnect()
    return None if reply is None else str(reply.data.content)  # type: ignore[union-attr]


# --- D11: attachments ----------------------------------------------------------------------


async def sent_with(
    client: CopilotClient, model: ReplayServer, prompt: str, attachments: list[Any]
) -> str:
    """The user message the model receives for `prompt` with `attachments`."""
    return (await sent_and_logged(client, model, prompt, attachments))[0]


async def sent_and_logged(
    client: CopilotClient, model: ReplayServer, prompt: str, attachments: list[Any]
) -> tuple[str, Any]:
    """The user message the model receives for `prompt` with `attachments`, and the
    `user.message` event the official client reads back."""
    session = await client.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        on_permission_request=PermissionHandler.approve_all,
    )
    try:
        await session.send(prompt, attachments=attachments)
        for _ in range(300):
            if model.requests:
                break
            await asyncio.sleep(0.1)
        content: str = model.requests[0]["messages"][-1]["content"]
        [event] = [e for e in await session.get_events() if e.type.value == "user.message"]
        return content, event
    finally:
        await session.disconnect()


async def test_D11_files_and_directories_are_tagged_as_the_reference_runtime_sends_them(
    official: CopilotClient, model: ReplayServer, tmp_path: Path
) -> None:
    # The requests the reference runtime sends for these attachments (the official SDK's
    # recorded conversations): the model is told the paths, and reads them with its tools.
    sentinel = tmp_path / "attached-file.txt"
    sentinel.write_text("FILE_ATTACHMENT_SENTINEL")
    attached = tmp_path / "attached.txt"
    attached.write_text("This file is attached")
    directory = tmp_path / "attached-directory"
    directory.mkdir()
    (directory / "readme.txt").write_text("DIRECTORY_ATTACHMENT_SENTINEL")
    cases: list[tuple[str, dict[str, Any], str]] = [
        (
            "Read the attached file and reply with its contents.",
            {
                "type": "file",
                "displayName": "attached-file.txt",
                "path": str(sentinel),
                "lineRange": {"start": 1, "end": 1},
            },
            f"* {sentinel} (line 1 of 1 lines)",
        ),
        (
            "Summarize the attached file",
            {"type": "file", "path": str(attached)},
            f"* {attached} (1 lines)",
        ),
        (
            "List the attached directory.",
            {"type": "directory", "displayName": "attached-directory", "path": str(directory)},
            f"* {directory} (1 items)",
        ),
    ]
    for prompt, attachment, line in cases:
        sent, event = await sent_and_logged(official, model, prompt, [attachment])
        assert sent == f"{prompt}\n\n\n\n<tagged_files>\n{line}\n</tagged_files>"
        [logged] = event.data.attachments
        assert logged.tagged_files_entry == line  # read back by the official client
        assert (logged.path, logged.display_name) == (attachment["path"], Path(logged.path).name)
        model.requests.clear()


async def test_D11_a_selection_is_quoted_before_the_prompt_as_the_reference_sends_it(
    official: CopilotClient, model: ReplayServer, tmp_path: Path
) -> None:
    source = tmp_path / "selected-file.cs"
    source.write_text('class C { string Value = "SELECTION_SENTINEL"; }')
    selection = {
        "type": "selection",
        "displayName": "selected-file.cs",
        "filePath": str(source),
        "text": 'string Value = "SELECTION_SENTINEL";',
        "selection": {"start": {"line": 1, "character": 10}, "end": {"line": 1, "character": 45}},
    }
    sent, event = await sent_and_logged(
        official, model, "Summarize the selected code.", [selection]
    )
    assert sent == (
        "<ide_selection>\n"
        "The user has the following text selected in their IDE. This may or may not be related"
        " to their request.\n"
        "File: selected-file.cs (line 2)\n"
        "```\n"
        'string Value = "SELECTION_SENTINEL";\n'
        "```\n"
        "</ide_selection>\n\n\n\n"
        "Summarize the selected code."
    )
    [logged] = event.data.attachments
    assert (logged.file_path, logged.text) == (str(source), selection["text"])


async def test_D11_ranges_binary_files_and_several_attachments_at_once(
    official: CopilotClient, model: ReplayServer, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("line one\nline two\nline three\n")
    blob = tmp_path / "data.bin"
    blob.write_bytes(b"\x00\x01\xff")
    (tmp_path / "sub").mkdir()
    attachments = [
        {"type": "file", "path": str(notes), "lineRange": {"start": 2, "end": 3}},
        {
            "type": "selection",
            "filePath": str(notes),
            "selection": {"start": {"line": 0, "character": 5}, "end": {"line": 1, "character": 4}},
        },
        {"type": "file", "path": str(blob)},
        {"type": "directory", "path": str(tmp_path)},
        {"type": "selection", "filePath": str(notes), "displayName": "whole", "text": "all"},
    ]
    sent, _ = await sent_and_logged(official, model, "Look", attachments)
    note = "The user has the following text selected in their IDE. This may or may not be"
    note += " related to their request."
    assert sent == (
        f"<ide_selection>\n{note}\nFile: notes.txt (lines 1-2)\n```\none\nline\n```\n"
        "</ide_selection>\n\n\n\n"
        f"<ide_selection>\n{note}\nFile: whole\n```\nall\n```\n</ide_selection>\n\n\n\n"
        "Look\n\n\n\n<tagged_files>\n"
        f"* {notes} (lines 2-3 of 3 lines)\n"
        f"* {blob} (binary file, 3 bytes)\n"
        f"* {tmp_path} (3 items)\n"
        "</tagged_files>"
    )


async def test_D11_blobs_are_text_or_described(
    official: CopilotClient, model: ReplayServer
) -> None:
    attachments = [
        {"type": "blob", "data": base64.b64encode(b"\x00\x01").decode(), "mimeType": "app/x"},
        {"type": "blob", "data": base64.b64encode(b"a,b\n1,2").decode(), "mimeType": "text/csv"},
    ]
    sent = await sent_with(official, model, "Describe", attachments)
    assert sent == "\n\n".join(
        [
            "Describe",
            '<attachment type="blob" name="blob">\n'
            "[binary data: app/x, 2 bytes; not shown to the model]\n</attachment>",
            '<attachment type="blob" name="blob">\na,b\n1,2\n</attachment>',
        ]
    )


# --- D14: images ---------------------------------------------------------------------------


async def test_D14_image_blobs_and_files_are_image_parts_and_the_event_has_attachments(
    official: CopilotClient, model: ReplayServer, tmp_path: Path
) -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(60)
    photo = tmp_path / "photo.png"
    photo.write_bytes(png)
    data = base64.b64encode(png).decode()
    attachments: Any = [
        {"type": "blob", "data": data, "mimeType": "image/png", "displayName": "pixel.png"},
        {"type": "file", "path": str(photo)},
    ]
    session = await official.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        on_permission_request=PermissionHandler.approve_all,
    )
    await session.send("Say hello", attachments=attachments)
    for _ in range(300):
        if model.requests:
            break
        await asyncio.sleep(0.1)
    [event] = [e for e in await session.get_events() if e.type.value == "user.message"]
    await session.disconnect()
    content = model.requests[0]["messages"][-1]["content"]
    # Named after the prompt, shown after the text, as the reference runtime sends images.
    assert content[0] == {"type": "text", "text": "Say hello\npixel.png\nphoto.png"}
    url = {"url": f"data:image/png;base64,{data}"}
    assert content[1:] == [{"type": "image_url", "image_url": url}] * 2
    # The official client reads the attachments of the message (their data left out).
    message: Any = event.data
    blob, file = message.attachments
    assert (blob.mime_type, blob.display_name, blob.byte_length, blob.data) == (
        "image/png",
        "pixel.png",
        68,
        None,
    )
    assert (file.path, file.display_name, file.mime_type) == (str(photo), "photo.png", "image/png")


async def test_D14_a_trimtab_remote_session_sends_images_and_request_headers(
    shared_server: ServerProcess, model: ReplayServer
) -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(24)).decode()
    async with shared_server.remote() as client:
        session = await client.create_session(provider=provider(model))
        with pytest.raises(ValueError, match="mime_type"):
            await session.send("Look", images=[{"mime_type": "image/bmp", "data": png}])
        image = {"mime_type": "image/png", "data": png}
        await session.send("Say hello", images=[image], request_headers={"X-Turn-Tag": "remote"})
        for _ in range(300):
            if model.requests:
                break
            await asyncio.sleep(0.1)
        await session.disconnect()
    [request] = model.requests  # the refused send stored nothing and ran nothing
    content = request["messages"][-1]["content"]
    assert content[0]["text"] == "Say hello"  # an image without a name: shown, not named
    assert content[1:] == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    ]
    assert model.received[0].headers["x-turn-tag"] == "remote"


async def test_D11_a_trimtab_remote_session_sends_attachments(
    shared_server: ServerProcess, model: ReplayServer, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("line one\nline two\n")
    async with shared_server.remote() as client:
        session = await client.create_session(provider=provider(model))
        for bad in ({"type": "github_reference", "number": 1}, {"type": "file"}):
            with pytest.raises(ValueError, match="invalid send"):
                await session.send("Look", attachments=[bad])
        attached = {"type": "file", "path": str(notes), "displayName": "notes"}
        await session.send("Read this", attachments=[attached])
        for _ in range(300):
            if model.requests:
                break
            await asyncio.sleep(0.1)
        events = await session.get_events()
        await session.disconnect()
    [request] = model.requests  # the refused sends stored nothing and ran nothing
    line = f"* {notes} (2 lines)"
    assert request["messages"][-1]["content"] == (
        f"Read this\n\n\n\n<tagged_files>\n{line}\n</tagged_files>"
    )
    [message] = [e for e in events if e.type == "user.message"]
    assert message.data.attachments == [attached | {"taggedFilesEntry": line}]


@pytest.mark.parametrize(
    ("attachment", "error"),
    [
        ({"type": "file", "path": "/no/such/file.txt"}, "attachment file not found"),
        ({"type": "file", "path": "relative.txt"}, "must be absolute"),
        ({"type": "directory", "path": "/no/such/dir"}, "attachment directory not found"),
        ({"type": "blob", "data": "%%%", "mimeType": "image/png"}, "not base64"),
        ({"type": "github_reference", "number": 1}, "Invalid params"),
    ],
)
async def test_D11_an_unreadable_attachment_is_refused_and_nothing_is_stored(
    official: CopilotClient, model: ReplayServer, attachment: dict[str, Any], error: str
) -> None:
    session = await official.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        on_permission_request=PermissionHandler.approve_all,
    )
    before = len(await session.get_events())
    with pytest.raises(Exception, match=error):
        await session.send("Look", attachments=[attachment])  # type: ignore[list-item]
    assert len(await session.get_events()) == before
    await session.disconnect()


async def test_D11_a_fifo_or_a_device_is_refused_without_waiting(
    official: CopilotClient, model: ReplayServer, tmp_path: Path
) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer for ever
    session = await official.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        on_permission_request=PermissionHandler.approve_all,
    )
    before = len(await session.get_events())
    # /dev/stdin: on stdio, the server's JSON-RPC input, which a read would steal from.
    for path in (str(fifo), "/dev/stdin", "/dev/zero"):
        for kind in ("file", "selection"):
            key = "path" if kind == "file" else "filePath"
            attachment: Any = {"type": kind, key: path}
            with pytest.raises(Exception, match="not a regular file"):
                await asyncio.wait_for(session.send("Look", attachments=[attachment]), 10)
    assert len(await session.get_events()) == before
    assert (await official.ping("still here")).message == "pong: still here"
    await session.disconnect()


async def test_D11_a_large_files_lines_are_counted_and_a_selection_of_it_is_cut(
    official: CopilotClient, model: ReplayServer, tmp_path: Path
) -> None:
    big = tmp_path / "big.log"
    big.write_text("x" * 99 + "\n" + "y" * (MAX_TEXT_BYTES + 1000))  # 2 lines
    sent = await sent_with(official, model, "Read", [{"type": "file", "path": str(big)}])
    assert sent.endswith(f"<tagged_files>\n* {big} (2 lines)\n</tagged_files>")
    model.requests.clear()
    sent = await sent_with(official, model, "Read", [{"type": "selection", "filePath": str(big)}])
    kept = "y" * (MAX_TEXT_BYTES - 100)
    assert kept in sent and kept + "y" not in sent
    assert f"[cut: the first {MAX_TEXT_BYTES} of {MAX_TEXT_BYTES + 1100} bytes]" in sent


async def test_D9_request_headers_go_with_that_sends_model_requests_only(
    official: CopilotClient,
) -> None:
    twice = conversation(user("Say hello"), assistant("Hello!"), user("Again"), assistant("Hi!"))
    async with ReplayServer([twice]) as model:
        session = await official.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            on_permission_request=PermissionHandler.approve_all,
        )
        await session.send_and_wait(
            "Say hello", request_headers={"X-Turn-Tag": "turn-1"}, timeout=30
        )
        await session.send_and_wait("Again", timeout=30)
        await session.disconnect()
    assert model.received[0].headers["x-turn-tag"] == "turn-1"
    assert "x-turn-tag" not in model.received[1].headers


async def test_D5_resuming_a_session_only_this_client_has_open_applies_the_new_options(
    official: CopilotClient,
) -> None:
    twice = conversation(user("Say hello"), assistant("Hello!"), user("Again"), assistant("Hi!"))
    async with ReplayServer([twice]) as model:
        first = await official.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            on_permission_request=PermissionHandler.approve_all,
        )
        await first.send_and_wait("Say hello", timeout=30)
        byok: Any = {**provider(model), "headers": {"X-Tenant": "resumed"}}
        resumed = await official.resume_session(
            first.session_id,
            provider=byok,
            system_message={"mode": "replace", "content": "RESUMED"},
            on_permission_request=PermissionHandler.approve_all,
        )
        reply = await resumed.send_and_wait("Again", timeout=30)
        assert reply is not None and reply.data.content == "Hi!"  # type: ignore[union-attr]
        assert resumes(await resumed.get_events()) == [False]
        await resumed.disconnect()
    assert "x-tenant" not in model.received[0].headers
    assert model.received[1].headers["x-tenant"] == "resumed"
    assert system_sent(model, 1) == "RESUMED"


async def test_D5_a_client_joining_an_open_session_brings_its_tools_not_its_options(
    official: CopilotClient, shared_server: ServerProcess
) -> None:
    recorded = conversation(
        user("Convert"),
        assistant(None, call("c1", "currency", value="US")),
        tool("c1", "USD"),
        assistant("It is USD."),
        user("Again"),
        assistant("Done."),
    )
    second = CopilotClient(connection=shared_server.connection())
    await second.start()
    try:
        async with ReplayServer([recorded]) as model:
            first = await official.create_session(
                provider=provider(model),  # type: ignore[arg-type]
                system_message={"mode": "replace", "content": "FIRST"},
                tools=[lookup(lambda p, i: "x")],
                on_permission_request=PermissionHandler.approve_all,
            )
            currency = define_tool(
                "currency",
                description="Currency",
                params_type=LookupArgs,
                handler=lambda p, i: "USD",
            )
            byok: Any = {**provider(model), "headers": {"X-Tenant": "second"}}
            joined = await second.resume_session(
                first.session_id,
                provider=byok,
                system_message={"mode": "replace", "content": "SECOND"},
                tools=[currency],
                on_permission_request=PermissionHandler.approve_all,
            )
            # The second client's tool is offered, and run by it; its options are not taken.
            reply = await first.send_and_wait("Convert", timeout=30)
            assert reply is not None and reply.data.content == "It is USD."  # type: ignore[union-attr]
            offered = [t["function"]["name"] for t in model.requests[0]["tools"]]
            assert sorted(offered) == ["currency", "lookup"]
            assert system_sent(model, 0) == "FIRST"
            assert "x-tenant" not in model.received[0].headers
            # Gone with its client.
            await joined.disconnect()
            await first.send_and_wait("Again", timeout=30)
            assert [t["function"]["name"] for t in model.requests[-1]["tools"]] == ["lookup"]
            await first.disconnect()
    finally:
        await second.force_stop()


# --- spec section 1: each outcome as an official client reads it --------------------------


class NoArgs(BaseModel):
    pass


async def test_every_outcome_reaches_an_official_client_as_success_and_error_code(
    official: CopilotClient,
) -> None:
    """A Copilot client tells outcomes apart by `success` and `error.code` alone: a call that
    did not run (denied, rejected, invalid, unknown) must never read as a success."""

    def answer(kind: Any) -> Any:
        return lambda params, invocation: ToolResult(text_result_for_llm=kind, result_type=kind)

    def boom(params: NoArgs, invocation: Any) -> str:
        raise RuntimeError("client-side secret")

    def tool_(name: str, handler: Any, **options: Any) -> Any:
        return define_tool(name, description=name, params_type=NoArgs, handler=handler, **options)

    tools = [
        tool_("ok", lambda p, i: "fine", skip_permission=True),
        tool_("boom", boom, skip_permission=True),
        *(
            tool_(f"typed_{kind}", answer(kind))
            for kind in ("failure", "denied", "rejected", "timeout")
        ),
        tool_("guarded", lambda p, i: "ran"),
        tool_("asked", lambda p, i: "ran"),
    ]

    def permission(request: Any, invocation: Any) -> Any:
        if request.tool_name == "guarded":
            return PermissionDecisionUserNotAvailable()
        if request.tool_name == "asked":
            return PermissionDecisionReject()
        return PermissionHandler.approve_all(request, invocation)

    expected = {  # call id: (tool, arguments, success, error code)
        "c1": ("ok", "{}", True, None),
        "c2": ("boom", "{}", False, "failure"),
        "c3": ("typed_failure", "{}", False, "failure"),
        "c4": ("typed_timeout", "{}", False, "failure"),
        "c5": ("missing", "{}", False, "failure"),
        "c6": ("ok", "{not json", False, "invalid_arguments"),
        "c7": ("guarded", "{}", False, "denied"),
        "c8": ("typed_denied", "{}", False, "denied"),
        "c9": ("asked", "{}", False, "rejected"),
        "c10": ("typed_rejected", "{}", False, "rejected"),
    }
    calls = [
        {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}
        for id_, (name, arguments, _, _) in expected.items()
    ]
    # A rejection ends the run after its batch (O2): the model is asked once.
    recorded = conversation(user("Try everything"), assistant(None, *calls))
    async with ReplayServer([recorded]) as model:
        session = await official.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            on_permission_request=permission,
            tools=tools,
        )
        seen: list[Any] = []
        session.on(seen.append)
        await session.send_and_wait("Try everything", timeout=30)
        stored: list[Any] = await session.get_events()
        await session.disconnect()
    assert len(model.requests) == 1
    for events in (seen, stored):  # live, and as `session.getMessages` reads the log back
        completes = {
            e.data.tool_call_id: e.data for e in events if e.type.value == "tool.execution_complete"
        }
        got = {
            call_id: (
                data.success,
                data.error.code if data.error else None,
                bool(data.error and data.error.message),
                data.result is not None,
            )
            for call_id, data in completes.items()
        }
        assert got == {
            call_id: (success, code, not success, success)
            for call_id, (_, _, success, code) in expected.items()
        }
    assert "client-side secret" not in str(stored)


async def test_x6_a_trimtab_remote_session_steers_with_send_and_wait(
    shared_server: ServerProcess,
) -> None:
    """`send_and_wait(mode="immediate")` of trimtab's own client goes as a steering message:
    the running turn reads it after its batch's results, and the wait ends with that run."""
    started, release = asyncio.Event(), asyncio.Event()

    async def hold(params: dict[str, Any]) -> str:
        started.set()
        await release.wait()
        return "released"

    recorded = conversation(
        user("first"),
        assistant(None, call("call_1", "hold")),
        tool("call_1", "released"),
        user("STEER: be brief"),
        assistant("Brief."),
    )
    async with ReplayServer([recorded]) as model, shared_server.remote() as client:
        session = await client.create_session(
            provider=provider(model),
            tools=[trimtab.define_tool("hold", description="Wait", handler=hold)],
            on_permission_request=trimtab.PermissionHandler.approve_all,
        )
        queued = asyncio.Event()
        session.on(
            lambda event: queued.set() if event.type == "pending_messages.modified" else None
        )
        await session.send("first")
        await asyncio.wait_for(started.wait(), 30)
        steered = asyncio.create_task(
            session.send_and_wait("STEER: be brief", mode="immediate", timeout=30)
        )
        await asyncio.wait_for(queued.wait(), 30)  # stored, and offered to the running turn
        release.set()
        reply = await steered
        events = await session.get_events()
        await session.disconnect()
    assert reply is not None and reply.data.content == "Brief."
    sources = [(e.data.content, e.data.source) for e in events if e.type == "user.message"]
    assert sources == [("first", "user"), ("STEER: be brief", "immediate")]
