"""The simulated world of the fault simulation: one session, the runtimes that run it (each
over a `FaultyStore` that can crash it), a model that answers from a plan (and summarises when
asked to compact, or fails to), hostile tools, and the invariants every step must keep,
checked against the log alone.

Everything runs on one event loop with no real I/O and no threads (every tool is async: a
sync handler's thread would finish whenever the OS lets it, and a scenario must replay
exactly from its seed), and no timer of the runtime fires (the world expires leases itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
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
from trimtab._compaction import COMPACTION_PROMPT, HANDOFF_PROMPT, KEPT_CHARS, SUMMARY_PREFIX
from trimtab._errors import ProviderError
from trimtab._session import ownership_of
from trimtab._state import SessionState, state_of
from trimtab._tools import SessionHandle
from trimtab._window import estimate_tokens
from trimtab.events import (
    AssistantMessageEvent,
    Event,
    Message,
    PermissionRequestData,
    SessionPrunedEvent,
    ToolExecutionCompleteEvent,
    UserMessageEvent,
)
from trimtab.providers import ModelRequest, ModelResponse, ProviderEvent, ToolCall, Usage
from trimtab.store import Lease, MemoryStore, SqliteStore, Store
from trimtab.testing import FaultyStore

SYSTEM = "SYSTEM"
CUT_NOTE = "characters cut: the context window could not hold them]"
"""The end of a text X3 cut to fit the window."""
GATED = ("slow", "idem")
"""Tools whose handlers wait for the world to open their gate (so that a crash, an abort or a
disconnect can come in the middle of them)."""
TERMINAL = ("term", "clear_context")
"""The terminal tools, as the world defines them (not as the log says)."""
NEVER_RUN = ("guarded", "denied")
"""Tools whose calls the permission handler rejects or denies: their handlers never run."""
REACHABLE = (
    "compacted automatically",
    "compacted, the summary failed",
    "compacted, then turns dropped",
    "a crash after a committed clear",
    "a call ran again (idempotent)",
    "a call ran again (continue_pending_work)",
    "a terminal call succeeded",
)
"""The points of interest `World.reached` tells."""

LEASE_TTL = 86_400.0
"""Seconds a runtime's lease lasts, and between its upkeep's rounds: longer than any scenario,
so that no lease runs out, and no upkeep comes, at a moment the wall clock decides (the world
expires leases and takes inputs in itself, as upkeep would)."""

Plan = list[list[tuple[str, dict[str, Any]]] | str]
"""What the model answers to the requests of one run, in order: a batch of calls, or text."""


class PlannedModel:
    """A provider answering from the plans of the runs sent, then with plain text; a
    compaction's summary request gets a summary, or fails when `fails()` says so."""

    name = "planned"

    def __init__(self) -> None:
        self.plans: deque[list[tuple[str, dict[str, Any]]] | str] = deque()
        self.requests: list[tuple[ModelRequest, int]] = []
        """Each request but summaries and handoff notes, with the length of the durable log
        (in positions) when it came."""
        self.calls = 0
        self.fails: Callable[[], bool] = lambda: False
        self.log_length: Callable[[], int] = lambda: 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        # It counts as the window's estimate does: the calibration (X1) stays at 1.
        tools = sum(len(t.model_dump_json()) for t in request.tools) // 4
        usage = Usage(input_tokens=estimate_tokens(request.messages) + tools)
        if is_summary(request) or request.messages[0].content == HANDOFF_PROMPT:
            # A summary, or a handoff's note (spec X5): no plan, so the runs' answers stay in
            # order; either may fail (then compaction goes on without, or takes the handoff's
            # place).
            await asyncio.sleep(0)
            if self.fails():
                raise ProviderError("provider_unavailable", "the summary failed (simulated)")
            yield ModelResponse(content="SUMMARY", usage=usage, finish_reason="stop")
            return
        self.requests.append((request, self.log_length()))
        await asyncio.sleep(0)
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


def is_summary(request: ModelRequest) -> bool:
    """A compaction's summary request (the only requests sent without tools, here)."""
    first = request.messages[0] if request.messages else None
    return first is not None and first.content.startswith(COMPACTION_PROMPT[:40])


