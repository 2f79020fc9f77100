"""The run activity: one attempt at running a session, in a worker that holds its tools.

An attempt claims the session's lease with the fence its workflow handed it (spec EN3), opens
the session from its log, finishes what the log left in progress (a run a dead worker left,
or a parked one: `Ownership.attempt`), runs every input waiting in the inbox, each to its one
idle, and lets the session go. Model calls and tool calls happen inside it, as in any runtime;
the log records them, and the workflow learns only how the attempt ended.

A question the run asks outside itself (a permission request; a call of a tool the session
declared and this worker does not hold) is answered through the workflow by a process that
has the session open (EN6). The attempt polls for the answer; once every unfinished call of
the run has waited `park_after` seconds, the run parks (EN5): the session is let go of as it
stands, nothing more is written, and the attempt returns the questions it waits on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from trimtab import Client, PermissionDecision, SessionNotFoundError, Tool, ToolInvocation
from trimtab._engine import Answer, PermissionAnswer, ToolAnswer
from trimtab._session import Session, ownership_of
from trimtab._tools import CallOutcome, ExternalTool, failed_call
from trimtab.events import PermissionRequestData, SessionConfigData, ToolDefinition
from trimtab.temporal._workflow import (
    FENCE_BEHIND,
    LET_GO,
    RUN_ACTIVITY,
    SESSION_GONE,
    RunOutcome,
    RunParams,
)

__all__ = ["Runs"]

log = logging.getLogger("trimtab.temporal")

BENIGN = ApplicationErrorCategory.BENIGN
"""Errors the workflow expects: logged at debug level by the SDK, not as failures."""


@functools.cache
def _answers() -> TypeAdapter[Answer]:
    return TypeAdapter(Answer)  # built on first use, as every trimtab model is


class Runs:
    """What a worker runs sessions with: a `Client` on the sessions' store (their providers
    are built as a resume by it would build them) and the tools it holds."""

    def __init__(
        self,
        client: Client,
        tools: Sequence[Tool] = (),
        *,
        lease_ttl: float = 30.0,
        poll: float = 0.05,
    ) -> None:
        self.client = client
        self.tools = {tool.name: tool for tool in tools}
        self.lease_ttl = lease_ttl
        """Seconds the session's lease lasts unless the attempt renews it (every third)."""
        self.poll = poll
        """Seconds between two looks for the answers a run waits on."""

    @activity.defn(name=RUN_ACTIVITY)
    async def run(self, params: RunParams) -> RunOutcome:
        """One attempt (see the module)."""
        return await _Attempt(self, params).run()


class _Attempt:
    __slots__ = ("_lost", "_params", "_parked", "_questions", "_runs", "_session", "owner")

    def __init__(self, runs: Runs, params: RunParams) -> None:
        self._runs = runs
        self._params = params
        self.owner = f"engine:{socket.gethostname()}:{os.getpid()}:{params.fence}"
        self._questions = _Questions(self, params.park_after, runs.poll)
        self._parked = asyncio.Event()
        self._lost = asyncio.Event()
        """Another attempt claimed the session: this one stops writing."""
        self._session: Session | None = None

    async def run(self) -> RunOutcome:
        params, runs = self._params, self._runs
        store = await runs.client._open_store()
        try:
            claimed = await store.claim_lease(
                params.session_id, self.owner, params.fence, runs.lease_ttl
            )
        except SessionNotFoundError:
            raise ApplicationError(
                f"session {params.session_id} was deleted", type=SESSION_GONE, non_retryable=True
            ) from None
        if isinstance(claimed, int):
            raise ApplicationError(
                f"fence {params.fence} is behind the session's {claimed}",
                claimed,
                type=FENCE_BEHIND,
                non_retryable=True,
                category=BENIGN,  # (the workflow goes on above it)
            )
        session = self._session = await runs.client._host(
            params.session_id,
            claimed,
            tools=self._tools,
            permission_handler=self._questions.permission,
        )
        ownership = ownership_of(session)
        upkeep = asyncio.get_running_loop().create_task(self._upkeep(session))
        halted = False
        try:
            await ownership.attempt()
            if params.abort:
                await session.abort()  # the run in progress, or the one about to start (E4)
            parked = await self._settle(session)
        except asyncio.CancelledError:
            details = activity.cancellation_details()
            if details is not None and details.cancel_requested:
                # An abort (E4): the run ends here, with its one idle; what is queued
                # behind it runs in the next attempt.
                await session.abort()
                raise
            halted = True  # taken over, or the worker stops: write nothing more
            log.info("session %s: attempt %d lets the session go", params.session_id, params.fence)
            raise ApplicationError(
                "the attempt let the session go", type=LET_GO, category=BENIGN
            ) from None
        except BaseException:
            halted = True
            raise
        finally:
            upkeep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await upkeep
            self._questions.close()
            halted = halted or self._parked.is_set() or self._lost.is_set()
            if halted:
                ownership.halt()
            await session.disconnect()
            if halted:
                # A halted session leaves its lease (if it is still this attempt's) to us.
                with contextlib.suppress(Exception):
                    await store.release_lease(claimed)
        if self._lost.is_set():
            raise ApplicationError(
                f"session {params.session_id} was claimed by another attempt",
                type=LET_GO,
                category=BENIGN,
            )
        return RunOutcome(parked=parked, used=self._questions.used)

    def _tools(self, config: SessionConfigData) -> list[Tool]:
        """The session's tools: its declared ones this worker holds, and the others as
        answered by a process that has the session open (EN6)."""
        own = self._runs.tools
        return [
            own.get(definition.name) or _ClientTool(definition, self._questions)
            for definition in config.tools
        ]

    async def _settle(self, session: Session) -> list[str]:
        """Run until the session is at rest, every input in its inbox run; or until its run
        parks, or another attempt claimed it. The request ids it parked on (none at rest)."""
        ownership = ownership_of(session)
        while True:
            waits = [
                asyncio.ensure_future(session.wait_idle()),
                asyncio.ensure_future(self._parked.wait()),
                asyncio.ensure_future(self._lost.wait()),
            ]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            if self._parked.is_set():
                return self._questions.waiting()
            if self._lost.is_set():
                return []
            await ownership.take_inputs()  # sent while it ran
            if not session.busy:
                return []

    def park_if_stuck(self, long_waits: set[str]) -> None:
        """Park the run when every unfinished call of it has waited `park_after` seconds
        for its answer (`long_waits`: their call ids)."""
        session = self._session
        if session is None or self._parked.is_set():
            return
        unfinished = set(ownership_of(session).state.unfinished_calls)
        if unfinished and unfinished <= long_waits:
            # Stopped at once: no await between the check and the halt, so nothing is
            # written after the state it was decided on.
            ownership_of(session).halt()
            self._parked.set()

    async def _upkeep(self, session: Session) -> None:
        """Heartbeat while the attempt lives (a stalled one is taken over, EN3), and keep the
        lease; a lease another attempt claimed stops this one."""
        timeout = activity.info().heartbeat_timeout
        beat = min(1.0, timeout.total_seconds() / 4) if timeout is not None else 1.0
        store = await self._runs.client._open_store()
        renewed = time.monotonic()
        ownership = ownership_of(session)
        while True:
            activity.heartbeat(ownership.state.event_count)
            if time.monotonic() - renewed >= self._runs.lease_ttl / 3:
                renewed = time.monotonic()
                try:
                    kept = await store.renew_leases(self.owner, self._runs.lease_ttl)
                except Exception:
                    log.warning("could not renew the lease of session %s", session.session_id)
                else:
                    if session.session_id not in kept:
                        log.info("session %s: claimed by a later attempt", session.session_id)
                        ownership.halt()
                        self._lost.set()
                        return
            await asyncio.sleep(beat)


