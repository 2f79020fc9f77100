"""The session's workflow: which attempt runs the session, and what its run waits for.

One long-lived workflow per session (id `trimtab:<session id>`). It holds ids, fences and
counters, never a message: the session's log is the transcript (spec EN1). It runs one
activity at a time (`RUN_ACTIVITY`), each with a greater fence than the last (EN3), when an
input was submitted or when a parked run's question is answered or given up (EN5); it
continues as new every `ROLLOVER_RUNS` attempts, between runs (EN7).

Workflow code must replay its histories: a change to what this module does with a given
history (the commands it issues, their order) breaks every session running through a
release. `tests/temporal/histories` holds recorded ones, replayed in CI; change behaviour
behind `workflow.patched`. It imports nothing of trimtab: the workflow sandbox re-imports
what a workflow imports, for each run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

__all__ = [
    "FENCE_BEHIND",
    "LET_GO",
    "SESSION_GONE",
    "RUN_ACTIVITY",
    "UNANSWERED",
    "WORKFLOW",
    "RunOutcome",
    "RunParams",
    "SessionParams",
    "SessionWorkflow",
    "workflow_id",
]

WORKFLOW = "trimtab.Session"
RUN_ACTIVITY = "trimtab.run"
FENCE_BEHIND = "FenceBehind"
"""The `ApplicationError` type of an attempt whose fence the session's token had passed."""
LET_GO = "LetGo"
"""The type of an attempt that let the session go unfinished (its worker is stopping, or
another attempt claimed it): the next one goes on at once."""
SESSION_GONE = "SessionGone"
"""The type of an attempt that found the session deleted: the workflow ends."""

ROLLOVER_RUNS = 200
"""Attempts per workflow history before it continues as new: about 11 events each."""

MAX_PENDING = 10_000
"""Submitted inputs held by id; past it a submit adds nothing (the inbox has them all, and
every attempt runs every input waiting there)."""

MAX_ANSWERS = 1_000
"""Answers held for the run in progress; past it an answer is refused."""

KEEP_SETTLED = 1_000
"""Answered request ids remembered, so that a second answer is refused (D7)."""

RUN_LIMIT = timedelta(days=1)
"""How long one attempt may take, start to close: a run longer than this is taken over."""

UNANSWERED: dict[str, Any] = {"kind": "unanswered"}
"""The answer a question gets when its pending timeout passes (D6)."""


def workflow_id(session_id: str) -> str:
    """The id of the session's workflow."""
    return f"trimtab:{session_id}"


@dataclass
class SessionParams:
    """The workflow's input, and what it carries into its next history."""

    session_id: str
    task_queue: str
    """Where its runs go: the queue its workers serve."""
    heartbeat_timeout: float
    """Seconds without a heartbeat after which an attempt is taken over (EN3)."""
    park_after: float
    """Seconds a run waits for an answer before it parks (EN5)."""
    pending_timeout: float
    """Seconds a parked run's questions wait for an answer before they are given up (D6)."""
    fence: int = 1
    """The next attempt's fencing token."""
    pending: list[str] = field(default_factory=list)
    """Message ids of the inputs submitted and not yet run."""
    waits: list[str] = field(default_factory=list)
    """The request ids the parked run waits on (none: no run is parked)."""
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Answers to the run's questions, by request id, until an attempt uses them."""
    settled: list[str] = field(default_factory=list)
    """Request ids answered and used, the latest `KEEP_SETTLED`."""
    aborting: bool = False
    """An abort asked of a run that is not executing (parked, or about to start)."""
    runs: int = 0
    """Attempts made, over every history."""
    rollover: int = ROLLOVER_RUNS
    """Attempts per history before it continues as new."""


@dataclass
class RunParams:
    """One attempt at running the session."""

    session_id: str
    fence: int
    park_after: float
    abort: bool = False
    """End the run in progress (or the one about to start) as an abort (E4)."""


@dataclass
class RunOutcome:
    """How an attempt ended: the session at rest, or its run parked."""

    parked: list[str] = field(default_factory=list)
    """The request ids its run parked on."""
    used: list[str] = field(default_factory=list)
    """The request ids whose answers it used."""


