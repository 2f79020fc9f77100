"""The guarantees at their edges: crash points, interleavings and hostile tools (spec §1, §3,
§5), on every store. Each test names the rule it checks; the decisions of ambiguous cases are
written in docs/spec.md under the same ids."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import BaseModel, field_validator

from tests.conftest import ClearArgs, Recorder, clear_tool, echo_tool, open_session, roles
from trimtab import (
    ClearContextError,
    Client,
    PermissionHandler,
    Session,
    SessionError,
    StoreUnavailableError,
    ToolInvocation,
    TrimtabError,
    define_tool,
)
from trimtab._tools import TOOL_NAME
from trimtab.events import Event
from trimtab.store import MemoryStore, Store, open_store
from trimtab.testing import FaultyStore, ScriptedModel, tool_call

SEED = "Reply with exactly FRESH_CONTEXT."


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def durable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A store that outlives the runtimes a test crashes."""
    if request.param == "postgres":
        store = open_store(request.getfixturevalue("pg_dsn"))
    elif request.param == "sqlite":
        store = open_store(tmp_path / "durable.db")
    else:
        store = MemoryStore()
    yield store
    await store.close()


def assert_one_chain(events: list[Event]) -> None:
    """E3: one unbroken `parent_id` chain of distinct events."""
    assert len({e.id for e in events}) == len(events)
    assert events[0].parent_id is None
    for before, after in zip(events, events[1:], strict=False):
        assert after.parent_id == before.id, f"{after.type} does not follow {before.type}"


def assert_calls_complete(events: list[Event]) -> None:
    """O1: every `tool.execution_start` has exactly one `tool.execution_complete`."""
    starts = [e.data.tool_call_id for e in events if e.type == "tool.execution_start"]
    completes = [e.data.tool_call_id for e in events if e.type == "tool.execution_complete"]
    assert sorted(starts) == sorted(completes) and len(set(completes)) == len(completes)


def seeds(events: list[Event]) -> list[Event]:
    return [e for e in events if e.type == "user.message" and e.data.source == "context_cleared"]


async def never(params: Any) -> str:
    await asyncio.Event().wait()
    return "never"


# --- C8, C10: a crash between a committed clear and its batch's turn end ----------------------


@pytest.mark.parametrize("mode", ["resume", "continue_pending_work", "idempotent", "takeover"])
async def test_c10_a_crash_after_the_clear_before_its_turn_end_runs_the_seed_once(
    durable: Store, mode: str
) -> None:
    faulty = FaultyStore(durable)
    doomed = Client(store=faulty, lease_ttl=0.3, poll_interval=0.05)
    survivor = Client(store=durable, lease_ttl=5, poll_interval=0.05)
    batch = [tool_call("clear_context", {"prompt": SEED}), tool_call("sibling", {"n": 1})]
    session = await open_session(
        doomed,
        ScriptedModel([batch]),
        clear_tool(),
        define_tool("sibling", handler=never, idempotent=mode == "idempotent"),
    )
    session_id = session.session_id
    rec = Recorder(session)
    ran: list[Any] = []
    model = ScriptedModel(["FRESH_CONTEXT"])
    options: dict[str, Any] = {
        "provider": model,
        "tools": [
            clear_tool(),
            define_tool("sibling", handler=ran.append, idempotent=mode == "idempotent"),
        ],
        "on_permission_request": PermissionHandler.approve_all,
    }
    follower = None
    if mode == "takeover":
        follower = await survivor.resume_session(session_id, **options)
        assert follower.is_remote
    await session.send("clear, please")
    await rec.wait_for("session.context_cleared")
    faulty.crash()  # kill -9: the sibling never completes, the turn never ends
    if follower is not None:
        seen = Recorder(follower)
        await seen.wait_for("session.idle", timeout=20)
        resumed = follower
    else:
        await asyncio.sleep(0.4)  # past the dead runtime's lease
        resumed = await survivor.resume_session(
            session_id, continue_pending_work=mode == "continue_pending_work", **options
        )
        await Recorder(resumed).wait_for("session.idle")
    assert roles(model, 0) == [("system", "SYSTEM"), ("user", SEED)]
    log = await resumed.get_events()
    assert len(seeds(log)) == 1
    assert_one_chain(log)
    assert_calls_complete(log)
    sibling = next(
        e for e in log if e.type == "tool.execution_complete" and e.data.tool_name == "sibling"
    )
    rerun = mode in ("idempotent", "continue_pending_work")
    assert sibling.data.outcome == ("success" if rerun else "cancelled")
    assert ran == ([{"n": 1}] if rerun else [])
    # The wiped batch's results never enter the new window (C6).
    assert [m.role for m in resumed.window()] == ["system", "user", "assistant"]
    await survivor.stop()