class _Questions:
    """The questions an attempt's run waits on, and the answers it got (EN5, EN6)."""

    __slots__ = ("_attempt", "_poller", "_waits", "park_after", "poll", "used")

    def __init__(self, attempt: _Attempt, park_after: float, poll: float) -> None:
        self._attempt = attempt
        self.park_after = park_after
        self.poll = poll
        self._waits: dict[str, tuple[str, float, asyncio.Future[dict[str, Any]]]] = {}
        """Request id -> (call id, since when, the answer's future)."""
        self._poller: asyncio.Task[None] | None = None
        self.used: list[str] = []

    def waiting(self) -> list[str]:
        return list(self._waits)

    async def permission(
        self, request: PermissionRequestData, invocation: ToolInvocation
    ) -> PermissionDecision:
        """The session's permission handler: the answer a process that has it open gives."""
        answer = await self.wait(request.request_id or "", invocation.tool_call_id)
        if isinstance(answer, PermissionAnswer):
            return answer.decision
        return PermissionDecision(kind="user-not-available")  # unanswered in time (D6)

    async def wait(self, request_id: str, call_id: str) -> Answer | None:
        """The answer to `request_id`, once one came; None when the question was given up
        (its pending timeout passed, D6) or answered with nonsense."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waits[request_id] = (call_id, time.monotonic(), future)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        try:
            raw = await future
        finally:
            self._waits.pop(request_id, None)
        self.used.append(request_id)
        try:
            return _answers().validate_python(raw)
        except ValidationError:
            return None

    async def _poll(self) -> None:
        """Ask the workflow for the answers awaited, every `poll` seconds while any is."""
        workflow_id = activity.info().workflow_id
        assert workflow_id is not None  # (the run activity is always a workflow's)
        handle = activity.client().get_workflow_handle(workflow_id)
        while self._waits:
            try:
                answers = await handle.query("answers", list(self._waits))
            except Exception:
                log.warning("could not read the answers of a run", exc_info=True)
                answers = {}
            now = time.monotonic()
            for request_id, raw in dict(answers).items():
                wait = self._waits.get(request_id)
                if wait is not None and not wait[2].done():
                    wait[2].set_result(raw)
            long = {
                call_id
                for call_id, since, future in self._waits.values()
                if not future.done() and now - since >= self.park_after
            }
            if long:
                self._attempt.park_if_stuck(long)
            await asyncio.sleep(self.poll)

    def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()


class _ClientTool(ExternalTool):
    """A tool the session declared that this worker does not hold: a process that has the
    session open runs it (its own tool, or its client's over the wire) and answers (EN6)."""

    __slots__ = ("_questions",)

    def __init__(self, definition: ToolDefinition, questions: _Questions) -> None:
        super().__init__(definition, _never)
        self._questions = questions

    async def run(self, params: Any, invocation: ToolInvocation) -> CallOutcome:
        answer = await self._questions.wait(invocation.request_id or "", invocation.tool_call_id)
        if isinstance(answer, ToolAnswer):
            return CallOutcome(answer.outcome, answer.text, tuple(answer.references))
        return failed_call(self.name)  # unanswered in time, as a dropped client's call (D6)


def _never(*_: object) -> None:
    raise AssertionError("a client tool's calls are answered, never run here")
