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
    AcceptedEnqueueCommandResult,
    CommandsRespondToQueuedCommandRequest,
    EnqueueCommandParams,
    EventLogReadRequest,
    MetadataContextHeaviestMessagesRequest,
    MetadataContextInfoRequest,
    ModelSetReasoningEffortRequest,
    ModelSwitchToRequest,
    ModeSetRequest,
    NameSetAutoRequest,
    NameSetRequest,
    PermissionsSetApproveAllRequest,
    PermissionsSetModeRequest,
    QueueAppendSteeringRequest,
    QueuedCommandHandled,
    QueuedCommandNotHandled,
    QueueDuplicateAtRequest,
    QueueInsertAtRequest,
    QueueInsertMessage,
    QueueMoveItemRequest,
    QueuePendingItemsKind,
    QueueRemoveAtRequest,
    QueueSendNowRequest,
    QueueSetDrainPausedRequest,
    QueueUpdateTextRequest,
    QueueWithdrawMessageRequest,
    RegisterEventInterestParams,
    ReleaseEventInterestParams,
    SendAgentMode,
    SessionsForkRequest,
    ShutdownRequest,
    _InternalSessionRpc,
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
from trimtab._compaction import HANDOFF_PROMPT
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


class Held:
    """A session whose first run waits in its `hold` tool until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

        async def wait_for_release(params: NoArgs, invocation: Any) -> str:
            await self.release.wait()
            return "released"

        self.tool = define_tool(
            "hold", description="Wait", handler=wait_for_release, params_type=NoArgs
        )

    async def open(self, client: CopilotClient, model: ReplayServer) -> CopilotSession:
        session = await client.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            model="test-model",
            tools=[self.tool],
            on_permission_request=PermissionHandler.approve_all,
        )
        started = Seen(session, "tool.execution_start")
        await session.send("first")
        await started.wait_for(1)
        return session


HELD = [
    user("first"),
    assistant(None, call("call_1", "hold")),
    tool("call_1", "released"),
    assistant("First done."),
]


async def test_k9_k10_queue_lists_and_clears_the_messages_waiting(
    client: CopilotClient,
) -> None:
    held = Held()
    async with ReplayServer([conversation(*HELD)]) as model:
        session = await held.open(client, model)
        changes = Seen(session, "pending_messages.modified")
        idle = Seen(session, "session.idle")
        assert (await session.rpc.queue.pending_items()).items == []  # the run holds "first"
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
        held.release.set()
        await idle.wait_for(1)
        logged = await session.get_events()
        prompts = [e.data.content for e in logged if isinstance(e.data, UserMessageData)]
        assert prompts == ["first"]
        await session.disconnect()


async def test_x6_an_immediate_send_steers_the_running_turn(client: CopilotClient) -> None:
    """`mode: "immediate"` from the official client: listed as a steering message while it
    waits, then read by the run's next model call after the batch's results, one idle."""
    held = Held()
    recorded = conversation(*HELD[:3], user("STEER: be brief"), assistant("Brief."))
    async with ReplayServer([recorded]) as model:
        session = await held.open(client, model)
        changes = Seen(session, "pending_messages.modified")
        idle = Seen(session, "session.idle")
        steer = await session.send("STEER: be brief", mode="immediate")
        await changes.wait_for(1)
        pending = await session.rpc.queue.pending_items()
        assert (pending.items, pending.steering_messages) == ([], ["STEER: be brief"])
        held.release.set()
        await idle.wait_for(1)
        logged = await session.get_events()
        messages = [e.data for e in logged if isinstance(e.data, UserMessageData)]
        assert [(m.content, m.message_id) for m in messages][1] == ("STEER: be brief", steer)
        replies = [e.data.content for e in logged if isinstance(e.data, AssistantMessageData)]
        assert replies[-1] == "Brief." and len(idle) == 1
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


# --- issue 36: the rest of the session RPCs real programs call --------------------------------


async def test_k12_set_auto_name_names_the_session_unless_the_user_did(
    client: CopilotClient,
) -> None:
    async with ReplayServer([]) as model:
        session = await open_session(client, model)
        titles = Seen(session, "session.title_changed")
        auto = await session.rpc.name.set_auto(NameSetAutoRequest(summary="  Fix the login bug  "))
        assert auto.applied is True
        assert (await session.rpc.name.get()).name == "Fix the login bug"
        blank = await session.rpc.name.set_auto(NameSetAutoRequest(summary=" \n "))
        assert blank.applied is False
        again = await session.rpc.name.set_auto(NameSetAutoRequest(summary="Fix login\nand more"))
        assert again.applied is True  # a summary replaces a summary, first line only
        await titles.wait_for(2)
        assert [t.data.title for t in titles] == ["Fix the login bug", "Fix login"]
        session_id = session.session_id
        await session.disconnect()

        resumed = await open_session(client, model, session_id)  # the log says: automatic
        assert (await resumed.rpc.name.set_auto(NameSetAutoRequest(summary="Later"))).applied
        await resumed.rpc.name.set(NameSetRequest(name="Mine"))
        ignored = await resumed.rpc.name.set_auto(NameSetAutoRequest(summary="Ignored"))
        assert ignored.applied is False
        await resumed.disconnect()

        reopened = await open_session(client, model, session_id)
        ignored = await reopened.rpc.name.set_auto(NameSetAutoRequest(summary="Ignored"))
        assert ignored.applied is False
        assert (await reopened.rpc.name.get()).name == "Mine"
        await reopened.disconnect()


async def test_k6_set_mode_allow_all_approves_every_call_and_manual_asks_again(
    client: CopilotClient,
) -> None:
    asked: list[Any] = []

    def ask(request: Any, invocation: Any) -> Any:
        asked.append(request)
        return PermissionHandler.approve_all(request, invocation)

    echo = define_tool(
        "echo",
        description="Upper-case the text",
        handler=lambda params, invocation: params.text.upper(),
        params_type=TextArgs,
        skip_permission=False,
    )
    once = [
        user("Use echo on hi"),
        assistant(None, call("c1", "echo", text="hi")),
        tool("c1", "HI"),
    ]
    recorded = conversation(
        *once,
        assistant("It said HI."),
        user("Again"),
        assistant(None, call("c2", "echo", text="ho")),
        tool("c2", "HO"),
        assistant("It said HO."),
    )
    async with ReplayServer([recorded]) as model:
        session = await client.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            model="test-model",
            tools=[echo],
            on_permission_request=ask,
        )
        changes = Seen(session, "session.permissions_changed")
        result = await session.rpc.permissions.set_mode(
            PermissionsSetModeRequest(mode=PermissionMode.ALLOW_ALL)
        )
        assert (result.success, result.mode) == (True, PermissionMode.ALLOW_ALL)
        assert (await session.rpc.permissions.get_mode()).mode is PermissionMode.ALLOW_ALL
        await session.send_and_wait("Use echo on hi", timeout=30)
        assert asked == []
        await changes.wait_for(1)
        assert (changes[0].data.previous_mode, changes[0].data.mode) == (
            PermissionMode.MANUAL,
            PermissionMode.ALLOW_ALL,
        )

        assisted = await session.rpc.permissions.set_mode(
            PermissionsSetModeRequest(mode=PermissionMode.ASSISTED)
        )  # no judge model: not applied, and the mode stays
        assert (assisted.success, assisted.mode) == (False, PermissionMode.ALLOW_ALL)
        manual = await session.rpc.permissions.set_mode(
            PermissionsSetModeRequest(mode=PermissionMode.MANUAL)
        )
        assert (manual.success, manual.mode) == (True, PermissionMode.MANUAL)
        await session.send_and_wait("Again", timeout=30)
        assert len(asked) == 1
        await changes.wait_for(2)
        await session.disconnect()


async def test_k15_context_info_and_heaviest_messages_come_from_the_window(
    client: CopilotClient,
) -> None:
    echo = define_tool(
        "echo",
        description="Repeat the text",
        handler=lambda params, invocation: params.text * 40,
        params_type=TextArgs,
    )
    recorded = conversation(
        user("Use echo"),
        assistant(None, call("c1", "echo", text="abc ")),
        tool("c1", "abc " * 40),
        assistant("Done."),
    )
    async with ReplayServer([recorded]) as model:
        session = await client.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            model="test-model",
            system_message={"content": "You are a test assistant.", "mode": "replace"},
            tools=[echo],
            on_permission_request=PermissionHandler.approve_all,
        )
        await session.send_and_wait("Use echo", timeout=30)
        info = await session.rpc.metadata.context_info(
            MetadataContextInfoRequest(prompt_token_limit=0, output_token_limit=0)
        )
        context = info.context_info
        assert context is not None
        assert context.model_name == "test-model"
        assert context.system_tokens > 0 and context.conversation_tokens > 0
        assert context.tool_definitions_tokens > 0 and context.mcp_tools_tokens == 0
        assert context.total_tokens == (
            context.system_tokens + context.conversation_tokens + context.tool_definitions_tokens
        )
        attributed = (await session.rpc.metadata.get_context_attribution()).context_attribution
        assert attributed is not None and context.total_tokens == attributed.total_tokens
        assert context.limit == context.prompt_token_limit == attributed.limit
        given = await session.rpc.metadata.context_info(
            MetadataContextInfoRequest(
                prompt_token_limit=128_000, output_token_limit=4_096, selected_model="other"
            )
        )
        assert given.context_info is not None
        assert (given.context_info.limit, given.context_info.model_name) == (128_000, "other")
        assert given.context_info.compaction_threshold == int(128_000 * 0.8)

        heaviest = await session.rpc.metadata.get_context_heaviest_messages(
            MetadataContextHeaviestMessagesRequest(limit=2)
        )
        assert heaviest.total_tokens == context.total_tokens
        assert [(m.label, m.role) for m in heaviest.messages][:1] == [("tool: echo", "tool")]
        assert len(heaviest.messages) == 2
        assert heaviest.messages[0].tokens >= heaviest.messages[1].tokens
        every = await session.rpc.metadata.get_context_heaviest_messages(
            MetadataContextHeaviestMessagesRequest()
        )
        assert sorted(m.role for m in every.messages) == ["assistant", "assistant", "tool", "user"]
        await session.disconnect()


async def test_k14_instruction_sources_are_none_and_tool_metadata_lists_the_tools(
    client: CopilotClient,
) -> None:
    tools = [
        define_tool(
            f"tool_{i}", description=f"Tool {i}", handler=lambda p, i: "x", params_type=TextArgs
        )
        for i in range(3)
    ]
    async with ReplayServer([]) as model:
        session = await client.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            model="test-model",
            tools=tools,
            tool_search={"enabled": True, "defer_threshold": 2},
            on_permission_request=PermissionHandler.approve_all,
        )
        assert (await session.rpc.instructions.get_sources()).sources == []
        metadata = await session.rpc.tools.get_current_metadata()
        assert metadata.tools is not None
        by_name = {t.name: t for t in metadata.tools}
        assert set(by_name) == {"tool_0", "tool_1", "tool_2", "tool_search"}
        assert by_name["tool_1"].description == "Tool 1"
        assert by_name["tool_1"].defer_loading is True
        assert by_name["tool_search"].defer_loading is False
        schema = by_name["tool_0"].input_schema
        assert schema is not None and "text" in schema["properties"]
        await session.disconnect()


async def test_k17_summarize_for_handoff_is_the_models_note_and_leaves_the_window(
    client: CopilotClient,
) -> None:
    note = "## Handoff\n\nThe user greeted the agent."
    recorded = [
        conversation(user("Hi"), assistant("Hello.")),
        conversation(
            {"role": "system", "content": HANDOFF_PROMPT},
            user("Conversation to summarise:\n\n[user] Hi\n[assistant] Hello."),
            assistant(note),
        ),
    ]
    async with ReplayServer(recorded) as model:
        session = await open_session(client, model)
        assert (await session.rpc.history.summarize_for_handoff()).summary == ""
        await session.send_and_wait("Hi", timeout=30)
        before = await session.rpc.metadata.get_context_attribution()
        assert (await session.rpc.history.summarize_for_handoff()).summary == note
        after = await session.rpc.metadata.get_context_attribution()
        assert before.context_attribution is not None and after.context_attribution is not None
        assert after.context_attribution.total_tokens == before.context_attribution.total_tokens
        await session.disconnect()


async def test_k9_queue_items_are_removed_by_id_newest_first_or_withdrawn(
    client: CopilotClient,
) -> None:
    held = Held()
    async with ReplayServer([conversation(*HELD, user("keep"), assistant("Kept."))]) as model:
        session = await held.open(client, model)
        changes = Seen(session, "pending_messages.modified")
        idle = Seen(session, "session.idle")
        ids = [await session.send(p) for p in ("keep", "by-id", "withdrawn", "newest")]
        await changes.wait_for(4)

        removed = await session.rpc.queue.remove_at(QueueRemoveAtRequest(id=ids[1]))
        assert removed.removed is True
        assert (await session.rpc.queue.remove_at(QueueRemoveAtRequest(id=ids[1]))).removed is False
        changed = QueueWithdrawMessageRequest(message_id=ids[2], expected_prompt="edited")
        assert (await session.rpc.queue.withdraw_message(changed)).removed is False
        withdrawn = await session.rpc.queue.withdraw_message(
            QueueWithdrawMessageRequest(message_id=ids[2], expected_prompt="withdrawn")
        )
        assert (withdrawn.removed, withdrawn.interrupted) == (True, False)
        assert (await session.rpc.queue.remove_most_recent()).removed is True
        pending = await session.rpc.queue.pending_items()
        assert [(i.display_text, i.message_id) for i in pending.items] == [("keep", ids[0])]

        held.release.set()
        await idle.wait_for(2)
        logged = await session.get_events()
        prompts = [e.data.content for e in logged if isinstance(e.data, UserMessageData)]
        assert prompts == ["first", "keep"]
        assert (await session.rpc.queue.remove_most_recent()).removed is False
        await session.disconnect()


def ran(*prompts: str) -> list[dict[str, Any]]:
    """The model's side of runs of `prompts`, one after another, each answered "Done."."""
    return [m for p in prompts for m in (user(p), assistant("Done."))]


