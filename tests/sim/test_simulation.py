"""Deterministic fault simulation of the session core (spec E1, E3, E5, O1, T1-T4, C6-C10, H1,
P3, P4, P5, R1, X4-X6, X8).

A seeded Hypothesis state machine drives one session through sends, sends queued behind a run,
steering messages, tool batches with every outcome (terminal calls, clears that commit and
clears that roll back, rejections, denials, gated calls), the host's clears, aborts,
compactions, truncations, forks, prunes, disconnects and resumes, crashes at a chosen write
(the write stored or not), and takeovers by a new runtime.
Most scenarios run under a small context window, with prompts and results of every size, so
that automatic compaction (and its fallbacks: a failed summary, turns dropped) or, with the
handoff policy on, handoffs run among the faults; rules steer to the points random crashes
seldom reach: a crash right after a clear commits (C10), a crash while a call runs, then a
takeover or a resume (P3, R1).

After every step it checks what must always hold, and whenever it lets the world settle, every
promise, from the log alone: one chain of distinct events; every acknowledged input ran exactly
once; every run ended in one idle, where its log says it ended, and where the rules say, told
from the tools as defined (a successful terminal call or a rejection ends it, a failed terminal
call does not, a committed clear leads to its seed); the live window is the log's and holds no
orphaned call; a committed clear's seed logged once; a failed clear left no trace; every call
completed once, with fields that match its outcome; a handler ran only once its start was
stored, never for a denied call, and again after a crash only if its tool is idempotent or the
work was continued; each model request ends as it should (a run's first with its prompt, H1).

Everything is deterministic: async tools (no thread), no timer, no lease running out, and
steps bounded by event-loop iterations, not seconds; `test_a_scenario_replays_exactly` checks
it. The budget: `TRIMTAB_SIM_EXAMPLES` scenarios of up to `TRIMTAB_SIM_STEPS` steps (CI runs
the defaults; raise them for a long local run). A failure prints the steps and the
`@seed`/`@reproduce_failure` line that replays it; `pytest -s` prints how many scenarios
reached each point of interest.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.sim.world import REACHABLE, World
from trimtab.store import MemoryStore, SqliteStore, Store, sqlite

EXAMPLES = int(os.environ.get("TRIMTAB_SIM_EXAMPLES", "500"))
STEPS = int(os.environ.get("TRIMTAB_SIM_STEPS", "40"))

REPLAYED = 25
"""Scenarios `test_a_scenario_replays_exactly` runs twice."""

REACHED: Counter[str] = Counter()
"""How many scenarios that passed reached each point of interest (`World.reached`)."""

CALLS = st.sampled_from(
    [
        "ok",
        "boom",
        "crashy",
        "slow",
        "idem",
        "term",
        "clear_context",
        "clear_fail",
        "guarded",
        "denied",
    ]
)


PADS = st.sampled_from([0, 0, 0, 0, 60, 600, 2_400])
"""How much longer than its few words a prompt or an `ok` result is, in characters: under a
small context window, enough to compact (and a prompt over the keep share, H1)."""


@st.composite
def batches(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    names = draw(st.lists(CALLS, min_size=1, max_size=4))
    batch = []
    for index, name in enumerate(names):
        arguments: dict[str, Any] = {"n": index}
        if name in ("clear_context", "clear_fail"):
            arguments = {"prompt": f"SEED-{draw(st.integers(0, 99))}"}
        elif name == "ok":
            arguments["pad"] = draw(PADS)
        batch.append((name, arguments))
    return batch


PLANS = st.lists(st.one_of(batches(), st.just("text reply")), min_size=0, max_size=3)


class Simulation(RuleBasedStateMachine):
    """One session, driven and broken at random; see the module docstring."""

    world: World
    """Made by the first rule, `start`."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.sent = 0

    def run(self, work: Any) -> Any:
        return self.loop.run_until_complete(_bounded(work))

    def durable(self) -> Store:
        """The store that outlives every runtime of a scenario."""
        return MemoryStore()

    @initialize(
        seed=st.integers(0, 2**32 - 1),
        # None: the default window (128k), which nothing here fills; the others are filled
        # within a few runs (the tools' schemas alone take ~550 tokens of each request).
        context_window=st.sampled_from([None, 700, 900, 1_200, 1_600]),
        summaries_fail=st.sampled_from([0.0, 0.3, 1.0]),
        handoff=st.booleans(),
    )
    def start(
        self, seed: int, context_window: int | None, summaries_fail: float, handoff: bool
    ) -> None:
        # The handoff policy (X5) past 60% of a window the tools' schemas leave room in: the
        # conversation is handed to a fresh window instead of compacted.
        handoff = handoff and (context_window or 0) >= 1_200
        self.world = World(
            self.durable(),
            seed=seed,
            context_window=context_window,
            summaries_fail=summaries_fail,
            handoff=0.6 if handoff else None,
        )
        self.run(self.world.start())

    @rule(plan=PLANS, pad=PADS, yields=st.integers(0, 60), continue_pending=st.booleans())
    def send(self, plan: list[Any], pad: int, yields: int, continue_pending: bool) -> None:
        """A prompt, and the model's answers to its run; then a while for the run to go on.
        A user whose runtime died opens the session again first (or a follower takes it)."""
        if self.world.owner.dead:
            self.run(self.world.take_over(continue_pending=continue_pending))
        self.sent += 1
        self.run(self.world.send(f"prompt {self.sent}" + " ." * (pad // 2), plan))
        self.run(_spin(yields))

    @rule(
        seed=st.integers(0, 99),
        after=st.integers(1, 4),
        durable=st.booleans(),
        terminal=st.booleans(),
    )
    def clear_then_crash(self, seed: int, after: int, durable: bool, terminal: bool) -> None:
        """C10's crash points, which a crash at a random write rarely hits: a run whose model
        clears (with a sibling call or not), and a crash at the `after`-th write after the
        clear commits: before the batch's turn end, at its seed's message (stored or not),
        at the seeded turn's answer. Recovering is left to the rules that follow."""
        if self.world.owner.dead:
            return
        self.world.crash_after_clear(after, durable)
        clear: tuple[str, dict[str, Any]] = ("clear_context", {"prompt": f"SEED-{seed}"})
        batch = [clear, ("term", {"n": 1})] if terminal else [("ok", {"n": 0}), clear]
        self.world.gates.opened.set()  # (a run before it may wait at a gate)
        self.run(self.world.send(f"clear {seed}", [batch, "seeded reply"]))
        self.run(_spin(200, until=lambda: self.world.owner.dead))

    @rule(plan=PLANS)
    def steer(self, plan: list[Any]) -> None:
        """A message for the run in flight (spec X6), or a plain send when idle."""
        self.sent += 1
        self.run(self.world.send(f"steer {self.sent}", plan, immediate=True))

    @rule(seed=st.integers(0, 99))
    def host_clear(self, seed: int) -> None:
        """The host clears between runs (X4); refused while a run is in flight."""
        self.run(asyncio.wait_for(self.world.clear(f"HOSTSEED-{seed}"), 20))

    @rule()
    def prune(self) -> None:
        """Retention (X8): refused while a run is in flight, else the log before the
        window's base becomes a marker."""
        self.run(asyncio.wait_for(self.world.prune(), 20))

    @rule(yields=st.integers(0, 20))
    def let_it_run(self, yields: int) -> None:
        """Let the runtime make progress for a while (a few loop iterations)."""
        self.run(_spin(yields))

    @rule()
    def open_gates(self) -> None:
        self.world.gates.opened.set()

    # Rules that do not apply to the world's state are no-ops rather than preconditions: what
    # the world's state is depends on the scenario's interleavings, which the rules drawn must
    # not (Hypothesis replays a scenario by drawing the same rules).

    @rule()
    def abort(self) -> None:
        session = self.world.owner.session
        if session is not None and not self.world.owner.dead:
            self.run(_quietly(session.abort()))

    @rule(continue_pending=st.booleans())
    def disconnect_and_resume(self, continue_pending: bool) -> None:
        async def cycle() -> None:
            owner = self.world.owner
            if owner.dead or owner.session is None:
                return
            await _quietly(owner.session.disconnect())
            if not owner.dead:
                await owner.client.stop()
                await self.world.resume(continue_pending=continue_pending)

        self.run(cycle())

    @rule()
    def follow(self) -> None:
        self.run(self.world.follow())

    @rule(at_write=st.one_of(st.none(), st.integers(1, 12)), durable=st.booleans())
    def crash(self, at_write: int | None, durable: bool) -> None:
        if not self.world.owner.dead:
            self.run(self.world.crash(at_write, durable))

    @rule(after=st.integers(1, 4), durable=st.booleans())
    def crash_after_clear(self, after: int, durable: bool) -> None:
        """C10's crash points, between a committed clear and its seed's answer: before the
        batch's turn end, its seed's message (stored or not), the seeded turn's answer."""
        if not self.world.owner.dead:
            self.world.crash_after_clear(after, durable)

    @rule(
        tool=st.sampled_from(["slow", "idem"]),
        follower=st.booleans(),
        continue_pending=st.booleans(),
    )
    def crash_in_flight(self, tool: str, follower: bool, continue_pending: bool) -> None:
        """P3, R1: a crash while a call runs, then a takeover by a follower or a resume
        (continuing pending work or not): the call runs again only if its tool is idempotent
        or the work is continued, and ends once either way."""
        world = self.world
        if world.owner.dead:
            return
        if follower:
            self.run(world.follow())
        world.gates.opened = asyncio.Event()  # (closed: the call waits, in flight)
        ran = len(world.ran)
        self.run(world.send(f"call {tool}", [[(tool, {"n": 0})], "after the crash"]))

        def in_flight() -> bool:
            return any(name == tool for _, name, _ in world.ran[ran:])

        self.run(_spin(300, until=in_flight))
        self.run(world.crash(None, durable=False))
        self.run(world.take_over(continue_pending=continue_pending))

    @rule(continue_pending=st.booleans())
    def recover(self, continue_pending: bool) -> None:
        if self.world.owner.dead:
            work = self.world.take_over(continue_pending=continue_pending)
            self.run(work)

    @rule(kind=st.sampled_from(["compact", "truncate", "fork"]), pick=st.integers(0, 1000))
    def context_operation(self, kind: str, pick: int) -> None:
        async def operate() -> None:
            session = self.world.owner.session
            if session is None or self.world.owner.dead:
                return
            if kind == "compact":
                await _quietly(session.history.compact())
                return
            log = await self.world.log()
            users = [e.id for e in log if e.type == "user.message"]
            if kind == "fork":
                fork = await _quietly(session.history.fork())
                if fork is not None:
                    self.world.forks.append(fork)
            elif users:
                await _quietly(session.history.truncate(users[pick % len(users)]))

        # Operations queue behind a run: let gated calls through so that they can happen.
        self.world.gates.opened.set()
        self.run(operate())

    @rule()
    def settle(self) -> None:
        self.run(self.world.settle())
        self.run(self.world.check_settled())

    @invariant()
    def always(self) -> None:
        self.run(self.world.check_always())

    def teardown(self) -> None:
        try:
            self.run(self.world.settle())
            self.run(self.world.check_settled())
            for write, durable in self.world.crashes:
                event(f"crash at write {min(write, 30)}{'+' if write > 30 else ''}")
                event(f"crash, the write {'stored' if durable else 'lost'}")
            event(f"{len(self.world.runtimes)} runtime(s)")
            reached = self.run(self.world.reached())
            for what in reached:
                event(what)
            REACHED.update(reached | {"scenarios"})
        finally:
            # (Not bounded: it cancels every other task, a bound's included.)
            self.loop.run_until_complete(self.world.close())
            self.run(self.world.durable.close())
            self.loop.close()


STEP_ITERATIONS = 2_000_000
"""The event loop's iterations a step may take (a settling one far fewer): past them the
scenario hangs. Not seconds: a bound on the wall clock fires or not as the machine is loaded,
and a step it cuts short leaves the scenario in a state no replay reproduces."""


async def _bounded(work: Any) -> Any:
    """`work`'s result, once it finished within `STEP_ITERATIONS`; else an `AssertionError`,
    at the same point of the scenario every time it is replayed."""
    task = asyncio.ensure_future(work)
    for _ in range(STEP_ITERATIONS):
        if task.done():
            return task.result()
        await asyncio.sleep(0)
    task.cancel()
    raise AssertionError(f"a step did not end within {STEP_ITERATIONS} loop iterations: a hang")


async def _spin(yields: int, until: Callable[[], bool] = lambda: False) -> None:
    """Let the runtime's tasks run for `yields` loop iterations, or until `until()`."""
    for _ in range(yields):
        if until():
            return
        await asyncio.sleep(0)


async def _quietly(work: Any) -> Any:
    """The result of `work`, or None when the runtime refused it or died under it (a crashed
    runtime's calls fail; a refused operation is an answer, not a broken promise)."""
    from trimtab import TrimtabError

    try:
        return await work
    except (TrimtabError, ValueError):
        return None


class SqliteSimulation(Simulation):
    """The same scenarios on a SQLite file: real transactions, the same determinism (SQLite's
    calls do not yield to the event loop unless another process holds the file)."""

    def durable(self) -> Store:
        self.directory = tempfile.TemporaryDirectory()
        return SqliteStore(Path(self.directory.name) / "sim.db")

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self.directory.cleanup()


class Fingerprinted(Simulation):
    """A scenario that leaves what it did (its log, minus ids and times) in `into`."""

    def __init__(self, into: list[list[tuple[object, ...]]]) -> None:
        super().__init__()
        self.into = into

    def teardown(self) -> None:
        log = self.run(self.world.log())
        self.into.append(
            [_fingerprint(e) for e in log] + [("requests", len(self.world.model.requests))]
        )
        super().teardown()


def _fingerprint(event: Any) -> tuple[object, ...]:
    data = event.data
    return (
        event.type,
        getattr(data, "tool_call_id", None),
        getattr(data, "outcome", None),
        getattr(data, "content", None),
        getattr(data, "message", None),
    )


_SETTINGS = settings(
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
    database=None,  # a failure prints the line that replays it
)


def _explore(machine: Callable[[], Simulation], examples: int, **options: Any) -> None:
    """Run `examples` scenarios of `machine`."""
    # The machine is given as a factory: Hypothesis would otherwise read a class's source with
    # `ast.parse`, which CPython 3.11 can fail at random after deep recursion elsewhere in the
    # run ("AST constructor recursion depth mismatch").
    run_state_machine_as_test(
        cast("type[RuleBasedStateMachine]", machine),
        settings=settings(_SETTINGS, max_examples=examples, **options),
    )


def test_fault_simulation() -> None:
    REACHED.clear()
    _explore(Simulation, EXAMPLES)
    reached_enough()


def test_fault_simulation_on_sqlite(monkeypatch: pytest.MonkeyPatch) -> None:
    # No timer of the store's may decide an interleaving: its appends ring its subscribers.
    monkeypatch.setattr(sqlite, "SUBSCRIBE_POLL", 3600.0)
    REACHED.clear()
    _explore(SqliteSimulation, max(1, EXAMPLES // 6))
    reached_enough()


def test_a_scenario_replays_exactly() -> None:
    """Hypothesis replays a scenario to shrink it, and a printed `@reproduce_failure` line
    replays it again: the same steps must do the same, event for event. Nothing here may
    depend on the OS's scheduling (a sync tool's thread) or on a clock (a store's poll)."""
    runs: list[list[list[tuple[object, ...]]]] = [[], []]
    for into in runs:
        _explore(functools.partial(Fingerprinted, into), REPLAYED, derandomize=True)
    assert len(runs[0]) >= REPLAYED
    assert runs[0] == runs[1]


def test_a_step_that_hangs_fails_where_it_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "STEP_ITERATIONS", 100)
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(AssertionError, match="a hang"):
            loop.run_until_complete(_bounded(asyncio.Event().wait()))
        assert loop.run_until_complete(_bounded(_spin(50))) is None
    finally:
        loop.close()


def reached_enough() -> None:
    """Print how many scenarios reached each point of interest (`pytest -s` shows it), and
    check that a run of a few hundred scenarios reaches each: the simulation's steering must
    not rot into scenarios that never compact or never crash where C10 is at stake."""
    scenarios = REACHED["scenarios"]
    print(f"\n{scenarios} scenarios passed; of them:")
    for what, count in sorted(REACHED.items()):
        if what != "scenarios":
            print(f"  {count:6} ({count / max(scenarios, 1):4.0%}) {what}")
    if scenarios >= 150:
        for what in REACHABLE:
            assert REACHED[what] >= scenarios // 100, f"too few scenarios reached: {what}"
