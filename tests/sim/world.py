"""The simulated world of the fault simulation: one session, the runtimes that run it (each
over a `FaultyStore` that can crash it), a model that answers from a plan, hostile tools, and
the invariants every step must keep, checked against the log alone.

Everything runs on one event loop with no real I/O (a `MemoryStore` is the durable store), so
a scenario replays exactly from its seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from trimtab import (
    Client,
    PermissionDecision,
    Session,
    Tool,
    ToolError,
    ToolInvocation,
    TrimtabError,
    define_tool,
)
from trimtab._compaction import HANDOFF_PROMPT
from trimtab._session import ownership_of
from trimtab._state import state_of
from trimtab._window import estimate_tokens
from trimtab.events import Event, PermissionRequestData
from trimtab.providers import ModelRequest, ModelResponse, ProviderEvent, ToolCall, Usage
from trimtab.store import MemoryStore, SqliteStore, Store
from trimtab.testing import FaultyStore

SYSTEM = "SYSTEM"
GATED = ("slow", "idem")
"""Tools whose handlers wait for the world to open their gate (so that a crash, an abort or a
disconnect can come in the middle of them)."""

Plan = list[list[tuple[str, dict[str, Any]]] | str]
"""What the model answers to the requests of one run, in order: a batch of calls, or text."""


class PlannedModel:
    """A provider answering from the plans of the runs sent, then with plain text."""

    name = "planned"

    def __init__(self) -> None:
        self.plans: deque[list[tuple[str, dict[str, Any]]] | str] = deque()
        self.requests: list[ModelRequest] = []
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        self.requests.append(request)
        await asyncio.sleep(0)
        # It counts as the window's estimate does: the calibration (X1) stays at 1.
        tools = sum(len(t.model_dump_json()) for t in request.tools) // 4
        usage = Usage(input_tokens=estimate_tokens(request.messages) + tools)
        if request.messages[0].content == HANDOFF_PROMPT:
            # A handoff's note (spec X5) uses no plan: the runs' answers stay in order.
            yield ModelResponse(content="NOTE", usage=usage, finish_reason="stop")
            return
        step = self.plans.popleft() if self.plans else "done"
        if isinstance(step, str):
            yield ModelResponse(content=step, usage=usage, finish_reason="stop")
            return
        calls = []
        for name, arguments in step:
            self.calls += 1
            calls.append(ToolCall(id=f"c{self.calls}", name=name, arguments=json.dumps(arguments)))
        yield ModelResponse(tool_calls=tuple(calls), usage=usage)

    async def aclose(self) -> None:
        pass


@dataclass
class Gates:
    """The gates of the gated tools: open lets every waiting and future handler through."""

    opened: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self) -> None:
        await self.opened.wait()


def tools(gates: Gates, ran: list[tuple[str, Any]]) -> list[Tool]:
    """Tools for every outcome of spec section 1, clears included."""

    def ok(params: dict[str, Any]) -> str:
        ran.append(("ok", params))
        return f"ok {params.get('n')}"

    def boom(params: dict[str, Any]) -> str:
        raise ToolError("boom")

    def crashy(params: dict[str, Any]) -> object:
        return object()  # cannot be serialised: a failure, never an escape

    async def slow(params: dict[str, Any]) -> str:
        await gates.wait()
        ran.append(("slow", params))
        return "slow done"

    async def idem(params: dict[str, Any]) -> str:
        await gates.wait()
        ran.append(("idem", params))
        return "idem done"

    def clear(params: dict[str, Any], invocation: ToolInvocation) -> str:
        result = invocation.session.history.clear_context(str(params["prompt"]))
        return f"cleared {result.messages_cleared}"

    def clear_then_fail(params: dict[str, Any], invocation: ToolInvocation) -> str:
        invocation.session.history.clear_context(str(params["prompt"]))
        raise ToolError("failed after staging: the clear must leave no trace (C7)")

    return [
        define_tool("ok", handler=ok),
        define_tool("boom", handler=boom),
        define_tool("crashy", handler=crashy),
        define_tool("slow", handler=slow),
        define_tool("idem", handler=idem, idempotent=True),
        define_tool("term", handler=ok, is_terminal=True),
        define_tool("clear_context", handler=clear, is_terminal=True),
        define_tool("clear_fail", handler=clear_then_fail),
        define_tool("guarded", handler=ok),
        define_tool("denied", handler=ok),
    ]


def permissions(request: PermissionRequestData, invocation: ToolInvocation) -> PermissionDecision:
    if request.tool_name == "guarded":
        return PermissionDecision(kind="reject", feedback="no")
    if request.tool_name == "denied":
        return PermissionDecision(kind="user-not-available")
    if request.tool_name == "ok":
        return PermissionDecision(kind="approve-for-session")
    return PermissionDecision(kind="approve-once")


@dataclass
class Runtime:
    """One runtime (a process, as far as the session can tell) and its view of the session."""

    client: Client
    store: FaultyStore
    session: Session | None = None
    seen: list[Event] = field(default_factory=list)
    """Every event its session delivered, ephemeral ones included."""
    buried: bool = False
    """Its crash was accounted for and its tasks stopped."""

    @property
    def dead(self) -> bool:
        return self.store.crashed


class World:
    """The session under test, its runtimes and what has been acknowledged."""

    SESSION = "sim"

    def __init__(self, durable: Store | None = None, *, seed: int = 0) -> None:
        self.durable = durable or MemoryStore()
        self.random = random.Random(seed)
        """Decides how long each store call yields to other tasks: the interleavings."""
        self.model = PlannedModel()
        self.gates = Gates()
        self.ran: list[tuple[str, Any]] = []
        self.tools = tools(self.gates, self.ran)
        self.runtimes: list[Runtime] = []
        self.acknowledged: list[str] = []
        """Message ids `send` returned: each must run exactly once."""
        self.crashes: list[tuple[int, bool]] = []
        """(write, durable) of every crash that happened."""
        self.forks: list[Session] = []
        self.follower: Runtime | None = None
        """A runtime following the session it does not run, ready to take it over."""
        self.seen: dict[str, Event] = {}
        """Every stored event read so far, by id: the log as it would be without prunes (a
        marker takes the id of the last event it stands for, which stays here)."""
        self.prunes = 0

    # --- runtimes --------------------------------------------------------------------------

    def _options(self) -> dict[str, Any]:
        return {
            "provider": self.model,
            "tools": list(self.tools),
            "on_permission_request": permissions,
        }

    def _policy(self) -> dict[str, Any]:
        """A window the conversation outgrows within a few runs, handed off past its half
        (spec X5): the system message and tool schemas take ~560 tokens of its 1,300."""
        return {
            "model_limits": {"context_window": 1_300, "max_output_tokens": 100},
            "handoff": {"threshold": 0.5},
        }

    async def start(self) -> None:
        runtime = await self._runtime()
        session = await runtime.client.create_session(
            session_id=self.SESSION, system_message=SYSTEM, **self._options(), **self._policy()
        )
        self._attach(runtime, session)

    async def _runtime(self) -> Runtime:
        store = FaultyStore(self.durable, pause=self._pause)
        # No upkeep on its own clock (it would make scenarios depend on time): the world
        # expires leases and hands sessions over itself, as upkeep would.
        client = Client(store=store, lease_ttl=30, poll_interval=3600)
        await client.start()
        runtime = Runtime(client, store)
        self.runtimes.append(runtime)
        return runtime

    def _attach(self, runtime: Runtime, session: Session) -> None:
        runtime.session = session
        session.on(runtime.seen.append)

    async def _pause(self) -> None:
        """Every store call lets 0-3 other steps run first, as a real store's awaits would."""
        for _ in range(self.random.randint(0, 3)):
            await asyncio.sleep(0)

    @property
    def owner(self) -> Runtime:
        """The latest runtime (the one that runs the session unless it crashed)."""
        return self.runtimes[-1]

    async def resume(self, *, continue_pending: bool) -> None:
        """A new runtime opens the session (the owner crashed or let go)."""
        runtime = await self._runtime()
        session = await runtime.client.resume_session(
            self.SESSION, continue_pending_work=continue_pending, **self._options()
        )
        self._attach(runtime, session)

    def expire_leases(self) -> None:
        """The crashed runtime's lease runs out (without waiting for its TTL)."""
        if isinstance(self.durable, MemoryStore):
            for stored in self.durable._sessions.values():
                stored.lease_expires_at = 0.0
        else:
            assert isinstance(self.durable, SqliteStore)
            with contextlib.closing(sqlite3.connect(self.durable.path)) as db, db:
                db.execute("UPDATE sessions SET lease_expires_at = 0")

    async def crash(self, at_write: int | None, durable: bool) -> None:
        """Kill the owner at its `at_write`-th next write (None: now)."""
        store = self.owner.store
        store.durable = durable
        if at_write is None:
            store.crash()
        else:
            store.crash_at_write = store.writes + at_write

    def note_crash(self) -> None:
        """Account for a crash of the owner, once, and stop its tasks (the process is gone)."""
        runtime = self.owner
        if runtime.dead and runtime.session is not None and not runtime.buried:
            runtime.buried = True
            runtime.store.timeout = 0.0  # its appends give up at once, with no sleep
            self.crashes.append((runtime.store.writes, runtime.store.durable))
            runner = runtime.session._runner
            for task in (runner._worker, runner._current, ownership_of(runtime.session)._follower):
                if task is not None:
                    task.cancel()

    async def take_over(self, *, continue_pending: bool) -> None:
        """After the owner died: a follower takes the session over as its upkeep would
        (spec R1), or, with no follower, a new runtime resumes it."""
        self.note_crash()
        self.expire_leases()
        follower = self.follower
        if follower is None or follower.session is None:
            await self.resume(continue_pending=continue_pending)
            return
        self.follower = None
        self.runtimes.append(follower)  # the owner now
        lease = await follower.store.acquire_lease(
            self.SESSION, follower.client._owner, follower.client._lease_ttl
        )
        assert lease is not None
        await ownership_of(follower.session).adopt(lease)

    async def follow(self) -> None:
        """A second runtime opens the session while its owner runs it: remote (R1)."""
        if self.follower is not None or self.owner.dead:
            return
        store = FaultyStore(self.durable, pause=self._pause)
        client = Client(store=store, lease_ttl=30, poll_interval=3600)
        await client.start()
        follower = Runtime(client, store)
        session = await client.resume_session(self.SESSION, **self._options())
        self._attach(follower, session)
        if session.is_remote:
            self.follower = follower
        else:
            await client.stop()

    # --- driving ---------------------------------------------------------------------------

    async def send(self, prompt: str, plan: Plan, *, immediate: bool = False) -> None:
        session = self.owner.session
        if session is None or self.owner.dead or session.closed:
            return
        self.model.plans.extend(plan)
        mode: Any = "immediate" if immediate else "enqueue"
        with contextlib.suppress(TrimtabError):
            self.acknowledged.append(await session.send(prompt, mode=mode))

    async def clear(self, prompt: str) -> None:
        """The host clears between runs (spec X4): refused while a run is in flight."""
        session = self.owner.session
        if session is None or self.owner.dead or session.closed:
            return
        with contextlib.suppress(TrimtabError):
            result = session.history.clear_context(prompt)
            assert result.message_id is not None
            await result
            self.acknowledged.append(result.message_id)  # its seed runs exactly once

    async def prune(self) -> None:
        """Prune the log before the window's base (spec X8), as an idle session allows."""
        session = self.owner.session
        if session is None or self.owner.dead or session.closed:
            return
        await self.log()  # (everything it may remove has been seen)
        with contextlib.suppress(TrimtabError):
            if (await session.history.prune()).events_removed:
                self.prunes += 1

    async def settle(self) -> None:
        """Open the gates and wait until nothing runs (recovering from a crash if needed)."""
        self.gates.opened.set()
        async with asyncio.timeout(20):
            while True:
                if self.owner.dead:
                    await self.take_over(continue_pending=False)
                owner = self.owner
                session = owner.session
                assert session is not None
                # Idle, or dead (a crashed runtime's run never ends: stop waiting for it).
                for _ in range(200_000):
                    if owner.dead or not session.busy:
                        break
                    await asyncio.sleep(0)
                else:
                    raise AssertionError("the session never became idle")
                for _ in range(20):  # what the session's last events set going
                    await asyncio.sleep(0)
                if self.owner.dead:
                    continue
                if await self.durable.pending_inputs(self.SESSION):
                    await ownership_of(session).take_inputs()  # as the upkeep would
                elif not session.busy:
                    break
        self.gates.opened = asyncio.Event()
        self.gates.opened.clear()

    async def close(self) -> None:
        self.gates.opened.set()
        for runtime in [*self.runtimes, *([self.follower] if self.follower else [])]:
            if runtime.dead:
                if runtime.client._maintainer is not None:
                    runtime.client._maintainer.cancel()
                continue
            with contextlib.suppress(Exception):
                await runtime.client.stop()
        pending = asyncio.all_tasks() - {asyncio.current_task()}
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # --- invariants ------------------------------------------------------------------------

    async def log(self) -> list[Event]:
        """The stored log; what it holds is remembered (`seen`)."""
        log = await self.durable.read(self.SESSION)
        for event in log:
            self.seen.setdefault(event.id, event)
        return log

    def whole(self) -> list[Event]:
        """The log as it would be without prunes: every event seen, in log order."""
        return list(self.seen.values())

    async def check_always(self) -> None:
        """What holds after every step, mid-run and mid-crash included."""
        log = await self.log()
        assert_chain(log)
        assert_clears(self.whole(), complete=False)
        assert_pruned(log, self.whole())
        for request in self.model.requests:
            assert_request(request)

    async def check_settled(self) -> None:
        """What holds once nothing runs: every promise kept, from the log alone."""
        log = await self.log()
        whole = self.whole()
        assert_chain(log)
        assert_clears(whole, complete=True)
        assert_calls_complete(whole)
        assert_pruned(log, whole)
        delivered = [e.data.message_id for e in whole if e.type == "user.message"]
        for message_id in self.acknowledged:
            assert delivered.count(message_id) == 1, (
                f"input {message_id} ran {delivered.count(message_id)} times"
            )
        session = self.owner.session
        assert session is not None
        replayed = state_of(log)
        assert session.window() == replayed.window(), "the live window is not the log's"
        assert replayed.window_tokens() == estimate_tokens(replayed.window()), (
            "the window's running size is not its size"
        )
        for runtime in [*self.runtimes, *([self.follower] if self.follower else [])]:
            if not runtime.dead:
                assert_one_idle_per_run(runtime, whole)
        for fork in self.forks:
            fork_log = await self.durable.read(fork.session_id)
            assert_chain(fork_log)
            assert_calls_complete(fork_log)
            assert not fork.busy