async def prompts_logged(session: CopilotSession) -> list[str]:
    return [
        e.data.content for e in await session.get_events() if isinstance(e.data, UserMessageData)
    ]


async def test_k18_queue_items_are_moved_inserted_reworded_and_duplicated_in_place(
    client: CopilotClient,
) -> None:
    held = Held()
    runs = ran("c", "new", "a", "a", "b, reworded")
    async with ReplayServer([conversation(*HELD, *runs)]) as model:
        session = await held.open(client, model)
        changes = Seen(session, "pending_messages.modified")
        idle = Seen(session, "session.idle")
        a, b, c = [await session.send(p) for p in ("a", "b", "c")]
        await changes.wait_for(3)
        queue = session.rpc.queue

        assert (await queue.move_item(QueueMoveItemRequest(id=c, to_position=-5))).changed
        assert not (await queue.move_item(QueueMoveItemRequest(id=c, to_position=0))).changed
        new = QueueInsertAtRequest(position=1, message=QueueInsertMessage(prompt="new"))
        inserted = (await queue.insert_at(new)).id
        reword = QueueUpdateTextRequest(id=b, prompt="b, reworded")
        assert (await queue.update_text(reword)).updated is True
        assert (await queue.update_text(reword)).updated is False
        copy = (await queue.duplicate_at(QueueDuplicateAtRequest(id=a))).id
        pending = (await queue.pending_items()).items
        assert [(i.id, i.display_text) for i in pending] == [
            (c, "c"),
            (inserted, "new"),
            (a, "a"),
            (copy, "a"),
            (b, "b, reworded"),
        ]
        with pytest.raises(JsonRpcError) as refused:
            await queue.move_item(QueueMoveItemRequest(id="nothing-waits", to_position=0))
        assert refused.value.data == {"code": "item_not_waiting"}
        await changes.wait_for(3 + 4)  # each edit that changed the queue told its watchers
        assert len(changes) == 7

        held.release.set()
        await idle.wait_for(6)
        assert await prompts_logged(session) == ["first", "c", "new", "a", "a", "b, reworded"]
        # Taken by its run meanwhile: no longer waiting, nothing changed (K18).
        with pytest.raises(JsonRpcError) as taken:
            await queue.update_text(QueueUpdateTextRequest(id=b, prompt="too late"))
        assert taken.value.data == {"code": "item_not_waiting"}
        await session.disconnect()