# --- O1, §1: nothing escapes a tool call ------------------------------------------------------


class Picky(BaseModel):
    value: int

    @field_validator("value")
    @classmethod
    def refuse(cls, value: int) -> int:
        raise TypeError("not a ValueError: pydantic does not wrap it")


async def test_o1_hostile_results_validators_and_arguments_end_only_their_call(
    client: Client,
) -> None:
    deep = "[" * 5000 + "]" * 5000
    tools = [
        define_tool("opaque", handler=lambda params: object()),
        define_tool("raw_bytes", handler=lambda params: b"\xff\xfe"),
        define_tool("picky", params_type=Picky, handler=lambda params: "unreachable"),
        define_tool("deep", handler=lambda params: "unreachable"),
        echo_tool(),
    ]
    batch = [
        tool_call("opaque"),
        tool_call("raw_bytes"),
        tool_call("picky", {"value": 1}),
        tool_call("deep", f'{{"x": {deep}}}'),
        tool_call("echo", {"text": "fine"}),
    ]
    model = ScriptedModel([batch, "went on"])
    session = await open_session(client, model, *tools)
    reply = await session.send_and_wait("go")
    assert reply is not None and reply.data.content == "went on"
    log = await session.get_events()
    outcomes = {
        e.data.tool_name: e.data.outcome for e in log if e.type == "tool.execution_complete"
    }
    assert outcomes == {
        "opaque": "failure",
        "raw_bytes": "failure",
        "picky": "invalid_arguments",
        "deep": "invalid_arguments",
        "echo": "success",
    }
    assert_calls_complete(log)
    assert_one_chain(log)


# The BaseExceptions host code may raise that are its failure, not a stop (spec O4): raised
# by a sync handler (which runs in a thread) and by an async one.
HOST_FAILURES = [
    asyncio.CancelledError,  # its own: nothing cancelled the run
    SystemExit,  # a command-line `main()` called as a tool
    GeneratorExit,
    StopIteration,  # a future cannot hold it: the run used to wait for ever
    StopAsyncIteration,
    type("FrameworkStop", (BaseException,), {}),
]


def raising(kind: type[BaseException], *, is_async: bool) -> Any:
    def handler(*_: Any) -> Any:
        raise kind()

    async def async_handler(*_: Any) -> Any:
        await asyncio.sleep(0)
        raise kind()

    return async_handler if is_async else handler


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", HOST_FAILURES, ids=lambda kind: kind.__name__)
async def test_o4_any_exception_of_a_handler_is_its_calls_failure(
    client: Client, kind: type[BaseException], is_async: bool
) -> None:
    handler = raising(kind, is_async=is_async)
    failing = define_tool("failing", handler=handler)
    model = ScriptedModel([tool_call("failing"), "went on"])
    seen: list[str] = []
    hooks = {"on_post_tool_use_failure": handler, "on_pre_tool_use": handler}
    session = await open_session(client, model, failing, hooks=hooks)
    session.on("tool.execution_complete", raising(kind, is_async=False))
    session.on("tool.execution_complete", lambda event: seen.append(cast(Any, event).data.outcome))
    reply = await asyncio.wait_for(session.send_and_wait("go"), 10)
    assert reply is not None and reply.data.content == "went on"
    assert seen == ["failure"]  # the failing subscriber before it did not starve this one
    assert_calls_complete(await session.get_events())


@pytest.mark.parametrize("kind", HOST_FAILURES, ids=lambda kind: kind.__name__)
async def test_o4_any_exception_of_a_permission_handler_denies(
    client: Client, kind: type[BaseException]
) -> None:
    model = ScriptedModel([tool_call("echo", {"text": "x"}), "went on"])
    handler = raising(kind, is_async=True)
    session = await open_session(client, model, echo_tool(), on_permission_request=handler)
    reply = await asyncio.wait_for(session.send_and_wait("go"), 10)
    assert reply is not None and reply.data.content == "went on"
    [done] = [e for e in await session.get_events() if e.type == "tool.execution_complete"]
    assert done.data.outcome == "denied"


