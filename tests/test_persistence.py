"""Spec section 5: replay (P1), crash recovery (P3, C10) and remote sessions (R1)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Recorder, clear_tool, echo_tool, open_session, roles
from trimtab import (
    Client,
    LeaseLostError,
    PermissionHandler,
    ProviderError,
    SessionError,
    SessionNotFoundError,
    StoreUnavailableError,
    Tool,
    define_tool,
)
from trimtab.events import AssistantMessageDeltaData, AssistantMessageDeltaEvent, Event
from trimtab.store import MemoryStore, SqliteStore, Store
from trimtab.testing import ScriptedModel, tool_call

SEED = "Reply with exactly FRESH_CONTEXT."


async def copy_log(events: list[Event], path: Path, session_id: str) -> None:
    """Write `events` as the whole log of a session: the state a crash would leave on disk."""
    store = SqliteStore(path)
    await store.create(session_id)
    await store.append(session_id, events, lease=None)
    await store.close()


async def test_p1_resume_rebuilds_the_same_window(client: Client) -> None:
    model = ScriptedModel(
        [
            tool_call("echo", {"text": "x"}),
            "one",
            tool_call("clear_context", {"prompt": SEED}),
            "FRESH",
        ]
    )
    session = await open_session(
        client, model, echo_tool(), clear_tool(), developer_messages=["DEV"]
    )
    await session.send_and_wait("first")
    await session.send_and_wait("clear please")
    before = session.window()
    await session.disconnect()
    resumed = await client.resume_session(
        session.session_id, provider=ScriptedModel(), tools=[echo_tool(), clear_tool()]
    )
    assert resumed.window() == before
    assert [m.role for m in before] == ["system", "developer", "user", "assistant"]
    assert resumed.context_epoch == 1


async def test_resume_keeps_config_and_marks_itself(client: Client) -> None:
    session = await open_session(
        client, ScriptedModel(["x"]), echo_tool(), model="m-1", developer_messages=["D"]
    )
    await session.send_and_wait("hi")
    await session.disconnect()
    model = ScriptedModel(["y"])
    resumed = await client.resume_session(session.session_id, provider=model, tools=[echo_tool()])
    assert resumed.config.model == "m-1" and resumed.config.developer_messages == ["D"]
    await resumed.send_and_wait("again")
    assert roles(model, 0) == [
        ("system", "SYSTEM"),
        ("developer", "D"),
        ("user", "hi"),
        ("assistant", "x"),
        ("user", "again"),
    ]
    assert model.requests[0].model == "m-1"
    types = [e.type for e in await resumed.get_events()]
    assert types.count("session.resume") == 1


async def test_D5_the_resume_event_says_whether_pending_work_continues(client: Client) -> None:
    session = await open_session(client, ScriptedModel())
    await session.disconnect()
    for continue_pending_work in (False, True):
        resumed = await client.resume_session(
            session.session_id,
            continue_pending_work=continue_pending_work,
            provider=ScriptedModel(),
        )
        await resumed.disconnect()
    events = await resumed.get_events()
    flags = [e.data.continue_pending_work for e in events if e.type == "session.resume"]
    assert flags == [False, True]


async def test_resume_of_an_open_session_returns_the_same_object(client: Client) -> None:
    session = await open_session(client, ScriptedModel())
    assert await client.resume_session(session.session_id) is session


async def test_unknown_session_and_delete(client: Client) -> None:
    with pytest.raises(SessionNotFoundError):
        await client.resume_session("no-such-session", provider=ScriptedModel())
    session = await open_session(client, ScriptedModel(["x"]))
    await session.send_and_wait("label me")
    records = await client.list_sessions()
    assert [r.session_id for r in records] == [session.session_id]
    assert records[0].summary == "label me"
    await client.delete_session(session.session_id)
    assert await client.list_sessions() == []
    with pytest.raises(SessionNotFoundError):
        await client.delete_session(session.session_id)


async def test_p3_call_in_flight_at_a_crash_is_cancelled_on_resume(tmp_path: Path) -> None:
    async def hang(params: Any) -> str:
        await asyncio.Event().wait()
        return "never"

    async with Client(store="memory") as first:
        session = await open_session(
            first, ScriptedModel([tool_call("hang")]), define_tool("hang", handler=hang)
        )
        rec = Recorder(session)
        await session.send("go")
        await rec.wait_for("tool.execution_start")
        crashed = await session.get_events()
        await session.disconnect()
    db = tmp_path / "crash.db"
    await copy_log(crashed, db, session.session_id)

    model = ScriptedModel(["recovered"])
    async with Client(store=db) as second:
        resumed = await open_resumed(second, session.session_id, model)
        completes = [e for e in await resumed.get_events() if e.type == "tool.execution_complete"]
        assert [e.data.outcome for e in completes] == ["cancelled"]
        await resumed.send_and_wait("continue")
        window = roles(model, 0)
        assert window[2:] == [
            ("assistant", ""),
            ("tool", "The execution of this tool, or a previous tool was interrupted."),
            ("user", "continue"),
        ]


async def open_resumed(client: Client, session_id: str, model: ScriptedModel) -> Any:
    return await client.resume_session(
        session_id,
        provider=model,
        tools=[clear_tool()],
        on_permission_request=PermissionHandler.approve_all,
    )


@pytest.mark.parametrize("crash_after", ["session.context_cleared", "seed user.message"])
async def test_c10_crash_between_clear_and_seed_delivers_the_seed_once(
    tmp_path: Path, crash_after: str
) -> None:
    async with Client(store="memory") as first:
        model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH"])
        session = await open_session(first, model, clear_tool())
        await session.send_and_wait("clear")
        events = await session.get_events()
    if crash_after == "session.context_cleared":
        cut = next(i for i, e in enumerate(events) if e.type == "session.context_cleared")
    else:
        cut = next(
            i
            for i, e in enumerate(events)
            if e.type == "user.message" and e.data.source == "context_cleared"
        )
    db = tmp_path / "crash.db"
    await copy_log(events[: cut + 1], db, session.session_id)

    model = ScriptedModel(["FRESH"])
    async with Client(store=db) as second:
        resumed = await open_resumed(second, session.session_id, model)
        rec = Recorder(resumed)
        await rec.wait_for("session.idle")
        assert roles(model, 0) == [("system", "SYSTEM"), ("user", SEED)]
        log = await resumed.get_events()
        seeds = [e for e in log if e.type == "user.message" and e.data.source == "context_cleared"]
        assert len(seeds) == 1
        await resumed.disconnect()
        again = await open_resumed(second, session.session_id, ScriptedModel())
        await asyncio.sleep(0.05)
        assert [e.type for e in await again.get_events()].count("assistant.message") == 2


async def test_r1_second_runtime_sees_a_remote_session_and_its_send_is_delivered(
    tmp_path: Path,
) -> None:
    db = tmp_path / "shared.db"
    async with (
        Client(store=db, poll_interval=0.02) as owner,
        Client(store=db, poll_interval=0.02) as other,
    ):
        model = ScriptedModel(["from the owner"])
        session = await open_session(owner, model)
        rec = Recorder(session)
        remote = await other.resume_session(session.session_id, provider=ScriptedModel())
        assert remote.is_remote and not session.is_remote
        await remote.send("hello from elsewhere")
        await rec.wait_for("session.idle")
        assert roles(model, 0)[-1] == ("user", "hello from elsewhere")
        assert [e.type for e in await remote.get_events()][-1] == "assistant.turn_end"


class _InboxOutage(SqliteStore):
    """A SQLite store whose read of the sessions with inputs fails its first `failures` times."""

    def __init__(self, path: Path, failures: int) -> None:
        super().__init__(path)
        self.failures = failures

    async def sessions_with_inputs(self) -> set[str]:
        if self.failures > 0:
            self.failures -= 1
            raise OSError("disk I/O error")
        return await super().sessions_with_inputs()


async def test_r1_a_remote_send_is_delivered_after_the_owners_upkeep_failed_to_read_the_inbox(
    tmp_path: Path,
) -> None:
    """The owner's upkeep reads which sessions have inputs in one query (not each inbox in
    turn): while that read fails, the input waits in the store, and it runs once it works."""
    db = tmp_path / "shared.db"
    flaky = _InboxOutage(db, failures=3)
    async with (
        Client(store=flaky, poll_interval=0.02) as owner,
        Client(store=db, poll_interval=0.02) as other,
    ):
        model = ScriptedModel(["from the owner"])
        session = await open_session(owner, model)
        rec = Recorder(session)
        remote = await other.resume_session(session.session_id, provider=ScriptedModel())
        await remote.send("hello from elsewhere")
        await rec.wait_for("session.idle")
        assert flaky.failures == 0
        assert roles(model, 0)[-1] == ("user", "hello from elsewhere")
        messages = [e for e in await session.get_events() if e.type == "user.message"]
        assert [m.data.content for m in messages] == ["hello from elsewhere"]


async def test_r1_remote_session_is_taken_over_when_the_owner_leaves(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    async with (
        Client(store=db, poll_interval=0.02) as owner,
        Client(store=db, poll_interval=0.02) as other,
    ):
        session = await open_session(owner, ScriptedModel(["one"]))
        await session.send_and_wait("first")
        model = ScriptedModel(["two"])
        remote = await other.resume_session(
            session.session_id, provider=model, on_permission_request=PermissionHandler.approve_all
        )
        assert remote.is_remote
        rec = Recorder(remote)
        await session.disconnect()
        await rec.wait_for("session.resume")
        assert not remote.is_remote
        # Every resume says whether it continues pending work; a takeover does not (D5).
        [taken] = [e for e in await remote.get_events() if e.type == "session.resume"][-1:]
        assert taken.data.continue_pending_work is False
        reply = await remote.send_and_wait("second")
        assert reply is not None and reply.data.content == "two"
        assert roles(model, 0)[-3:] == [("user", "first"), ("assistant", "one"), ("user", "second")]


class SlowToLetGo(MemoryStore):
    """A store that holds a closing session's snapshot (the first step of letting it go) until
    told, as one reconnecting after a crash does, and counts its runtime's upkeep ticks."""

    def __init__(self) -> None:
        super().__init__()
        self.letting_go = asyncio.Event()
        self.go_on = asyncio.Event()
        self.ticks = 0
        self.ticked = asyncio.Event()

    async def save_snapshot(self, session_id: str, event_count: int, data: str) -> None:
        self.letting_go.set()
        await self.go_on.wait()
        await super().save_snapshot(session_id, event_count, data)

    async def sessions_with_inputs(self) -> set[str]:
        if self.letting_go.is_set():
            self.ticks += 1
            if self.ticks >= 3:
                self.ticked.set()
        return await super().sessions_with_inputs()


