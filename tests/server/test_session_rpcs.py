"""Issue 17, the session RPCs official Copilot clients call (spec section K): model, name,
fork, log, usage and activity, through the official `copilot` client against a real
`trimtab serve` subprocess, with the model replayed over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from copilot import CopilotClient
from copilot._jsonrpc import JsonRpcError
from copilot.generated.rpc import (
    EventLogReadRequest,
    ModelSetReasoningEffortRequest,
    ModelSwitchToRequest,
    ModeSetRequest,
    NameSetRequest,
    PermissionsSetApproveAllRequest,
    RegisterEventInterestParams,
    ReleaseEventInterestParams,
    SessionsForkRequest,
    ShutdownRequest,
)
from copilot.generated.session_events import (
    AssistantMessageData,
    PermissionMode,
    SessionMode,
    SessionShutdownData,
    SessionTitleChangedData,
    ShutdownType,
    UserMessageData,
)
from copilot.session import CopilotSession, PermissionHandler
from copilot.tools import define_tool
from pydantic import BaseModel

from tests.server.conftest import (
    ServerProcess,
    assistant,
    call,
    conversation,
    provider,
    tool,
    user,
)
from trimtab.testing import ReplayServer


@pytest.fixture
async def client(shared_server: ServerProcess) -> AsyncIterator[CopilotClient]:
    connection = shared_server.connection()
    official = CopilotClient(connection=connection, log_level="warning")
    await official.start()
    yield official
    await official.force_stop()


async def open_session(
    client: CopilotClient, model: ReplayServer, session_id: str | None = None
) -> CopilotSession:
    options: dict[str, Any] = {
        "provider": provider(model),
        "model": "test-model",
        "system_message": {"content": "You are a test assistant.", "mode": "replace"},
        "on_permission_request": PermissionHandler.approve_all,
    }
    if session_id is not None:
        return await client.resume_session(session_id, **options)
    return await client.create_session(**options)


class Seen(list[Any]):
    """The events of some types a session delivered, in order."""

    def __init__(self, session: CopilotSession, *types: str) -> None:
        super().__init__()
        self._arrived = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        session.on(lambda event: self._add(event) if event.type.value in types else None)

    def _add(self, event: Any) -> None:
        self.append(event)
        self._loop.call_soon_threadsafe(self._arrived.set)

    async def wait_for(self, count: int, timeout: float = 15.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self) < count:
                self._arrived.clear()
                await self._arrived.wait()


async def test_k1_switch_model_is_used_logged_and_replayed(client: CopilotClient) -> None:
    async with ReplayServer([conversation(user("Hi"), assistant("Hello."))]) as model:
        session = await open_session(client, model)
        changes = Seen(session, "session.model_change")
        assert (await session.rpc.model.get_current()).model_id == "test-model"

        result = await session.rpc.model.switch_to(
            ModelSwitchToRequest(model_id="other-model", reasoning_effort="high")
        )
        assert result.model_id == "other-model"
        current = await session.rpc.model.get_current()
        assert (current.model_id, current.reasoning_effort) == ("other-model", "high")
        await changes.wait_for(1)
        data = changes[0].data
        assert (data.previous_model, data.new_model, data.reasoning_effort) == (
            "test-model",
            "other-model",
            "high",
        )

        await session.send_and_wait("Hi", timeout=30)
        assert model.requests[-1]["model"] == "other-model"

        effort = await session.rpc.model.set_reasoning_effort(
            ModelSetReasoningEffortRequest(reasoning_effort="low")
        )
        assert effort.reasoning_effort == "low"
        listed = await session.rpc.model.list()
        assert [entry["id"] for entry in listed.list] == ["other-model"]
        session_id = session.session_id
        await session.disconnect()

        # No model among the options: the one the log holds applies.
        options: dict[str, Any] = {
            "provider": provider(model),
            "on_permission_request": PermissionHandler.approve_all,
        }
        resumed = await client.resume_session(session_id, **options)
        current = await resumed.rpc.model.get_current()
        assert (current.model_id, current.reasoning_effort) == ("other-model", "low")
        await resumed.disconnect()


async def test_k1_switch_to_an_empty_model_is_refused(client: CopilotClient) -> None:
    async with ReplayServer([]) as model:
        session = await open_session(client, model)
        with pytest.raises(JsonRpcError, match="modelId"):
            await session.rpc.model.switch_to(ModelSwitchToRequest(model_id=""))
        assert (await session.rpc.model.get_current()).model_id == "test-model"
        await session.disconnect()


async def test_k2_name_set_emits_title_changed_each_time(client: CopilotClient) -> None:
    async with ReplayServer([]) as model:
        session = await open_session(client, model)
        titles = Seen(session, "session.title_changed")
        assert (await session.rpc.name.get()).name is None
        await session.rpc.name.set(NameSetRequest(name="  Release notes  "))
        await session.rpc.name.set(NameSetRequest(name="Release notes"))
        await titles.wait_for(2)
        assert [t.data.title for t in titles] == ["Release notes", "Release notes"]
        for blank in ("", "   \n"):
            with pytest.raises(JsonRpcError, match="empty or only whitespace"):
                await session.rpc.name.set(NameSetRequest(name=blank))
        assert len(titles) == 2
        session_id = session.session_id
        await session.disconnect()

        resumed = await open_session(client, model, session_id)
        assert (await resumed.rpc.name.get()).name == "Release notes"
        await resumed.disconnect()


async def test_k3_fork_to_an_event_excludes_it(client: CopilotClient) -> None:
    recorded = [
        conversation(user("First"), assistant("One.")),
        conversation(user("First"), assistant("One."), user("Second"), assistant("Two.")),
    ]
    async with ReplayServer(recorded) as model:
        session = await open_session(client, model)
        await session.send_and_wait("First", timeout=30)
        await session.send_and_wait("Second", timeout=30)
        events = await session.get_events()
        second = next(
            e for e in events if isinstance(e.data, UserMessageData) and e.data.content == "Second"
        )

        fork = await client.rpc.sessions.fork(
            SessionsForkRequest(
                session_id=session.session_id, to_event_id=str(second.id), name="Branch"
            )
        )
        assert fork.session_id != session.session_id
        assert fork.name == "Branch"
        forked = await open_session(client, model, fork.session_id)
        copied = await forked.get_events()
        prompts = [e.data.content for e in copied if isinstance(e.data, UserMessageData)]
        assert prompts == ["First"]
        assert str(second.id) not in {str(e.id) for e in copied}
        assert (await forked.rpc.name.get()).name == "Branch"
        await forked.disconnect()

        whole = await client.rpc.sessions.fork(SessionsForkRequest(session_id=session.session_id))
        forked = await open_session(client, model, whole.session_id)
        copied = await forked.get_events()
        prompts = [e.data.content for e in copied if isinstance(e.data, UserMessageData)]
        assert prompts == ["First", "Second"]
        await forked.disconnect()
        await session.disconnect()


async def test_k3_fork_errors_name_what_is_missing(client: CopilotClient) -> None:
    async with ReplayServer([]) as model:
        session = await open_session(client, model)
        bogus = "00000000-0000-4000-8000-000000000000"
        with pytest.raises(JsonRpcError, match=f"Event {bogus} not found"):
            await client.rpc.sessions.fork(
                SessionsForkRequest(session_id=session.session_id, to_event_id=bogus)
            )
        with pytest.raises(JsonRpcError, match="not found or has no persisted events"):
            await client.rpc.sessions.fork(SessionsForkRequest(session_id="no-such-session"))
        await session.disconnect()


async def test_k4_log_levels_become_events_and_an_error_note_fails_no_run(
    client: CopilotClient,
) -> None:
    async with ReplayServer([conversation(user("Hi"), assistant("Hello."))]) as model:
        session = await open_session(client, model)
        notes = Seen(session, "session.info", "session.warning", "session.error")
        await session.log("Info message")
        await session.log("Warning message", level="warning")
        await session.log("Error message", level="error")
        await session.log("Passing message", ephemeral=True)
        await notes.wait_for(4)
        kinds = {e.data.message: e.type.value for e in notes}
        assert kinds == {
            "Info message": "session.info",
            "Warning message": "session.warning",
            "Error message": "session.error",
            "Passing message": "session.info",
        }
        assert notes[2].data.error_type == "notification"
        stored = {getattr(e.data, "message", None) for e in await session.get_events()}
        assert {"Info message", "Warning message", "Error message"} <= stored
        assert "Passing message" not in stored

        reply = await session.send_and_wait("Hi", timeout=30)
        assert reply is not None and isinstance(reply.data, AssistantMessageData)
        assert reply.data.content == "Hello."
        await session.disconnect()


async def test_k4_usage_metrics_and_activity_come_from_the_log(client: CopilotClient) -> None:
    async with ReplayServer([conversation(user("Hi"), assistant("Hello."))]) as model:
        session = await open_session(client, model)
        assert (await session.rpc.metadata.is_processing()).processing is False
        await session.send_and_wait("Hi", timeout=30)
        metrics = await session.rpc.usage.get_metrics()
        assert metrics.total_user_requests == 1
        assert metrics.model_metrics["test-model"].requests.count == 1
        assert metrics.model_metrics["test-model"].usage.output_tokens > 0
        assert metrics.current_model == "test-model"
        activity = await session.rpc.metadata.activity()
        assert (activity.has_active_work, activity.abortable) == (False, False)
        await session.disconnect()


async def test_k5_shutdown_logs_what_the_session_spent_and_closes_it(client: CopilotClient) -> None:
    async with ReplayServer([conversation(user("Hi"), assistant("Hello."))]) as model:
        session = await open_session(client, model)
        ends = Seen(session, "session.shutdown")
        await session.send_and_wait("Hi", timeout=30)
        await session.rpc.shutdown(ShutdownRequest(type=ShutdownType.ROUTINE, reason="done"))
        await ends.wait_for(1)
        data = ends[0].data
        assert isinstance(data, SessionShutdownData)
        assert data.shutdown_type is ShutdownType.ROUTINE
        assert data.model_metrics["test-model"].requests.count == 1
        assert data.current_model == "test-model"
        with pytest.raises(JsonRpcError, match="not open"):
            await session.rpc.model.get_current()

        resumed = await open_session(client, model, session.session_id)
        logged = [e.type.value for e in await resumed.get_events()]
        assert logged.count("session.shutdown") == 1
        await resumed.disconnect()


class TextArgs(BaseModel):
    text: str


async def test_k6_approve_all_short_circuits_the_permission_handler(
    client: CopilotClient,
) -> None:
    asked: list[Any] = []

    def refuse(request: Any, invocation: Any) -> Any:
        asked.append(request)
        raise AssertionError("the handler must not be asked")

    echo = define_tool(
        "echo",
        description="Upper-case the text",
        handler=lambda params, invocation: params.text.upper(),
        params_type=TextArgs,
        skip_permission=False,
    )
    recorded = conversation(
        user("Use echo on hi"),
        assistant(None, call("call_1", "echo", text="hi")),
        tool("call_1", "HI"),
        assistant("It said HI."),
    )
    async with ReplayServer([recorded]) as model:
        session = await client.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            model="test-model",
            tools=[echo],
            on_permission_request=refuse,
        )
        mode = await session.rpc.permissions.get_mode()
        assert mode.mode is PermissionMode.MANUAL
        result = await session.rpc.permissions.set_approve_all(
            PermissionsSetApproveAllRequest(enabled=True)
        )
        assert result.success
        assert (await session.rpc.permissions.get_mode()).mode is PermissionMode.ALLOW_ALL
        reply = await session.send_and_wait("Use echo on hi", timeout=30)
        assert reply is not None and isinstance(reply.data, AssistantMessageData)
        assert reply.data.content == "It said HI."
        assert asked == []
        await session.rpc.permissions.set_approve_all(
            PermissionsSetApproveAllRequest(enabled=False)
        )
        assert (await session.rpc.permissions.get_mode()).mode is PermissionMode.MANUAL
        await session.disconnect()


async def test_k7_mode_is_logged_and_replayed(client: CopilotClient) -> None:
    async with ReplayServer([]) as model:
        session = await open_session(client, model)
        changes = Seen(session, "session.mode_changed")
        assert await session.rpc.mode.get() is SessionMode.INTERACTIVE
        await session.rpc.mode.set(ModeSetRequest(mode=SessionMode.PLAN))
        assert await session.rpc.mode.get() is SessionMode.PLAN
        unchanged = await session.rpc.mode.set(
            ModeSetRequest(mode=SessionMode.AUTOPILOT, expected_mode=SessionMode.INTERACTIVE)
        )
        assert (unchanged.mode_applied, unchanged.status) == (False, "unchanged")
        await changes.wait_for(1)
        data = changes[0].data
        assert (data.previous_mode, data.new_mode) == (SessionMode.INTERACTIVE, SessionMode.PLAN)
        session_id = session.session_id
        await session.disconnect()
        resumed = await open_session(client, model, session_id)
        assert await resumed.rpc.mode.get() is SessionMode.PLAN
        await resumed.disconnect()


async def test_k8_context_attribution_splits_the_window_by_source(
    client: CopilotClient,
) -> None:
    async with ReplayServer([conversation(user("Hi"), assistant("Hello."))]) as model:
        session = await open_session(client, model)
        await session.send_and_wait("Hi", timeout=30)
        result = await session.rpc.metadata.get_context_attribution()
        context = result.context_attribution
        assert context is not None
        categories = context.categories
        assert categories.system_prompt > 0 and categories.messages > 0
        assert categories.custom_instructions == 0
        assert context.model_id == "test-model"
        assert context.total_tokens == (
            categories.system_prompt
            + categories.custom_instructions
            + categories.system_tools
            + categories.mcp_tools
            + categories.messages
        )
        assert categories.free_space == context.limit - context.total_tokens
        assert context.compaction_threshold < context.limit
        assert {e.kind for e in context.entries} >= {"systemPrompt", "messages"}
        assert context.compactions.count == 0
        await session.disconnect()


class NoArgs(BaseModel):
    pass


async def test_k9_k10_queue_lists_and_clears_the_messages_waiting(
    client: CopilotClient,
) -> None:
    release = asyncio.Event()

    async def wait_for_release(params: NoArgs, invocation: Any) -> str:
        await release.wait()
        return "released"

    hold = define_tool("hold", description="Wait", handler=wait_for_release, params_type=NoArgs)
    recorded = conversation(
        user("first"),
        assistant(None, call("call_1", "hold")),
        tool("call_1", "released"),
        assistant("First done."),
    )
    async with ReplayServer([recorded]) as model:
        session = await client.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            model="test-model",
            tools=[hold],
            on_permission_request=PermissionHandler.approve_all,
        )
        started = Seen(session, "tool.execution_start")
        changes = Seen(session, "pending_messages.modified")
        idle = Seen(session, "session.idle")
        assert (await session.rpc.queue.pending_items()).items == []
        await session.send("first")
        await started.wait_for(1)
        assert (await session.rpc.metadata.is_processing()).processing is True
        assert (await session.rpc.metadata.activity()).has_active_work is True
        second = await session.send("second")
        third = await session.send("third")
        await changes.wait_for(2)
        pending = await session.rpc.queue.pending_items()
        assert [(i.display_text, i.message_id) for i in pending.items] == [
            ("second", second),
            ("third", third),
        ]
        assert pending.steering_messages == []

        await session.rpc.queue.clear()
        await changes.wait_for(3)
        assert (await session.rpc.queue.pending_items()).items == []
        release.set()
        await idle.wait_for(1)
        logged = await session.get_events()
        prompts = [e.data.content for e in logged if isinstance(e.data, UserMessageData)]
        assert prompts == ["first"]
        await session.disconnect()


async def test_k11_event_log_reads_by_cursor_and_long_polls_by_type(
    client: CopilotClient,
) -> None:
    async with ReplayServer([]) as model:
        session = await open_session(client, model)
        tail = await session.rpc.event_log.tail()
        empty = await session.rpc.event_log.read(EventLogReadRequest(cursor=tail.cursor, max=10))
        assert (empty.events, empty.has_more, empty.cursor) == ([], False, tail.cursor)

        waiting = asyncio.ensure_future(
            session.rpc.event_log.read(
                EventLogReadRequest(
                    cursor=tail.cursor, max=10, wait_ms=20_000, types=["session.title_changed"]
                )
            )
        )
        await session.log("not this one")
        await session.rpc.name.set(NameSetRequest(name="Polled"))
        read = await asyncio.wait_for(waiting, timeout=30)
        assert [e.type.value for e in read.events] == ["session.title_changed"]
        assert isinstance(read.events[0].data, SessionTitleChangedData)
        assert read.events[0].data.title == "Polled"

        whole = await session.rpc.event_log.read(EventLogReadRequest(max=1))
        assert [e.type.value for e in whole.events] == ["session.start"] and whole.has_more
        rest = await session.rpc.event_log.read(EventLogReadRequest(cursor=whole.cursor))
        assert [e.type.value for e in rest.events] == ["session.info", "session.title_changed"]
        with pytest.raises(JsonRpcError, match="not a cursor"):
            await session.rpc.event_log.read(EventLogReadRequest(cursor="later"))
        for digits in ("٣", "３", "𝟛"):  # decimal digits, but not ones a cursor holds
            with pytest.raises(JsonRpcError, match="not a cursor"):
                await session.rpc.event_log.read(EventLogReadRequest(cursor=digits))
        await session.disconnect()


async def test_k11_interest_registration_is_idempotent_to_release(client: CopilotClient) -> None:
    async with ReplayServer([]) as model:
        session = await open_session(client, model)
        interest = await session.rpc.event_log.register_interest(
            RegisterEventInterestParams(event_type="session.title_changed")
        )
        release = ReleaseEventInterestParams(handle=interest.handle)
        assert (await session.rpc.event_log.release_interest(release)).success
        assert (await session.rpc.event_log.release_interest(release)).success
        await session.disconnect()