@dataclass
class Gates:
    """The gates of the gated tools: open lets every waiting and future handler through."""

    opened: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self) -> None:
        await self.opened.wait()


Ran = Callable[[ToolInvocation], None]
"""Told of every handler as it starts."""


def tools(gates: Gates, ran: Ran) -> list[Tool]:
    """Tools for every outcome of spec section 1, clears included; all async (see above)."""

    async def ok(params: dict[str, Any], invocation: ToolInvocation) -> str:
        ran(invocation)
        return f"ok {params.get('n')}" + "." * int(params.get("pad", 0))

    async def boom(params: dict[str, Any], invocation: ToolInvocation) -> str:
        ran(invocation)
        raise ToolError("boom")

    async def crashy(params: dict[str, Any], invocation: ToolInvocation) -> object:
        ran(invocation)
        return object()  # cannot be serialised: a failure, never an escape

    async def gated(params: dict[str, Any], invocation: ToolInvocation) -> str:
        ran(invocation)
        await gates.wait()
        return f"{invocation.tool_name} done"

    async def clear(params: dict[str, Any], invocation: ToolInvocation) -> str:
        ran(invocation)
        result = invocation.session.history.clear_context(str(params["prompt"]))
        return f"cleared {result.messages_cleared}"

    async def clear_then_fail(params: dict[str, Any], invocation: ToolInvocation) -> str:
        ran(invocation)
        invocation.session.history.clear_context(str(params["prompt"]))
        raise ToolError("failed after staging: the clear must leave no trace (C7)")

    return [
        define_tool("ok", handler=ok),
        define_tool("boom", handler=boom),
        define_tool("crashy", handler=crashy),
        define_tool("slow", handler=gated),
        define_tool("idem", handler=gated, idempotent=True),
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


class SimStore(FaultyStore):
    """A `FaultyStore` that can also be told to crash at the `after`-th write after the one
    that commits a clear: between the clear and its seed's answer (C10), a point a crash at
    a random write rarely hits."""

    after_clear: tuple[int, bool] | None = None
    """(after, durable) of the crash to come once a clear commits."""
    crashed_after_clear = False

    async def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        lease: Lease | None,
        durable: bool = True,
    ) -> int:
        armed = self.after_clear
        if armed is not None and any(e.type == "session.context_cleared" for e in events):
            self.after_clear = None
            self.crash_at_write, self.durable = self.writes + 1 + armed[0], armed[1]
            self.crashed_after_clear = True
        return await super().append(session_id, events, lease=lease, durable=durable)


@dataclass
class Runtime:
    """One runtime (a process, as far as the session can tell) and its view of the session."""

    client: Client
    store: SimStore
    session: Session | None = None
    seen: list[Event] = field(default_factory=list)
    """Every event its session delivered, ephemeral ones included."""
    buried: bool = False
    """Its crash was accounted for and its tasks stopped."""
    continues_pending: bool = False
    """It opened the session with `continue_pending_work=True`: it may run again any call a
    crash interrupted (P3)."""

    @property
    def dead(self) -> bool:
        return self.store.crashed