async def test_r1_a_closing_session_is_never_taken_back_by_its_own_runtime() -> None:
    """While a session lets its lease go (a slow store), its runtime's upkeep sees it not
    owned: it must not take the lease again and go on with it, which would keep another
    runtime from taking the session over for the lease's whole ttl."""
    store = SlowToLetGo()
    async with Client(store=store, poll_interval=0.01) as client:
        session = await open_session(client, ScriptedModel(["hi"]))
        await session.send_and_wait("go")
        closing = asyncio.create_task(session.disconnect())
        await asyncio.wait_for(store.ticked.wait(), 30)  # upkeep ran while it let go
        store.go_on.set()
        await closing
        events = await store.read(session.session_id)
    assert "session.resume" not in [event.type for event in events]
    assert await store.acquire_lease(session.session_id, "another runtime", 60) is not None


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from trimtab import Client, PermissionHandler, define_tool
    from trimtab.testing import ScriptedModel, tool_call

    async def hang(params):
        print("TOOL_STARTED", flush=True)
        await asyncio.Event().wait()

    async def main():
        client = Client(store=sys.argv[1], lease_ttl=0.5, poll_interval=0.1)
        session = await client.create_session(
            session_id="crashy",
            provider=ScriptedModel([tool_call("hang")]),
            tools=[define_tool("hang", handler=hang)],
            on_permission_request=PermissionHandler.approve_all,
        )
        await session.send_and_wait("go")

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_p3_kill_9_mid_tool_then_resume_in_another_process(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    db: str | Path = tmp_path / "killed.db"
    if backend == "postgres":
        db = request.getfixturevalue("pg_dsn")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(db), stdout=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 30)
    assert line.strip() == b"TOOL_STARTED"
    child.kill()  # SIGKILL: no cleanup, no lease release
    await child.wait()

    await asyncio.sleep(0.6)  # past the dead owner's lease
    model = ScriptedModel(["after the crash"])
    async with Client(store=db) as survivor:
        session = await survivor.resume_session(
            "crashy", provider=model, on_permission_request=PermissionHandler.approve_all
        )
        assert not session.is_remote
        events = await session.get_events()
        types = [e.type for e in events]
        assert types.count("tool.execution_start") == types.count("tool.execution_complete") == 1
        complete = next(e for e in events if e.type == "tool.execution_complete")
        assert complete.data.outcome == "cancelled"
        reply = await session.send_and_wait("are you there?")
        assert reply is not None and reply.data.content == "after the crash"