@workflow.defn(name=WORKFLOW)
class SessionWorkflow:
    """A session on the engine: its attempts, one at a time, and its parked run's answers."""

    @workflow.init
    def __init__(self, params: SessionParams) -> None:
        self._p = params
        self._running: workflow.ActivityHandle[RunOutcome] | None = None
        self._here = 0
        """Attempts in this history."""
        self._failures = 0
        """Attempts failed in a row (not taken over): retried after a growing pause."""
        self._gone = False
        """The session was deleted."""

    @workflow.run
    async def run(self, params: SessionParams) -> None:
        p = self._p
        while not self._gone:
            await workflow.wait_condition(lambda: self._due() or self._rollover())
            if self._rollover():
                # Between attempts, no handler in flight: what it holds is carried over.
                workflow.continue_as_new(p)
            if p.waits and not p.aborting and not self._answered():
                try:
                    await workflow.wait_condition(
                        lambda: self._answered() or p.aborting,
                        timeout=timedelta(seconds=p.pending_timeout),
                        timeout_summary="pending_timeout",
                    )
                except TimeoutError:
                    for request_id in p.waits:
                        p.answers.setdefault(request_id, UNANSWERED)
            await self._attempt()

    def _due(self) -> bool:
        """Something to run: an abort, a parked run, or an input."""
        p = self._p
        return p.aborting or bool(p.waits) or bool(p.pending)

    def _answered(self) -> bool:
        return any(request_id in self._p.answers for request_id in self._p.waits)

    def _rollover(self) -> bool:
        """Time to continue as new: the history is long, and no handler is in flight (an
        abort waits for the attempt it asked for, which comes first)."""
        long = self._here >= self._p.rollover or workflow.info().is_continue_as_new_suggested()
        return long and workflow.all_handlers_finished()

    async def _attempt(self) -> None:
        p = self._p
        known = set(p.pending)
        params = RunParams(p.session_id, p.fence, p.park_after, p.aborting)
        p.fence += 1  # each attempt its own, greater than the last (EN3)
        p.runs += 1
        self._here += 1
        self._running = handle = workflow.start_activity(
            RUN_ACTIVITY,
            params,
            result_type=RunOutcome,
            task_queue=p.task_queue,
            heartbeat_timeout=timedelta(seconds=p.heartbeat_timeout),
            start_to_close_timeout=RUN_LIMIT,
            # A lost attempt is not retried as such: the next one gets a new fence.
            retry_policy=RetryPolicy(maximum_attempts=1),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        failure: ActivityError | None = None
        try:
            outcome = await handle
        except ActivityError as error:
            failure = error
        finally:
            self._running = None
        if failure is not None:
            await self._failed(failure)
            return
        self._failures = 0
        if not outcome.parked:
            # Every input waiting when the attempt began has run (a parked run's have not).
            p.pending = [message_id for message_id in p.pending if message_id not in known]
        p.waits = outcome.parked
        p.settled = (p.settled + outcome.used)[-KEEP_SETTLED:]
        # An answer to a question nobody waits on any more is dropped.
        p.answers = {r: a for r, a in p.answers.items() if r in p.waits and r not in outcome.used}
        p.aborting = False

    async def _failed(self, error: ActivityError) -> None:
        """An attempt that did not finish: taken over at once (its worker died or stalled),
        ended by an abort, or retried after a pause (a failure of the worker or the store)."""
        p = self._p
        cause = error.cause
        if isinstance(cause, ApplicationError) and cause.type == FENCE_BEHIND:
            (token,) = cause.details
            p.fence = max(p.fence, int(token) + 1)
        elif isinstance(cause, ApplicationError) and cause.type == SESSION_GONE:
            self._gone = True
        elif isinstance(cause, ApplicationError) and cause.type == LET_GO:
            pass  # the next attempt goes on from the log, at once
        elif isinstance(cause, CancelledError):
            # Aborted: the activity ended the run (E4); inputs behind it still run.
            p.waits, p.answers, p.aborting = [], {}, False
        elif isinstance(cause, ApplicationError):
            self._failures += 1
            await workflow.sleep(min(60.0, 0.5 * 2 ** min(self._failures, 7)))
        # A timeout (heartbeat, or the run's limit): the next attempt takes over now.

    @workflow.update(name="submit")
    def submit(self, message_id: str) -> None:
        """An input waits in the session's inbox (stored before this is sent, P4)."""
        p = self._p
        if message_id not in p.pending and len(p.pending) < MAX_PENDING:
            p.pending.append(message_id)

    @submit.validator
    def _valid_submit(self, message_id: str) -> None:
        if not isinstance(message_id, str) or not message_id:
            raise ValueError("a message id is a non-empty string")

    @workflow.update(name="answer")
    def answer(self, request_id: str, answer: dict[str, Any]) -> bool:
        """Answer a question of the run in progress; False when none waits for it (EN6)."""
        p = self._p
        if request_id in p.settled or request_id in p.answers:
            return False
        if self._running is None and request_id not in p.waits:
            return False
        p.answers[request_id] = answer
        return True

    @answer.validator
    def _valid_answer(self, request_id: str, answer: dict[str, Any]) -> None:
        if not isinstance(request_id, str) or not request_id or not isinstance(answer, dict):
            raise ValueError("an answer is a request id and an object")
        if len(self._p.answers) >= MAX_ANSWERS:
            raise ValueError(f"the session holds {MAX_ANSWERS} answers already")

    @workflow.update(name="abort")
    async def abort(self) -> None:
        """End the run in progress as an abort (E4); returns once it ended."""
        p = self._p
        running = self._running
        if running is not None:
            running.cancel()
            await workflow.wait_condition(lambda: self._running is not running)
        elif p.waits or p.pending:
            p.aborting = True
            await workflow.wait_condition(lambda: not p.aborting)

    @workflow.query(name="answers")
    def answers(self, request_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The answers held for `request_ids`."""
        return {r: self._p.answers[r] for r in request_ids if r in self._p.answers}