class World:
    """The session under test, its runtimes and what has been acknowledged."""

    SESSION = "sim"

    def __init__(
        self,
        durable: Store | None = None,
        *,
        seed: int = 0,
        context_window: int | None = None,
        summaries_fail: float = 0.0,
        handoff: float | None = None,
    ) -> None:
        self.durable = durable or MemoryStore()
        self.random = random.Random(seed)
        """Decides how long each store call yields to other tasks: the interleavings (and
        which summaries fail)."""
        self.context_window = context_window
        """The model's context window; None: the default (128k), which nothing here fills."""
        self.handoff = handoff
        """The handoff policy's threshold (spec X5); None: off, compaction instead."""
        self.model = PlannedModel()
        self.model.fails = lambda: self.random.random() < summaries_fail
        self.model.log_length = self._log_length
        self.checked_requests = 0
        self.gates = Gates()
        self.ran: list[tuple[str, str, SessionHandle]] = []
        """(call id, tool, session) of every handler that started, in order."""
        self.tools = tools(self.gates, self._ran)
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
        options: dict[str, Any] = {
            "provider": self.model,
            "tools": list(self.tools),
            "on_permission_request": permissions,
        }
        if self.context_window is not None:
            limits = {"context_window": self.context_window, "max_output_tokens": 100}
            options["model_limits"] = limits
        return options

    def _ran(self, invocation: ToolInvocation) -> None:
        # (By its session: a resume may run calls before `resume_session` returns it.)
        self.ran.append((invocation.tool_call_id, invocation.tool_name, invocation.session))

    def runtime_of(self, session: SessionHandle) -> int:
        """The index of the runtime whose session it is (-1: none)."""
        return next((i for i, r in enumerate(self.runtimes) if r.session is session), -1)

    def _log_length(self) -> int:
        """The durable log's length now, in positions (a prune keeps them, X8), read without
        awaiting: no step of the scenario may depend on when the model was asked."""
        if isinstance(self.durable, MemoryStore):
            stored = self.durable._sessions.get(self.SESSION)
            return 0 if stored is None else stored.count
        assert isinstance(self.durable, SqliteStore)
        with contextlib.closing(sqlite3.connect(self.durable.path)) as db:
            row = db.execute(
                "SELECT last_seq FROM sessions WHERE session_id = ?", (self.SESSION,)
            ).fetchone()
        return 0 if row is None else int(row[0])

    async def start(self) -> None:
        # The handoff policy is logged with the configuration: a resume keeps it.
        handoff: dict[str, Any] = {}
        if self.handoff is not None:
            handoff["handoff"] = {"threshold": self.handoff}
        runtime = await self._runtime()
        session = await runtime.client.create_session(
            session_id=self.SESSION, system_message=SYSTEM, **self._options(), **handoff
        )
        self._attach(runtime, session)

    def _store(self) -> SimStore:
        store = SimStore(self.durable)
        store.pause = lambda: self._pause(store)
        return store

    async def _runtime(self) -> Runtime:
        store = self._store()
        client = Client(store=store, lease_ttl=LEASE_TTL, poll_interval=LEASE_TTL)
        await client.start()
        runtime = Runtime(client, store)
        self.runtimes.append(runtime)
        return runtime

    def _attach(self, runtime: Runtime, session: Session) -> None:
        runtime.session = session
        session.on(runtime.seen.append)

    async def _pause(self, store: SimStore) -> None:
        """Every store call lets 0-3 other steps run first, as a real store's awaits would.
        A dead runtime's calls draw nothing: the order in which its tasks fail (a task
        group's cancellations go by the tasks' addresses) must not decide what comes next."""
        if store.crashed:
            return
        for _ in range(self.random.randint(0, 3)):
            await asyncio.sleep(0)

    @property
    def owner(self) -> Runtime:
        """The latest runtime (the one that runs the session unless it crashed)."""
        return self.runtimes[-1]

    async def resume(self, *, continue_pending: bool) -> None:
        """A new runtime opens the session (the owner crashed or let go)."""
        runtime = await self._runtime()
        runtime.continues_pending = continue_pending
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

    def crash_after_clear(self, after: int, durable: bool) -> None:
        """Kill the owner at its `after`-th write after its next committed clear."""
        store = self.owner.store
        if store.crash_at_write is None or store.crash_at_write <= store.writes:
            store.after_clear = (after, durable)

    def note_crash(self) -> None:
        """Account for a crash of the owner, once, and stop its tasks (the process is gone)."""
        runtime = self.owner
        if runtime.dead and runtime.session is not None and not runtime.buried:
            runtime.buried = True
            runtime.store.timeout = 0.0  # its appends give up at once, with no sleep
            self.crashes.append((runtime.store.writes, runtime.store.durable))
            runner = runtime.session._runner
            follower = ownership_of(runtime.session)._follower
            for task in (runner._worker, runner._current, follower and follower[0]):
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
        store = self._store()
        client = Client(store=store, lease_ttl=LEASE_TTL, poll_interval=LEASE_TTL)
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
        """The host clears between runs (spec X4): refused while a run is in flight, but
        for a call in flight, whose clear it is (C1)."""
        session = self.owner.session
        if session is None or self.owner.dead or session.closed:
            return
        with contextlib.suppress(TrimtabError):
            result = session.history.clear_context(prompt)
            await result
            if result.message_id is not None:
                self.acknowledged.append(result.message_id)  # its seed runs exactly once
            # (Else a call of a run a crash left was running: the clear is that call's, C1.)

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

    async def reached(self) -> set[str]:
        """The points of interest the scenario reached, for the simulation's statistics."""
        await self.log()
        log = self.whole()
        clears = [e.data.initial_message for e in log if e.type == "session.context_cleared"]
        warnings = [e.data.message for e in log if e.type == "session.warning"]
        starts = [e.data.trigger for e in log if e.type == "session.compaction_start"]
        runs: dict[str, list[int]] = {}
        names = {}
        for call_id, name, session in self.ran:
            runs.setdefault(call_id, []).append(self.runtime_of(session))
            names[call_id] = name
        points = {
            "compacted automatically": "threshold" in starts,
            "handed off (X5)": any(c.startswith("SUMMARY") for c in clears),
            "the host cleared (X4)": any(c.startswith("HOSTSEED-") for c in clears),
            "a steering message taken (X6)": any(
                e.type == "user.message" and e.data.source == "immediate" for e in log
            ),
            "pruned (X8)": self.prunes > 0,
            "compacted, the summary failed": any("summarising failed" in w for w in warnings),
            "compacted, then turns dropped": any("still too large" in w for w in warnings),
            "a crash after a committed clear": any(
                r.store.crashed_after_clear and r.dead for r in self.runtimes
            ),
            "a call ran again (idempotent)": any(
                len(r) > 1 and names[c] == "idem" for c, r in runs.items()
            ),
            "a call ran again (continue_pending_work)": any(
                len(r) > 1 and names[c] != "idem" for c, r in runs.items()
            ),
            "a terminal call succeeded": any(
                e.type == "tool.execution_complete"
                and e.data.success
                and e.data.tool_name == "term"
                for e in log
            ),
        }
        return {what for what, yes in points.items() if yes}

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
        self.assert_ran(self.whole())

    def assert_ran(self, log: list[Event]) -> None:
        """P3, P5, R1: a handler runs only once its call's start is stored, never for a call
        that was denied or rejected, at most once per runtime, and again in another runtime
        only when its tool is idempotent or that runtime continues the crashed run's work."""
        started = {e.data.tool_call_id for e in log if e.type == "tool.execution_start"}
        runs: dict[str, list[int]] = {}
        for call_id, name, session in self.ran:
            runtime = self.runtime_of(session)
            assert call_id in started, f"{name} {call_id} ran before its start was stored"
            assert name not in NEVER_RUN, f"{name} {call_id} ran without permission"
            assert runtime >= 0, f"{name} {call_id} ran in a session no runtime owns"
            earlier = runs.setdefault(call_id, [])
            assert runtime not in earlier, f"{name} {call_id} ran twice in one runtime"
            if earlier and name != "idem":
                assert self.runtimes[runtime].continues_pending, (
                    f"{name} {call_id} (not idempotent) ran again after a crash"
                )
            earlier.append(runtime)

    async def check_settled(self) -> None:
        """What holds once nothing runs: every promise kept, from the log alone."""
        log = await self.log()
        whole = self.whole()
        assert_chain(log)
        assert_clears(whole, complete=True)
        assert_calls_complete(whole)
        assert_pruned(log, whole)
        # (Properties of the whole log, checked here only: each step's check would replay it.)
        replayed, ending = assert_run_ends(whole)
        for request, logged in self.model.requests[self.checked_requests :]:
            assert_request(request, whole[:logged])
        self.checked_requests = len(self.model.requests)
        delivered = [e.data.message_id for e in whole if e.type == "user.message"]
        for message_id in self.acknowledged:
            assert delivered.count(message_id) == 1, (
                f"input {message_id} ran {delivered.count(message_id)} times"
            )
        session = self.owner.session
        assert session is not None
        assert session.window() == replayed.window(), "the live window is not the log's"
        assert_no_orphans(replayed.window())
        assert replayed.window_tokens() == estimate_tokens(replayed.window()), (
            "the window's running size is not its size"
        )
        for runtime in [*self.runtimes, *([self.follower] if self.follower else [])]:
            if not runtime.dead:
                assert_one_idle_per_run(runtime, ending)
        for fork in self.forks:
            fork_log = await self.durable.read(fork.session_id)
            assert_chain(fork_log)
            assert_fork_calls_complete(fork_log)
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
            if not event.data.initial_message.startswith("HOSTSEED-"):
                # (The host's clear made while a call runs is that call's, C1.)
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