async def crashed_log(
    tmp_path: Path, step: Any, tools: Any, wait_for: str, *, count: int = 1
) -> tuple[Path, str]:
    """Run a session until `count` `wait_for` events are logged, then keep its log as a crash
    would leave it."""
    async with Client(store="memory") as first:
        tools = tools if isinstance(tools, list) else [tools]
        # `then`: the step answers every call, and a call the crash comes before is no leftover.
        session = await open_session(first, ScriptedModel(then=lambda request: step), *tools)
        rec = Recorder(session)
        await session.send("go")
        await rec.wait_for(wait_for, count)
        crashed = await session.get_events()
        await session.disconnect()
    db = tmp_path / "crash.db"
    await copy_log(crashed, db, session.session_id)
    return db, session.session_id


async def hang(params: Any) -> str:
    await asyncio.Event().wait()
    return "never"


def probe_tool(ran: list[Any], **options: Any) -> Tool:
    """A `probe` tool that records the arguments of each call it runs."""

    def probe(params: Any) -> str:
        ran.append(params)
        return "probed"

    return define_tool("probe", handler=probe, **options)


async def test_p3_continue_pending_work_reruns_the_call_and_finishes_the_run(
    tmp_path: Path,
) -> None:

    db, session_id = await crashed_log(
        tmp_path,
        tool_call("probe", {"n": 1}),
        define_tool("probe", handler=hang),
        "tool.execution_start",
    )
    ran: list[Any] = []
    model = ScriptedModel(["finished after the crash"])
    async with Client(store=db) as second:
        resumed = await second.resume_session(
            session_id,
            continue_pending_work=True,
            provider=model,
            tools=[probe_tool(ran)],
            on_permission_request=PermissionHandler.approve_all,
        )
        rec = Recorder(resumed)
        await rec.wait_for("session.idle")
        assert ran == [{"n": 1}]
        assert rec.types.count("session.idle") == 1
        log = await resumed.get_events()
        types = [e.type for e in log]
        assert types.count("tool.execution_start") == types.count("tool.execution_complete") == 1
        assert types.count("assistant.turn_start") == types.count("assistant.turn_end") == 2
        assert next(e for e in log if e.type == "tool.execution_complete").data.outcome == "success"
        assert roles(model, 0)[-2:] == [("assistant", ""), ("tool", "probed")]
        assert log[-1].type == "assistant.turn_end" and rec.of("assistant.message")[
            0
        ].data.content == ("finished after the crash")