def assert_chain(log: list[Event]) -> None:
    """E3: one unbroken chain of distinct events, starting at the session's start."""
    assert log and log[0].type == "session.start"
    assert len({e.id for e in log}) == len(log), "an event is stored twice"
    for before, after in zip(log, log[1:], strict=False):
        assert after.parent_id == before.id, f"{after.type} does not follow {before.type}"


def assert_clears(log: list[Event], *, complete: bool) -> None:
    """C6, C7, C10, X4, X5: a clear is committed only right after its own call's success,
    never by a failed call, or (the host's, a handoff's) in one append with its seed; and its
    seed is logged exactly once (at most once while runs go on)."""
    calls = {e.data.tool_call_id: e.data.tool_name for e in log if e.type == "tool.execution_start"}
    for index, event in enumerate(log):
        if event.type != "session.context_cleared":
            continue
        before, after = log[index - 1], log[index + 1] if index + 1 < len(log) else None
        seeded = (
            after is not None
            and after.type == "user.message"
            and after.data.source == "context_cleared"
            and after.data.content == event.data.initial_message
        )
        if not seeded:
            assert before.type == "tool.execution_complete" and before.data.success
            assert calls.get(before.data.tool_call_id) == "clear_context"
        following = log[index + 1 :]
        end = next(
            (i for i, e in enumerate(following) if e.type == "session.context_cleared"), None
        )
        seeds = [
            e
            for e in following[:end]
            if e.type == "user.message" and e.data.source == "context_cleared"
        ]
        assert len(seeds) <= 1, "a seed was logged twice"
        assert all(s.data.content == event.data.initial_message for s in seeds)
        if complete:
            assert len(seeds) == 1, "a committed clear's seed was lost"