def assert_fork_calls_complete(log: list[Event]) -> None:
    """O1 in a fork. Its copy of a prune's marker (X8) stands for the events before the
    window's base, the starts of calls that complete after it among them: there, each call
    started after the marker completes exactly once, and none completes twice."""
    for index, event in enumerate(log):
        if isinstance(event, SessionPrunedEvent):
            after = log[index + 1 :]
            starts = {e.data.tool_call_id for e in after if e.type == "tool.execution_start"}
            completes = [e.data.tool_call_id for e in after if e.type == "tool.execution_complete"]
            assert len(set(completes)) == len(completes), "a call completed twice"
            assert starts <= set(completes), "a call never completed"
            return
    assert_calls_complete(log)


def assert_calls_complete(log: list[Event]) -> None:
    """O1: each started call completes exactly once; section 1: as its outcome says (what a
    Copilot client reads: `success` for a success only, else the outcome as `error.code`)."""
    starts = [e.data.tool_call_id for e in log if e.type == "tool.execution_start"]
    completes = [e.data for e in log if e.type == "tool.execution_complete"]
    assert len({c.tool_call_id for c in completes}) == len(completes), "a call completed twice"
    assert sorted(starts) == sorted(c.tool_call_id for c in completes), "a call never completed"
    for complete in completes:
        if complete.success:
            assert complete.outcome == "success" and complete.error is None, complete
            assert complete.result is not None, complete
        else:
            assert complete.error is not None and complete.error.code == complete.outcome, complete
            assert complete.outcome != "success" and complete.result is None, complete