async def test_k19_a_paused_queue_starts_nothing_until_it_goes_on(client: CopilotClient) -> None:
    async with ReplayServer([conversation(*ran("edited"))]) as model:
        session = await open_session(client, model)
        idle = Seen(session, "session.idle")
        queue = session.rpc.queue
        await queue.set_drain_paused(QueueSetDrainPausedRequest(paused=True))
        with pytest.raises(JsonRpcError) as twice:
            await queue.set_drain_paused(QueueSetDrainPausedRequest(paused=True))
        assert twice.value.data == {"code": "queue_already_paused"}

        sent = await session.send("queued while paused")  # idle, yet it waits
        assert [i.id for i in (await queue.pending_items()).items] == [sent]
        assert (await session.rpc.metadata.is_processing()).processing is False
        edit = QueueUpdateTextRequest(id=sent, prompt="edited")
        assert (await queue.update_text(edit)).updated is True
        assert await prompts_logged(session) == []

        await queue.set_drain_paused(QueueSetDrainPausedRequest(paused=False))
        await queue.set_drain_paused(QueueSetDrainPausedRequest(paused=False))  # unowned, idle
        await idle.wait_for(1)
        assert await prompts_logged(session) == ["edited"]
        assert (await queue.pending_items()).items == []
        await session.disconnect()