async def test_p3_an_idempotent_tool_reruns_on_resume_and_the_others_are_cancelled(
    tmp_path: Path,
) -> None:

    db, session_id = await crashed_log(
        tmp_path,
        [tool_call("probe", {"n": 1}), tool_call("send_mail", {"to": "x"})],
        [define_tool("probe", handler=hang), define_tool("send_mail", handler=hang)],
        "tool.execution_start",
        count=2,
    )
    ran: list[Any] = []
    model = ScriptedModel(["went on"])
    async with Client(store=db) as second:
        resumed = await second.resume_session(
            session_id,
            provider=model,
            tools=[
                probe_tool(ran, idempotent=True),
                define_tool("send_mail", handler=lambda params: "sent twice!"),
            ],
            on_permission_request=PermissionHandler.approve_all,
        )
        rec = Recorder(resumed)
        await rec.wait_for("session.idle")
        assert ran == [{"n": 1}]
        outcomes = {
            e.data.tool_name: e.data.outcome
            for e in await resumed.get_events()
            if e.type == "tool.execution_complete"
        }
        assert outcomes == {"send_mail": "cancelled", "probe": "success"}
        assert rec.of("assistant.message")[0].data.content == "went on"


async def test_o1_e4_an_abort_before_a_resumed_run_took_its_calls_up_again_ends_them(
    tmp_path: Path,
) -> None:
    """The run a crash left goes on after the resume (its call is idempotent), but an abort
    comes first: the call it never took up again ends `cancelled`, its turn is closed, then
    `abort`; before, the abort left the call started for ever."""
    db, session_id = await crashed_log(
        tmp_path,
        tool_call("probe", {"n": 1}),
        define_tool("probe", handler=hang),
        "tool.execution_start",
    )
    ran: list[Any] = []
    async with Client(store=db) as second:
        resumed = await second.resume_session(
            session_id,
            provider=ScriptedModel(),
            tools=[probe_tool(ran, idempotent=True)],
            on_permission_request=PermissionHandler.approve_all,
        )
        rec = Recorder(resumed)
        await resumed.abort()  # (before its run's task began)

        await rec.wait_for("session.idle")
        log = await resumed.get_events()
        assert ran == []
        assert [e.type for e in log][-3:] == [
            "tool.execution_complete",
            "assistant.turn_end",
            "abort",
        ]
        assert [e.data.outcome for e in log if e.type == "tool.execution_complete"] == ["cancelled"]
        assert rec.of("session.idle")[0].data.aborted