def assert_request(request: ModelRequest, log: list[Event]) -> None:
    """C8, H1, T4: what the model is asked, against the log when it was asked. Never an
    emptied window; a run's first request ends with the run's prompt, whatever compaction
    did (H1, X3), and a later one with the results of the run's previous turn (or the summary
    that replaced them); no call without its result, no result without its call."""
    conversation = [m for m in request.messages if m.role not in ("system", "developer")]
    assert conversation, "the model was called on a window with no conversation"
    last = conversation[-1]
    assert last.role in ("user", "tool"), "a request ends with the assistant"
    assert_no_orphans(request.messages)
    turn = max(i for i, e in enumerate(log) if e.type == "assistant.turn_start")
    message = max(
        i for i, e in enumerate(log[:turn]) if e.type == "user.message" and e.data.source != "hook"
    )
    completed = {e.data.tool_call_id for e in log if isinstance(e, ToolExecutionCompleteEvent)}
    answered = [  # (the window leaves out a reply whose calls a crash left unstarted, P3)
        e
        for e in log[message:turn]
        if isinstance(e, AssistantMessageEvent)
        and (e.data.content or any(r.tool_call_id in completed for r in e.data.tool_requests or ()))
    ]
    if answered:
        summarised = last.role == "user" and last.content.startswith(SUMMARY_PREFIX)
        assert last.role == "tool" or summarised, "a later turn is not asked about its results"
    else:
        prompt = log[message]
        assert isinstance(prompt, UserMessageEvent)
        # (Verbatim, unless the window cannot hold it: X3 cuts it from its end, and says so.)
        cut = last.content.endswith(CUT_NOTE) and prompt.data.content.startswith(
            last.content[:KEPT_CHARS]
        )
        assert last.role == "user" and (last.content == prompt.data.content or cut), (
            "a run's first request does not end with its prompt"
        )