async def test_k20_k21_queued_messages_are_steered_into_the_turn_and_appended_to(
    client: CopilotClient,
) -> None:
    """`sendNow` moves a queued message into the running turn's steering lane, and
    `appendSteering` adds to a steering message until the run takes it; `hasPending` and
    `snapshot` read the queue."""
    held = Held()
    recorded = conversation(
        *HELD[:3],
        user("b: be brief\n\nand kind"),
        assistant("Brief."),
        *ran("a"),
    )
    async with ReplayServer([recorded]) as model:
        session = await held.open(client, model)
        internal = _InternalSessionRpc(session.rpc._client, session.session_id)
        changes = Seen(session, "pending_messages.modified")
        idle = Seen(session, "session.idle")
        queue = session.rpc.queue
        assert (await internal.queue._has_pending()).has_pending is False
        a, b = await session.send("a"), await session.send("b: be brief")
        await changes.wait_for(2)

        assert (await queue.send_now(QueueSendNowRequest(id=b))).steered is True
        with pytest.raises(JsonRpcError) as refused:
            await queue.send_now(QueueSendNowRequest(id="nothing-waits"))
        assert refused.value.data == {"code": "item_not_waiting"}
        snapshot = await internal.queue._snapshot()
        assert ([i.id for i in snapshot.items], snapshot.steering_messages) == (
            [a],
            ["b: be brief"],
        )
        assert (await internal.queue._has_pending()).has_pending is True

        def append(expected: str) -> QueueAppendSteeringRequest:
            return QueueAppendSteeringRequest(
                message_id=b,
                prompt="and kind",
                display_prompt="and kind",
                expected_prompt=expected,
                attachments=[],
                agent_mode=SendAgentMode.INTERACTIVE,
            )

        assert (await queue.append_steering(append("stale"))).updated is False
        assert (await queue.append_steering(append("b: be brief"))).updated is True
        pending = await queue.pending_items()
        assert pending.steering_messages == ["b: be brief\n\nand kind"]

        held.release.set()
        await idle.wait_for(2)
        logged = await session.get_events()
        messages = [e.data for e in logged if isinstance(e.data, UserMessageData)]
        assert [(m.content, m.message_id) for m in messages] == [
            ("first", messages[0].message_id),
            ("b: be brief\n\nand kind", b),
            ("a", a),
        ]
        assert len(idle) == 2
        assert (await queue.append_steering(append("b: be brief\n\nand kind"))).updated is False
        assert (await internal.queue._has_pending()).has_pending is False
        await session.disconnect()