async def test_p3_crash_mid_model_call_continues_only_when_asked(tmp_path: Path) -> None:
    async def never(request: Any) -> str:
        await asyncio.Event().wait()
        return "never"

    db, session_id = await crashed_log(tmp_path, never, echo_tool(), "assistant.turn_start")
    async with Client(store=db) as second:
        quiet = await second.resume_session(session_id, provider=ScriptedModel())
        opened = await quiet.get_events()
        await asyncio.sleep(0.1)
        assert await quiet.get_events() == opened  # nothing runs on its own
        assert opened[-1].type == "session.resume"
        await quiet.disconnect()
        model = ScriptedModel(["answered at last"])
        resumed = await second.resume_session(
            session_id, continue_pending_work=True, provider=model
        )
        rec = Recorder(resumed)
        await rec.wait_for("session.idle")
        assert roles(model, 0) == [("system", "SYSTEM"), ("user", "go")]
        assert rec.of("assistant.message")[0].data.originating_message_id is not None


class CountingStore(MemoryStore):
    """A memory store that remembers where each read started."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int] = []

    async def read(self, session_id: str, *, after: int = 0) -> list[Event]:
        self.reads.append(after)
        return await super().read(session_id, after=after)


async def test_p1_opening_after_a_disconnect_starts_from_the_snapshot() -> None:
    store = CountingStore()
    async with Client(store=store) as client:
        model = ScriptedModel(["one", tool_call("clear_context", {"prompt": SEED}), "FRESH", "two"])
        session = await open_session(client, model, clear_tool())
        await session.send_and_wait("first")
        await session.send_and_wait("clear")
        window, usage, epoch = session.window(), session.usage, session.context_epoch
        count = len(await session.get_events())
        await session.disconnect()
        store.reads.clear()
        resumed = await client.resume_session(
            session.session_id,
            provider=model,
            tools=[clear_tool()],
            on_permission_request=PermissionHandler.approve_all,
        )
        assert store.reads == [count - 1]  # only the snapshot's last event, to check it
        assert (resumed.window(), resumed.usage, resumed.context_epoch) == (window, usage, epoch)
        await resumed.send_and_wait("after")
        assert roles(model, 3)[-3:] == [("user", SEED), ("assistant", "FRESH"), ("user", "after")]


async def test_p1_a_snapshot_that_does_not_fit_the_log_is_ignored() -> None:
    store = CountingStore()
    async with Client(store=store) as client:
        session = await open_session(client, ScriptedModel(["one"]))
        await session.send_and_wait("first")
        window = session.window()
        await session.disconnect()
        saved = await store.load_snapshot(session.session_id)
        assert saved is not None
        await store.save_snapshot(session.session_id, saved[0], "not json")
        resumed = await client.resume_session(session.session_id, provider=ScriptedModel())
        assert resumed.window() == window and 0 in store.reads


async def test_r1_a_remote_session_delivers_the_owners_events_live(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    async with Client(store=db) as owner, Client(store=db) as other:
        session = await open_session(owner, ScriptedModel(["from the owner"]))
        remote = await other.resume_session(session.session_id, provider=ScriptedModel())
        seen = Recorder(remote)
        await session.send_and_wait("hello")
        await seen.wait_for("session.idle")
        # The owner's idle stays in its process on SQLite: the follower tells the run's end
        # from the log, and delivers exactly one idle for it.
        assert [e.type for e in seen.events] == [
            "user.message",
            "assistant.turn_start",
            "assistant.message",
            "assistant.usage",
            "assistant.turn_end",
            "session.idle",
        ]
        assert remote.window() == session.window()
        await remote.disconnect()


@pytest.fixture(params=["memory", "postgres"])
def shared_store(request: pytest.FixtureRequest) -> Callable[[], Store | str]:
    """What two runtimes share whose live events cross between them: one in-process store
    object, or one PostgreSQL database (each runtime with a store of its own)."""
    if request.param == "memory":
        memory = MemoryStore()
        return lambda: memory
    dsn: str = request.getfixturevalue("pg_dsn")
    return lambda: dsn


async def test_r1_send_and_wait_on_a_remote_session_returns_the_owners_reply(
    shared_store: Callable[[], Store | str],
) -> None:
    async with (
        Client(store=shared_store(), poll_interval=0.02) as owner,
        Client(store=shared_store(), poll_interval=0.02) as other,
    ):
        session = await open_session(owner, ScriptedModel(["one"]))
        remote = await other.resume_session(session.session_id, provider=ScriptedModel())
        seen = Recorder(remote)
        assert remote.is_remote

        reply = await remote.send_and_wait("hello from elsewhere", timeout=10)

        assert reply is not None and reply.data.content == "one"
        # The owner's live events reach the follower too, in their places.
        assert seen.types[-2:] == ["assistant.turn_end", "session.idle"]
        assert "session.usage_info" in seen.types
        assert not any(e.ephemeral for e in await remote.get_events())
        assert remote.window() == session.window()


async def test_r1_a_failed_remote_run_raises_session_error_on_the_follower(
    shared_store: Callable[[], Store | str],
) -> None:
    async with (
        Client(store=shared_store(), poll_interval=0.02) as owner,
        Client(store=shared_store(), poll_interval=0.02) as other,
    ):
        failing = ScriptedModel([ProviderError("rate_limit", "slow down", status_code=429)])
        session = await open_session(owner, failing)
        remote = await other.resume_session(session.session_id, provider=ScriptedModel())

        with pytest.raises(SessionError, match="slow down"):
            await remote.send_and_wait("hello", timeout=10)


async def test_e5_a_follower_sees_a_turn_in_the_owners_order(
    shared_store: Callable[[], Store | str],
) -> None:
    async with (
        Client(store=shared_store(), poll_interval=0.02) as owner,
        Client(store=shared_store(), poll_interval=0.02) as other,
    ):
        session = await open_session(owner, ScriptedModel(["one", "two"]))
        remote = await other.resume_session(session.session_id, provider=ScriptedModel())
        mine, seen = Recorder(session), Recorder(remote)

        await remote.send_and_wait("first", timeout=10)
        await session.send_and_wait("second", timeout=10)
        await seen.wait_for("session.idle", 2)

        # The usage info between a reply and its turn's end, and one idle per run, each
        # where the owner delivered it.
        assert seen.types == mine.types
        assert seen.types.count("session.idle") == 2


async def test_r2_a_follower_hears_the_owner_from_the_moment_resume_session_returns(
    shared_store: Callable[[], Store | str],
) -> None:
    async with (
        Client(store=shared_store(), poll_interval=0.02) as owner,
        Client(store=shared_store(), poll_interval=0.02) as other,
    ):
        started, release = asyncio.Event(), asyncio.Event()

        async def hold(request: Any) -> str:
            started.set()
            await release.wait()
            return "held"

        session = await open_session(owner, ScriptedModel(then=lambda request: hold))
        first = asyncio.ensure_future(session.send_and_wait("first"))
        await asyncio.wait_for(started.wait(), 10)
        remote = await other.resume_session(session.session_id, provider=ScriptedModel())
        mine, seen = Recorder(session), Recorder(remote)
        # At once (the owner is busy): the queue's change is a live event, never stored.
        await session.send("second")
        release.set()
        await first
        await mine.wait_for("session.idle", 2)
        await seen.wait_for("session.idle", 2)

        assert seen.types[0] == "pending_messages.modified"
        assert seen.types == mine.types


class PublishRecorder(MemoryStore):
    """A store that records the type of every ephemeral event the runtime publishes."""

    def __init__(self) -> None:
        super().__init__()
        self.published: list[str] = []

    async def publish(self, session_id: str, event: Event, *, after: int) -> None:
        self.published.append(event.type)
        await super().publish(session_id, event, after=after)


async def test_e5_the_owner_does_not_publish_the_idle_of_a_run_its_log_ended() -> None:
    store = PublishRecorder()
    async with Client(store=store) as client:
        session = await open_session(client, ScriptedModel(["one"]))
        await session.send_and_wait("plain")
        started = asyncio.Event()

        async def hold(request: Any) -> str:
            started.set()
            await asyncio.sleep(30)
            return "never"

        session_b = await open_session(client, ScriptedModel(then=lambda request: hold))
        await session_b.send("held")
        await started.wait()
        await session_b.abort()

        # Followers deliver both idles from the logged end (a turn's end, an abort); the
        # rest of the live events are published.
        assert "session.idle" not in store.published
        assert "session.usage_info" in store.published


class CutAfterCommit(MemoryStore):
    """A store whose connection drops once, right after an append committed: the caller
    cannot know the outcome (what a database restart does to an in-flight commit)."""

    def __init__(self, cut_at: str) -> None:
        super().__init__()
        self.cut_at = cut_at

    async def append(
        self, session_id: str, events: Any, *, lease: Any, durable: bool = True
    ) -> int:
        count = await super().append(session_id, events, lease=lease, durable=durable)
        if events and events[0].type == self.cut_at:
            self.cut_at = ""
            raise StoreUnavailableError("the connection dropped during the commit")
        return count


async def test_p2_an_append_of_unknown_outcome_is_retried_and_stored_once() -> None:
    store = CutAfterCommit("assistant.message")
    async with Client(store=store) as client:
        session = await open_session(client, ScriptedModel(["stored once"]))

        reply = await session.send_and_wait("hi")

        assert reply is not None and reply.data.content == "stored once"
        types = [e.type for e in await session.get_events()]
        assert types.count("assistant.message") == 1
        assert store.cut_at == ""  # the cut happened


async def test_r1_remote_sends_queued_behind_a_long_run_are_delivered_once_in_order() -> None:
    store = MemoryStore()

    async def slow(request: Any) -> str:
        await asyncio.sleep(0.2)  # many upkeep ticks (every 0.02 s) while the run goes on
        return "answer"

    async with (
        Client(store=store, poll_interval=0.02) as owner,
        Client(store=store, poll_interval=0.02) as other,
    ):
        session = await open_session(owner, ScriptedModel(then=lambda request: slow))
        rec = Recorder(session)
        remote = await other.resume_session(session.session_id, provider=ScriptedModel())
        await session.send("local")
        await remote.send("first")
        await remote.send("second")
        await rec.wait_for("session.idle", 3)
        await asyncio.sleep(0.3)  # upkeep ticks on: nothing may be delivered again

        log = await session.get_events()
        users = [e.data.content for e in log if e.type == "user.message"]
        assert users == ["local", "first", "second"]
        assert rec.types.count("session.idle") == 3
        assert await store.pending_inputs(session.session_id) == []


class FailingAt(MemoryStore):
    """A store that refuses the append of one event type: the lease was lost meanwhile."""

    def __init__(self, event_type: str) -> None:
        super().__init__()
        self.event_type = event_type

    async def append(
        self, session_id: str, events: Any, *, lease: Any, durable: bool = True
    ) -> int:
        if events and events[0].type == self.event_type:
            raise LeaseLostError("taken over meanwhile")
        return await super().append(session_id, events, lease=lease, durable=durable)


async def test_e1_a_run_the_store_refuses_ends_in_a_typed_error_and_one_idle() -> None:
    async with Client(store=FailingAt("assistant.message")) as client:
        session = await open_session(client, ScriptedModel(["never stored"]))
        seen = Recorder(session)

        with pytest.raises(LeaseLostError):
            await session.send_and_wait("hi")

        await seen.wait_for("session.idle")
        error = seen.of("session.error")[0]
        assert (error.data.error_type, error.ephemeral) == ("lease_lost", True)
        assert seen.types[-2:] == ["session.error", "session.idle"]
        assert session.is_remote  # it stops writing


class SlowToListen(FailingAt):
    """`FailingAt`, whose subscriptions take a while to listen (PostgreSQL's first one
    connects its listener)."""

    async def subscribe(
        self, session_id: str, *, after: int = 0, ready: asyncio.Event | None = None
    ) -> AsyncGenerator[Event, None]:
        await asyncio.sleep(0.2)
        async for event in super().subscribe(session_id, after=after, ready=ready):
            yield event


async def test_r2_a_runtime_that_lost_its_lease_hears_the_new_owner_once_the_run_ended() -> None:
    store = SlowToListen("assistant.message")
    async with Client(store=store) as client:
        session = await open_session(client, ScriptedModel(["never stored"]))
        seen = Recorder(session)
        with pytest.raises(LeaseLostError):
            await session.send_and_wait("hi")

        # The new owner's first live event, at once.
        delta = AssistantMessageDeltaEvent(
            data=AssistantMessageDeltaData(message_id="m", delta_content="taken over")
        )
        count = len(await store.read(session.session_id))
        await store.publish(session.session_id, delta, after=count)

        await seen.wait_for(delta.type, timeout=5)


class DurabilityRecorder(MemoryStore):
    """A store that records, per append, its event types and whether it must be durable."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[tuple[list[str], bool]] = []

    async def append(
        self, session_id: str, events: Any, *, lease: Any, durable: bool = True
    ) -> int:
        self.appends.append(([e.type for e in events], durable))
        return await super().append(session_id, events, lease=lease, durable=durable)