def assert_no_orphans(messages: Sequence[Message]) -> None:
    """T4, P3: each tool result follows the assistant message that asked for it, and every
    call of that message has its result."""
    asked: list[str] = []
    for message in messages:
        if message.role == "tool":
            assert message.tool_call_id in asked, "a result without its call"
            asked.remove(message.tool_call_id)
            continue
        assert not asked, "a call without its result"
        asked = [call.id for call in message.tool_calls]
    assert not asked, "a call without its result"


def assert_run_ends(log: list[Event]) -> tuple[SessionState, set[str]]:
    """T1-T3, O2, C8, E5, X4-X6: the runs of the log end where the rules say, told from the tools as
    the world defines them (not from what the log says of them): after a turn whose model
    answered without calls, or whose batch had a terminal call succeed (T1) or a call
    rejected (O2), unless a clear committed in it (C8); a failed terminal call ends nothing
    (T2). Also at a `session.error` or an `abort`. No model call comes after a run's end
    before the next run's message; and the runtime's own reading of the log agrees. Returns
    that reading (the log's replay) and the events that ended runs."""
    state = SessionState()
    ending: set[str] = set()
    names: dict[str, str] = {}
    open_run = False
    turn: dict[str, Any] | None = None
    for event in log:
        ends = False
        match event.type:
            case "user.message" if event.data.source == "immediate":
                assert open_run, "a steering message taken outside a run (X6)"
            case "user.message" if event.data.source == "context_cleared":
                open_run = True  # the clear's run goes on as its seed's (C8, X5), or the
                # host's seed runs as its own (X4)
            case "user.message" if event.data.source != "hook":
                assert not open_run, "a run started while another was open in the log"
                open_run = True
            case "session.truncated":
                open_run = False  # (a crashed run the rewound window no longer holds)
            case "assistant.turn_start":
                assert open_run, "a model call outside a run (T1, E5)"
                turn = {"answered": False, "calls": {}, "outcomes": {}, "cleared": False}
            case "assistant.message" if turn is not None:
                turn["answered"] = True
                turn["calls"] = {r.tool_call_id: r.name for r in event.data.tool_requests or ()}
            case "tool.execution_start":
                names[event.data.tool_call_id] = event.data.tool_name
            case "tool.execution_complete" if turn is not None:
                turn["outcomes"][event.data.tool_call_id] = event.data.outcome
            case "session.context_cleared" if turn is not None:
                turn["cleared"] = True
            case "assistant.turn_end" if turn is not None:
                outcomes: dict[str, str] = turn["outcomes"]
                ends = (
                    turn["answered"]
                    and not turn["cleared"]
                    and (
                        not turn["calls"]
                        or "rejected" in outcomes.values()
                        or any(
                            outcome == "success" and names.get(call_id) in TERMINAL
                            for call_id, outcome in outcomes.items()
                        )
                    )
                )
                turn = None
            case "session.error" if not event.data.logged:
                ends = True
            case "abort":
                ends = True
            case _:
                pass
        ended = ends and open_run
        open_run = open_run and not ends
        if ended:
            ending.add(event.id)
        assert state.apply(event) is ended, (
            f"the runtime reads the run's end otherwise at {event.type}"
        )
    return state, ending


def assert_one_idle_per_run(runtime: Runtime, ending: set[str]) -> None:
    """E1, E5: every run this runtime ran or followed ends in exactly one idle, right after the
    stored event that ended it in the log (`ending`: the loop and the log agree on where a run
    ends). The queue's notices belong to no run: one may come between (K9)."""
    seen = [event for event in runtime.seen if event.type != "pending_messages.modified"]
    for index, event in enumerate(seen):
        if event.type == "session.idle" and index:  # (a runtime may miss its first events)
            assert seen[index - 1].id in ending, "an idle that ends no run"
        elif event.id in ending:
            assert index + 1 < len(seen), "a run ended without its idle"
            assert seen[index + 1].type == "session.idle", "a run's end is not followed by its idle"