def assert_pruned(log: list[Event], whole: list[Event]) -> None:
    """X8: the pruned log replays to the state and window of the whole one, at the same
    length; each marker stands at its position."""
    if not any(e.type == "session.pruned" for e in log):
        return
    pruned, full = state_of(log), state_of(whole)
    assert pruned.window() == full.window(), "the pruned log's window is not the log's"
    assert (pruned.event_count, pruned.epoch, pruned.usage, pruned.config) == (
        full.event_count,
        full.epoch,
        full.usage,
        full.config,
    )
    assert (pruned.run_id, pruned.pending_seed, pruned.open_turn) == (
        full.run_id,
        full.pending_seed,
        full.open_turn,
    )
    for event in log:
        if event.type == "session.pruned":
            at = [e.id for e in whole].index(event.id) + 1
            assert event.data.position == at, "a marker is not where it stands"


def assert_calls_complete(log: list[Event]) -> None:
    """O1: each started call completes exactly once."""
    starts = [e.data.tool_call_id for e in log if e.type == "tool.execution_start"]
    completes = [e.data.tool_call_id for e in log if e.type == "tool.execution_complete"]
    assert len(set(completes)) == len(completes), "a call completed twice"
    assert sorted(starts) == sorted(completes), "a call never completed"


def assert_request(request: ModelRequest) -> None:
    """No model call against an emptied window (C8): there is always a conversation, and it
    never ends with the assistant."""
    conversation = [m for m in request.messages if m.role not in ("system", "developer")]
    assert conversation, "the model was called on a window with no conversation"
    assert conversation[-1].role in ("user", "tool")


def assert_one_idle_per_run(runtime: Runtime, log: list[Event]) -> None:
    """E1, E5: every run this runtime ran or followed ends in exactly one idle, right after the
    stored event that ended it in the log (the loop and the log agree on where a run ends).
    The queue's notices belong to no run: one may come between (K9)."""
    state = state_of([])
    ending = {event.id for event in log if state.apply(event)}
    seen = [event for event in runtime.seen if event.type != "pending_messages.modified"]
    for index, event in enumerate(seen):
        if event.type == "session.idle" and index:  # (a runtime may miss its first events)
            assert seen[index - 1].id in ending, "an idle that ends no run"
        elif event.id in ending:
            assert index + 1 < len(seen), "a run ended without its idle"
            assert seen[index + 1].type == "session.idle", "a run's end is not followed by its idle"