async def test_k20_send_now_with_no_run_in_flight_steers_nothing(client: CopilotClient) -> None:
    async with ReplayServer([conversation(*ran("waits"))]) as model:
        session = await open_session(client, model)
        idle = Seen(session, "session.idle")
        queue = session.rpc.queue
        await queue.set_drain_paused(QueueSetDrainPausedRequest(paused=True))
        sent = await session.send("waits")
        assert (await queue.send_now(QueueSendNowRequest(id=sent))).steered is False
        pending = await queue.pending_items()
        assert ([i.id for i in pending.items], pending.steering_messages) == ([sent], [])
        await queue.set_drain_paused(QueueSetDrainPausedRequest(paused=False))
        await idle.wait_for(1)
        assert await prompts_logged(session) == ["waits"]
        await session.disconnect()


async def test_k13_queued_commands_go_to_the_host_in_turn_with_the_messages(
    client: CopilotClient,
) -> None:
    held = Held()
    async with ReplayServer([conversation(*HELD, user("after"), assistant("After."))]) as model:
        session = await held.open(client, model)
        queued = Seen(session, "command.queued")
        completed = Seen(session, "command.completed")
        idle = Seen(session, "session.idle")
        first = await session.rpc.commands.enqueue(EnqueueCommandParams(command="/deploy prod"))
        assert isinstance(first, AcceptedEnqueueCommandResult) and first.queue_id
        after = await session.send("after")
        second = await session.rpc.commands.enqueue(
            EnqueueCommandParams(command="/second", display_text="Second command")
        )
        assert isinstance(second, AcceptedEnqueueCommandResult)
        dropped = await session.rpc.commands.enqueue(EnqueueCommandParams(command="/dropped"))
        pending = await session.rpc.queue.pending_items()
        assert [(i.kind, i.id, i.display_text) for i in pending.items] == [
            (QueuePendingItemsKind.COMMAND, first.queue_id, "/deploy prod"),
            (QueuePendingItemsKind.MESSAGE, after, "after"),
            (QueuePendingItemsKind.COMMAND, second.queue_id, "Second command"),
            (QueuePendingItemsKind.COMMAND, dropped.queue_id, "/dropped"),
        ]
        assert (await session.rpc.queue.remove_most_recent()).removed is True
        with pytest.raises(JsonRpcError, match="starts with '/'"):
            await session.rpc.commands.enqueue(EnqueueCommandParams(command="deploy"))

        held.release.set()  # the run ends: the first command's turn comes
        await queued.wait_for(1)
        assert (queued[0].data.request_id, queued[0].data.command) == (
            first.queue_id,
            "/deploy prod",
        )
        await asyncio.sleep(0.2)  # (the message behind it waits for the host's answer)
        assert [i.kind for i in (await session.rpc.queue.pending_items()).items] == [
            QueuePendingItemsKind.MESSAGE,
            QueuePendingItemsKind.COMMAND,
        ]
        answer = CommandsRespondToQueuedCommandRequest(
            request_id=first.queue_id, result=QueuedCommandHandled(stop_processing_queue=False)
        )
        assert (await session.rpc.commands.respond_to_queued_command(answer)).success is True
        assert (await session.rpc.commands.respond_to_queued_command(answer)).success is False
        await idle.wait_for(2)  # "after" ran
        await queued.wait_for(2)
        assert queued[1].data.request_id == second.queue_id
        not_run = CommandsRespondToQueuedCommandRequest(
            request_id=second.queue_id, result=QueuedCommandNotHandled()
        )
        assert (await session.rpc.commands.respond_to_queued_command(not_run)).success is True
        await completed.wait_for(2)
        assert [c.data.request_id for c in completed] == [first.queue_id, second.queue_id]
        assert (await session.rpc.queue.pending_items()).items == []
        logged = await session.get_events()
        prompts = [e.data.content for e in logged if isinstance(e.data, UserMessageData)]
        assert prompts == ["first", "after"]
        await session.disconnect()