@pytest.mark.parametrize("kind", [SystemExit, asyncio.CancelledError, GeneratorExit])
async def test_o4_any_exception_of_a_provider_is_a_session_error(
    client: Client, kind: type[BaseException]
) -> None:
    class Broken(ScriptedModel):
        async def stream(self, request: Any) -> AsyncIterator[Any]:
            raise kind()
            yield  # an async generator

    session = await client.create_session(provider=Broken([]))
    with pytest.raises(SessionError, match="internal"):
        await asyncio.wait_for(session.send_and_wait("go"), 10)
    assert (await session.get_events())[-1].type == "session.error"
    assert not session.busy  # the session goes on


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_o4_an_abort_still_cancels_a_handler_and_its_call(
    client: Client, is_async: bool
) -> None:
    started, release = threading.Event(), threading.Event()

    async def slow(_: Any) -> str:
        started.set()
        await asyncio.sleep(30)
        return "unreachable"

    def blocking(_: Any) -> str:
        started.set()
        release.wait(30)  # returns after the abort: what it returns then is discarded
        return "too late"

    tool = define_tool("slow", handler=slow if is_async else blocking)
    model = ScriptedModel([tool_call("slow"), "after the abort"])
    session = await open_session(client, model, tool)
    await session.send("go")
    await asyncio.wait_for(asyncio.to_thread(started.wait, 10), 10)
    await session.abort()
    release.set()  # the sync handler's thread settles a call that is over
    await asyncio.wait_for(session.send_and_wait("again"), 10)
    [done] = [e for e in await session.get_events() if e.type == "tool.execution_complete"]
    assert done.data.outcome == "cancelled"