async def test_e7_a_queued_input_is_stored_with_its_turn_start_in_one_append() -> None:
    """Sent while a run is in progress, the input waits in the inbox; when its run starts,
    its message and its first turn's start go in one append, before the queue's change."""
    store = DurabilityRecorder()
    async with Client(store=store) as client:
        started, release = asyncio.Event(), asyncio.Event()

        async def slow(params: Any) -> str:
            started.set()
            await release.wait()
            return "slow"

        model = ScriptedModel([tool_call("slow"), "first done", "second done"])
        session = await open_session(client, model, define_tool("slow", handler=slow))
        rec = Recorder(session)
        first = asyncio.ensure_future(session.send_and_wait("first"))
        await asyncio.wait_for(started.wait(), 10)
        await session.send("second")
        del store.appends[:]
        release.set()
        await first
        await rec.wait_for("session.idle", 2)

    opening = ["user.message", "assistant.turn_start"]
    assert [types for types, _ in store.appends].count(opening) == 1
    queued = rec.types[rec.types.index("user.message", rec.types.index("session.idle")) :]
    assert queued[:3] == [*opening, "pending_messages.modified"]


async def test_p5_a_step_waits_for_the_disk_once_for_the_send_or_the_tool_start() -> None:
    store = DurabilityRecorder()
    async with Client(store=store) as client:
        model = ScriptedModel(["plain", tool_call("echo", {"text": "x"}), "after the tool"])
        session = await open_session(client, model, echo_tool())

        del store.appends[:]
        await session.send_and_wait("one step")
        plain = store.appends[:]
        del store.appends[:]
        await session.send_and_wait("two steps")
        tool = store.appends[:]

    # Durable: the send's message (acknowledged once stored, P4), with its run's first turn
    # start, and the call's start (the handler runs after it, P3); every other append of the
    # run may lose its tail in a crash.
    opening = ["user.message", "assistant.turn_start"]
    assert [types for types, durable in plain if durable] == [opening]
    assert [types for types, durable in tool if durable] == [opening, ["tool.execution_start"]]
    assert [types[-1] for types, _ in plain][-1] == "assistant.turn_end"
    assert len(tool) > len(plain) >= 2