def test_o1_a_sync_handler_that_never_returns_does_not_keep_the_program_from_exiting() -> None:
    program = """
import asyncio, time
from trimtab import Client, PermissionHandler, define_tool
from trimtab.testing import ScriptedModel, tool_call

async def main():
    stuck = define_tool("stuck", handler=lambda _: time.sleep(3600), timeout=0.2)
    model = ScriptedModel([tool_call("stuck"), "went on"])
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=model, tools=[stuck], on_permission_request=PermissionHandler.approve_all
        )
        print((await session.send_and_wait("go")).data.content)

asyncio.run(main())
print("exited")
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["went", "on", "exited"]


# --- lone surrogates ---------------------------------------------------------------------------


async def test_lone_surrogates_from_the_model_are_cleaned_and_stored(client: Client) -> None:
    seen: list[str] = []

    def echo_and_keep(params: dict[str, str]) -> str:
        seen.append(params["text"])
        return params["text"]

    echo = define_tool("echo", handler=echo_and_keep)
    model = ScriptedModel([tool_call("echo", '{"text": "a\\ud800b"}'), "done \ud800"])
    session = await open_session(client, model, echo)
    reply = await session.send_and_wait("go")
    assert seen == ["a?b"]  # a lone surrogate cannot be stored as UTF-8: it is replaced
    assert reply is not None and reply.data.content == "done ?"
    log = await session.get_events()
    assert_calls_complete(log)
    await session.disconnect()  # the snapshot is stored too
    resumed = await client.resume_session(session.session_id, provider=ScriptedModel())
    assert resumed.window() == session.window()


async def test_c2_a_seed_with_a_lone_surrogate_is_refused_and_changes_nothing(
    client: Client,
) -> None:
    codes: list[str] = []

    def handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        try:
            invocation.session.history.clear_context("seed \ud800")
        except ClearContextError as exc:
            codes.append(exc.code)
        return "tried"

    model = ScriptedModel([tool_call("clear_context", {"prompt": "x"})])
    session = await open_session(client, model, clear_tool(handler=handler))
    await session.send_and_wait("go")
    assert codes == ["invalid_prompt"]
    assert not [e for e in await session.get_events() if e.type == "session.context_cleared"]


@pytest.mark.parametrize(
    "options",
    [
        {"system_message": "bad \ud800"},
        {"developer_messages": ["ok", "bad \udfff"]},
        {
            "provider": {
                "type": "openai",
                "base_url": "http://127.0.0.1:9/v1",
                "headers": {"X": "\ud800"},
            }
        },
        {
            "provider": {
                "type": "openai",
                "base_url": "http://127.0.0.1:9/v1",
                "headers": {"Authorization": "a\nb"},
            }
        },
    ],
)
async def test_create_refuses_text_it_cannot_store_and_leaves_nothing(
    client: Client, options: dict[str, Any]
) -> None:
    options.setdefault("provider", ScriptedModel())
    with pytest.raises(ValueError):
        await client.create_session(session_id="refused", **options)
    assert await client.list_sessions() == []
    session = await client.create_session(session_id="refused", provider=ScriptedModel())
    assert session.session_id == "refused"


@pytest.mark.parametrize("session_id", ["x" * 5000, "bad\nid", "", "\ud800"])
async def test_create_refuses_an_id_no_store_can_hold(client: Client, session_id: str) -> None:
    with pytest.raises(ValueError):
        await client.create_session(session_id=session_id, provider=ScriptedModel())
    assert await client.list_sessions() == []


async def test_a_create_whose_store_fails_leaves_no_session_and_frees_the_id(
    durable: Store,
) -> None:
    faulty = FaultyStore(durable, crash_at_write=1)
    async with Client(store=faulty) as client:
        with pytest.raises(TrimtabError):
            await client.create_session(session_id="half", provider=ScriptedModel())
        assert client._sessions == {}
    assert await durable.list_sessions() == []
    async with Client(store=durable) as client:
        session = await client.create_session(session_id="half", provider=ScriptedModel())
        assert not session.is_remote


# --- abort, disconnect ---------------------------------------------------------------------------


async def test_e1_abort_right_after_send_aborts_that_run(client: Client) -> None:
    ran: list[Any] = []
    model = ScriptedModel(then=lambda request: tool_call("effect"))
    session = await open_session(client, model, define_tool("effect", handler=ran.append))
    rec = Recorder(session)
    await session.send("go")
    await session.abort()
    await rec.wait_for("session.idle")
    assert rec.types[-2:] == ["abort", "session.idle"]
    assert rec.of("session.idle")[0].data.aborted is True
    assert ran == [] and model.requests == []
    # Its turn, started with its message in one append, is closed before the abort.
    logged = [e.type for e in await session.get_events()]
    assert logged[-4:] == ["user.message", "assistant.turn_start", "assistant.turn_end", "abort"]


async def test_r1_disconnect_from_inside_a_handler_completes_and_frees_the_session(
    client: Client,
) -> None:
    async def leave(params: Any, invocation: ToolInvocation) -> str:
        await invocation.session.disconnect()
        return "unreachable"

    session = await open_session(
        client, ScriptedModel([tool_call("leave")]), define_tool("leave", handler=leave)
    )
    await session.send_and_wait("go")
    await session.disconnect()  # the handler's disconnect goes on after the run: await it
    assert session.closed and session.is_remote
    log = await session.get_events()
    assert_calls_complete(log)
    assert [e.data.outcome for e in log if e.type == "tool.execution_complete"] == ["cancelled"]
    records = {r.session_id: r for r in await client.list_sessions()}
    assert records[session.session_id].lease_owner is None
    again = await client.resume_session(session.session_id, provider=ScriptedModel(["back"]))
    assert again is not session and not again.closed and not again.is_remote
    reply = await again.send_and_wait("hello")
    assert reply is not None and reply.data.content == "back"


async def test_a_queued_send_and_wait_dropped_by_disconnect_raises_and_stays_queued(
    client: Client,
) -> None:
    release = asyncio.Event()

    async def slow(params: Any) -> str:
        await release.wait()
        return "slow"

    model = ScriptedModel([tool_call("slow")])
    session = await open_session(client, model, define_tool("slow", handler=slow))
    rec = Recorder(session)
    await session.send("first")
    await rec.wait_for("tool.execution_start")
    queued = asyncio.ensure_future(session.send_and_wait("second"))
    await asyncio.sleep(0.05)
    await session.disconnect()
    with pytest.raises(TrimtabError, match="disconnected"):
        await queued
    later = ScriptedModel(["second done"])
    resumed = await client.resume_session(session.session_id, provider=later)
    await Recorder(resumed).wait_for("session.idle")
    assert roles(later, 0)[-1] == ("user", "second")


async def test_send_and_wait_from_a_handler_of_its_own_session_is_refused(client: Client) -> None:
    errors: list[str] = []

    async def nested(params: Any, invocation: ToolInvocation) -> str:
        try:
            await cast(Session, invocation.session).send_and_wait("inner")
        except TrimtabError as exc:
            errors.append(str(exc))
        return "ok"

    model = ScriptedModel([tool_call("nested"), "done"])
    session = await open_session(client, model, define_tool("nested", handler=nested))
    reply = await asyncio.wait_for(session.send_and_wait("go"), 10)
    assert reply is not None and reply.data.content == "done"
    assert errors and "use send()" in errors[0]


# --- C1: whose call a clear belongs to -------------------------------------------------------


async def test_c1_a_clear_of_another_session_with_a_call_in_flight_is_refused(
    client: Client,
) -> None:
    b_running, a_done = asyncio.Event(), asyncio.Event()

    async def wait_in_b(params: Any) -> str:
        b_running.set()
        await a_done.wait()
        return "b done"

    session_b = await open_session(
        client,
        ScriptedModel([tool_call("wait_in_b"), "b end"]),
        define_tool("wait_in_b", handler=wait_in_b),
    )
    codes: list[str] = []

    async def clear_b(params: Any, invocation: ToolInvocation) -> str:
        await b_running.wait()
        try:
            session_b.history.clear_context(SEED)
        except ClearContextError as exc:
            codes.append(exc.code)
        a_done.set()
        return "a done"

    session_a = await open_session(
        client,
        ScriptedModel([tool_call("clear_b"), "a end"]),
        define_tool("clear_b", handler=clear_b),
    )
    await session_b.send("b")
    await session_a.send_and_wait("a")
    await session_b.wait_idle()
    assert codes == ["no_tool_call_in_flight"]
    assert not [e for e in await session_b.get_events() if e.type == "session.context_cleared"]


# --- E3, C6 on stores whose appends await -------------------------------------------------------


async def test_e3_c6_parallel_batches_keep_one_chain_when_appends_yield(durable: Store) -> None:
    async def pause() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    store = FaultyStore(durable, pause=pause)
    async with Client(store=store) as client:
        batch = [tool_call("echo", {"text": str(i)}) for i in range(4)]
        batch.insert(2, tool_call("clear_context", {"prompt": SEED}))
        model = ScriptedModel(
            [[tool_call("echo", {"text": "a"}), tool_call("echo", {"text": "b"})], batch, "FRESH"]
        )
        session = await open_session(client, model, echo_tool(), clear_tool())
        await session.send_and_wait("go")
        log = await session.get_events()
    assert_one_chain(log)
    assert_calls_complete(log)
    cleared = next(i for i, e in enumerate(log) if e.type == "session.context_cleared")
    before = log[cleared - 1]
    assert before.type == "tool.execution_complete" and before.data.tool_name == "clear_context"


async def test_e3_a_takeover_racing_sends_keeps_one_chain(durable: Store) -> None:
    faulty = FaultyStore(durable)
    doomed = Client(store=faulty, lease_ttl=0.3, poll_interval=0.05)
    session = await open_session(doomed, ScriptedModel(["one"]))
    await session.send_and_wait("first")
    model = ScriptedModel(then=lambda request: "reply")
    async with Client(store=durable, poll_interval=0.02) as survivor:
        follower = await survivor.resume_session(session.session_id, provider=model)
        delivered = Recorder(follower)
        faulty.crash()
        sent = []
        for i in range(40):  # sends keep coming while the takeover happens
            sent.append(await follower.send(f"m{i}"))
            await asyncio.sleep(0.01)
        # Every acknowledged send is delivered, once.
        await delivered.wait_for("user.message", len(sent), timeout=20)
        await follower.wait_idle()
        log = await follower.get_events()
    assert_one_chain(log)
    ids = [e.data.message_id for e in log if e.type == "user.message"]
    assert len(ids) == len(set(ids)) and set(sent) <= set(ids)


# --- fork is inert -------------------------------------------------------------------------------


async def test_fork_inside_an_idempotent_batch_runs_nothing(client: Client) -> None:
    ran: list[Any] = []
    forks: list[Session] = []
    release = asyncio.Event()

    async def probe(params: Any) -> str:
        ran.append(params)
        await release.wait()
        return "probed"

    async def fork_here(params: Any, invocation: ToolInvocation) -> str:
        forks.append(cast(Session, await invocation.session.history.fork()))
        release.set()
        return "forked"

    model = ScriptedModel([[tool_call("probe", {"n": 1}), tool_call("fork_here")], "done"])
    session = await open_session(
        client,
        model,
        define_tool("probe", handler=probe, idempotent=True),
        define_tool("fork_here", handler=fork_here),
    )
    await session.send_and_wait("go")
    await asyncio.sleep(0.1)
    (fork,) = forks
    assert ran == [{"n": 1}] and len(model.requests) == 2
    log = await fork.get_events()
    assert_calls_complete(log)
    assert_one_chain(log)
    assert log[-1].type == "abort" and not fork.busy
    assert not {e.id for e in log} & {e.id for e in await session.get_events()}


# --- timeouts are timeouts -----------------------------------------------------------------------


async def test_o1_timeouts_only_for_the_tools_own_limit(client: Client) -> None:
    async def raises_timeout(params: Any) -> str:
        raise TimeoutError("the handler's own upstream timed out")

    async def too_slow(params: Any) -> str:
        await asyncio.sleep(30)
        return "late"

    finished = threading.Event()

    def sync_too_slow(params: Any) -> str:
        finished.wait(30)  # a blocking handler: the loop must not wait for it
        return "late"

    tools = [
        define_tool("raises_timeout", handler=raises_timeout),
        define_tool("too_slow", handler=too_slow, timeout=0.1),
        define_tool("sync_too_slow", handler=sync_too_slow, timeout=0.1),
    ]
    batch = [tool_call("raises_timeout"), tool_call("too_slow"), tool_call("sync_too_slow")]
    session = await open_session(client, ScriptedModel([batch, "after"]), *tools)
    await asyncio.wait_for(session.send_and_wait("go"), 10)
    finished.set()
    completes = {
        e.data.tool_name: e.data
        for e in await session.get_events()
        if e.type == "tool.execution_complete"
    }
    assert completes["raises_timeout"].outcome == "failure"
    assert completes["too_slow"].outcome == "timeout"
    assert completes["sync_too_slow"].outcome == "timeout"
    texts = [c.error.message for c in completes.values() if c.error is not None]
    assert not any("None" in text for text in texts)
    error = completes["too_slow"].error
    assert error is not None and "0.1 s" in error.message


# --- what send_and_wait returns, remote refusals, approvals, C5 ----------------------------------


async def test_send_and_wait_returns_the_event_as_stored(client: Client) -> None:
    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH"])
    session = await open_session(client, model, clear_tool())
    reply = await session.send_and_wait("go")
    stored = [e for e in await session.get_events() if e.type == "assistant.message"][-1]
    assert reply == stored and reply.context_epoch == 1 and reply.parent_id is not None


async def test_r1_summarize_for_handoff_on_a_remote_session_is_refused_before_any_call(
    tmp_path: Path,
) -> None:
    db = tmp_path / "shared.db"
    async with Client(store=db) as owner, Client(store=db) as other:
        session = await open_session(owner, ScriptedModel(["one"]))
        await session.send_and_wait("first")
        model = ScriptedModel(then=lambda request: "# note")
        remote = await other.resume_session(session.session_id, provider=model)
        with pytest.raises(TrimtabError, match="remote"):
            await remote.history.summarize_for_handoff()
        assert model.requests == []


async def test_approve_for_session_survives_disconnect_and_resume(client: Client) -> None:
    asked: list[str] = []

    def handler(request: Any, invocation: Any) -> dict[str, str]:
        asked.append(request.tool_name)
        return {"kind": "approve-for-session"}

    model = ScriptedModel([tool_call("echo", {"text": "1"}), "one"])
    session = await open_session(client, model, echo_tool(), on_permission_request=handler)
    await session.send_and_wait("first")
    await session.disconnect()
    model = ScriptedModel([tool_call("echo", {"text": "2"}), "two"])
    resumed = await client.resume_session(
        session.session_id, provider=model, tools=[echo_tool()], on_permission_request=handler
    )
    await resumed.send_and_wait("second")
    assert asked == ["echo"]


async def test_c5_messages_cleared_counts_exactly_the_window(client: Client) -> None:
    counts: list[int] = []

    async def handler(params: ClearArgs, invocation: ToolInvocation) -> str:
        counts.append(len(cast(Session, invocation.session).window()))
        result = await invocation.session.history.clear_context(params.prompt)
        counts.append(result.messages_cleared)
        return "cleared"

    # An empty reply renders no message: it must not be counted either.
    model = ScriptedModel(["", "answer", tool_call("clear_context", {"prompt": SEED}), "FRESH"])
    session = await open_session(client, model, clear_tool(handler=handler))
    await session.send_and_wait("one")
    await session.send_and_wait("two")
    await session.send_and_wait("three")
    window_then, cleared = counts
    # The window then held: system, one, two, answer, three (the clearing request unrendered).
    assert window_then == 5 and cleared == 5


# --- decisions of the ambiguous cases (docs/spec.md) ---------------------------------------------


async def test_c8_a_committed_clear_with_a_rejected_sibling_still_runs_the_seed(
    client: Client,
) -> None:
    def handler(request: Any, invocation: Any) -> dict[str, str]:
        return {"kind": "reject" if request.tool_name == "echo" else "approve-once"}

    batch = [tool_call("clear_context", {"prompt": SEED}), tool_call("echo", {"text": "x"})]
    model = ScriptedModel([batch, "FRESH"])
    session = await open_session(
        client, model, clear_tool(), echo_tool(), on_permission_request=handler
    )
    reply = await session.send_and_wait("go")
    assert reply is not None and reply.data.content == "FRESH"
    assert roles(model, 1) == [("system", "SYSTEM"), ("user", SEED)]


async def test_c12_abort_between_a_committed_clear_and_its_seeded_run_keeps_the_seed(
    client: Client,
) -> None:
    cleared = asyncio.Event()

    async def slow_sibling(params: Any) -> str:
        await asyncio.Event().wait()
        return "never"

    batch = [tool_call("clear_context", {"prompt": SEED}), tool_call("slow")]
    model = ScriptedModel([batch])
    session = await open_session(
        client, model, clear_tool(), define_tool("slow", handler=slow_sibling)
    )
    session.on("session.context_cleared", lambda event: cleared.set())
    await session.send("go")
    await cleared.wait()
    await session.abort()
    log = await session.get_events()
    assert len(seeds(log)) == 1 and log[-1].type == "abort"
    model.add("answered")
    await session.send_and_wait("next")
    assert roles(model, 1) == [("system", "SYSTEM"), ("user", SEED), ("user", "next")]


async def test_abort_during_a_permission_prompt_closes_the_request(client: Client) -> None:
    asked = asyncio.Event()

    async def handler(request: Any, invocation: Any) -> dict[str, str]:
        asked.set()
        await asyncio.Event().wait()
        return {"kind": "approve-once"}

    session = await open_session(
        client,
        ScriptedModel([tool_call("echo", {"text": "x"})]),
        echo_tool(),
        on_permission_request=handler,
    )
    await session.send("go")
    await asyncio.wait_for(asked.wait(), 10)
    await session.abort()
    log = await session.get_events()
    types = [e.type for e in log]
    assert types.count("permission.requested") == types.count("permission.completed") == 1
    completed = next(e for e in log if e.type == "permission.completed")
    assert completed.data.result.kind == "cancelled"
    assert_calls_complete(log)


async def test_duplicate_call_ids_in_one_response_become_distinct(client: Client) -> None:
    batch = [
        tool_call("echo", {"text": "a"}, id="same"),
        tool_call("echo", {"text": "b"}, id="same"),
    ]
    model = ScriptedModel([batch, "done"])
    session = await open_session(client, model, echo_tool())
    await session.send_and_wait("go")
    log = await session.get_events()
    ids = [e.data.tool_call_id for e in log if e.type == "tool.execution_complete"]
    assert len(set(ids)) == 2 and "same" in ids
    window = model.requests[1].messages
    calls = [c.id for c in window[-3].tool_calls]
    assert sorted(calls) == sorted(ids) and {m.tool_call_id for m in window[-2:]} == set(ids)


async def test_usage_info_is_emitted_for_summary_calls_too(client: Client) -> None:
    model = ScriptedModel(["one", "two", "three", "# summary", "# handoff"])
    session = await open_session(client, model)
    for prompt in ("a", "b", "c"):
        await session.send_and_wait(prompt)
    rec = Recorder(session)
    await session.history.compact()
    await session.history.summarize_for_handoff()
    assert len(rec.of("session.usage_info")) == 2


async def test_tools_found_by_search_are_gone_after_a_clear(client: Client) -> None:
    many = [define_tool(f"tool_{i}", handler=lambda params: "x") for i in range(5)]
    model = ScriptedModel(
        [
            tool_call("tool_search", {"query": "tool_3"}),
            [tool_call("tool_3"), tool_call("clear_context", {"prompt": SEED})],
            "FRESH",
        ]
    )
    session = await open_session(
        client, model, clear_tool(), *many, tool_search={"defer_threshold": 2}
    )
    await session.send_and_wait("go")
    assert "tool_3" in [t.name for t in model.requests[1].tools]
    assert "tool_3" not in [t.name for t in model.requests[2].tools]


# --- C11, R1: a session deleted by another runtime -------------------------------------------


async def test_a_session_deleted_elsewhere_still_disconnects_and_stop_closes_the_rest(
    durable: Store,
) -> None:
    holder = Client(store=durable)
    await holder.start()
    victim = await open_session(holder, ScriptedModel())
    others = [await open_session(holder, ScriptedModel()) for _ in range(2)]
    async with Client(store=durable) as deleter:
        await deleter.delete_session(victim.session_id)
        await victim.disconnect()  # nothing left to keep: it completes
        assert victim.closed
        await holder.stop()  # the other sessions are let go all the same
        assert all(session.closed for session in others)
        for session in others:
            resumed = await deleter.resume_session(
                session.session_id,
                provider=ScriptedModel(),
                on_permission_request=PermissionHandler.approve_all,
            )
            assert not resumed.is_remote  # its lease was released


# --- P3, W2: a run left interrupted is brought to rest by the next input -----------------------


async def test_p3_a_send_after_a_resume_without_continuing_closes_the_interrupted_run(
    durable: Store,
) -> None:
    """Before, the new run started inside the interrupted one, whose turn never ended."""
    faulty = FaultyStore(durable)
    doomed = Client(store=faulty, lease_ttl=0.3, poll_interval=0.05)
    started = asyncio.Event()

    async def hang(params: Any) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    model = ScriptedModel([tool_call("hang")])
    session = await open_session(doomed, model, define_tool("hang", handler=hang))
    await session.send("go")
    await asyncio.wait_for(started.wait(), 10)
    faulty.crash()  # the runtime dies with the turn open and the call running
    await asyncio.sleep(0.4)  # its lease lapses
    async with Client(store=durable) as client:
        resumed = await client.resume_session(
            session.session_id,
            provider=ScriptedModel(["next reply"]),
            tools=[define_tool("hang", handler=hang)],
            on_permission_request=PermissionHandler.approve_all,
        )
        reply = await asyncio.wait_for(resumed.send_and_wait("next"), 10)
        log = await resumed.get_events()
    assert reply is not None and reply.data.content == "next reply"
    assert_one_chain(log)
    assert_calls_complete(log)
    starts = [e.data.turn_id for e in log if e.type == "assistant.turn_start"]
    ends = [e.data.turn_id for e in log if e.type == "assistant.turn_end"]
    assert sorted(starts) == sorted(ends)
    types = [e.type for e in log]
    assert types.index("abort") < types.index("user.message", types.index("abort"))


@pytest.mark.parametrize("name", ["repo_browser.open_file", "", "x" * 100, "tool name"])
async def test_t6_a_call_of_a_name_no_provider_takes_back_fails_and_the_session_goes_on(
    client: Client, name: str
) -> None:
    # OpenAI refuses a history whose tool call names break the pattern: stored as the model
    # sent it, the name would fail every later request of the session.
    model = ScriptedModel([tool_call(name), "after", "next"])
    session = await open_session(client, model, echo_tool())
    await session.send_and_wait("go")
    await session.send_and_wait("again")
    pattern = re.compile(TOOL_NAME)
    for request in model.requests[1:]:
        for message in request.messages:
            assert all(pattern.fullmatch(call.name) for call in message.tool_calls)
    results = [e for e in await session.get_events() if e.type == "tool.execution_complete"]
    assert [e.data.outcome for e in results] == ["failure"]


async def test_m2_an_answer_with_more_tool_calls_than_a_turn_runs_is_a_bad_response(
    client: Client,
) -> None:
    """Before, 30,000 calls of one answer all started at once and held the loop for minutes
    (the lease lapsed); now the answer is refused, typed, and the session goes on."""
    from trimtab._loop import MAX_CALLS_PER_TURN

    calls = [tool_call("echo", {"text": "x"}, id=f"c{n}") for n in range(MAX_CALLS_PER_TURN + 1)]
    model = ScriptedModel([calls, "next"])
    session = await open_session(client, model, echo_tool())
    with pytest.raises(SessionError, match="bad_response"):
        await session.send_and_wait("go")
    reply = await session.send_and_wait("again")
    assert reply is not None and reply.data.content == "next"
    log = await session.get_events()
    assert not any(e.type == "tool.execution_start" for e in log)


# --- K18: an edit of the queue and a crash --------------------------------------------------------


@pytest.mark.parametrize("stored", [True, False], ids=["edit-stored", "edit-lost"])
async def test_k18_a_crash_during_an_edit_of_the_queue_loses_and_repeats_no_input(
    durable: Store, stored: bool
) -> None:
    faulty = FaultyStore(durable, durable=stored)
    doomed = Client(store=faulty, lease_ttl=0.3, poll_interval=0.05)
    session = await open_session(doomed, ScriptedModel([tool_call("hold")]), hold_tool())
    rec = Recorder(session)
    await session.send("first")
    await rec.wait_for("tool.execution_start")  # the first run waits: the rest queue
    ids = [await session.send(prompt) for prompt in ("a", "b", "c")]
    await session.update_pending(ids[0], "a, reworded")  # edited, stored: the crash keeps it
    faulty.crash_at_write = faulty.writes + 1  # the next edit's write is the last

    with pytest.raises(StoreUnavailableError):
        await session.move_pending(ids[2], 0)

    await asyncio.sleep(0.4)  # past the dead runtime's lease
    async with Client(store=durable, lease_ttl=5, poll_interval=0.05) as survivor:
        resumed = await survivor.resume_session(
            session.session_id, provider=ScriptedModel(["one", "two", "three"])
        )
        await resumed.wait_idle()
        prompts = [e.data.content for e in await resumed.get_events() if e.type == "user.message"]
    expected = ["c", "a, reworded", "b"] if stored else ["a, reworded", "b", "c"]
    assert prompts == ["first", *expected]


def hold_tool() -> Any:
    @define_tool(description="Wait for ever")
    async def hold(invocation: ToolInvocation) -> str:
        await asyncio.Event().wait()
        return "never"

    return hold
