"""`Ownership`: which runtime runs a session, and what happens when that changes.

A runtime holding the session's lease writes its log and runs it (spec R1). Without the lease
it follows the owner's log, delivering the owner's events to its own subscribers. When it
takes the session over (the owner's lease expired), or opens it after a crash, it finishes
what the crash left (P3, C10) before anything new runs. `Client` drives this through
`lost`, `follow`, `adopt` and `recover`; the session itself never needs to.
"""

from __future__ import annotations

import asyncio
import json
import logging

from trimtab import _loop
from trimtab._errors import SessionNotFoundError
from trimtab._log import SessionLog
from trimtab._runner import Runner
from trimtab._state import SessionState
from trimtab._tools import Tool
from trimtab.events import (
    SessionResumeData,
    SessionResumeEvent,
)
from trimtab.providers import ToolCall
from trimtab.store import Lease

__all__ = ["Ownership"]

_log = logging.getLogger("trimtab")


class Ownership:
    """A session's lease, as this runtime holds or follows it."""

    __slots__ = ("_follower", "_log", "_runner")

    def __init__(self, log: SessionLog, runner: Runner) -> None:
        self._log = log
        self._runner = runner
        self._follower: tuple[asyncio.Task[None], asyncio.Event] | None = None
        """The follower while there is one, and an event set once its subscription listens
        or it ended (made with it: most sessions never follow)."""

    @property
    def owned(self) -> bool:
        return self._log.lease is not None

    @property
    def state(self) -> SessionState:
        """The session's state, as its log makes it."""
        return self._log.state

    def halt(self) -> None:
        """Write nothing more, silently (`SessionLog.halt`): an engine's attempt that stops
        where it stands (taken over, or its run parked, spec EN5)."""
        self._log.halt()

    async def lost(self) -> None:
        """Another runtime may own the session now: stop writing (the next append would fail),
        and follow it."""
        self._log.lease = None
        await self.follow()

    async def follow(self) -> None:
        """While remote, deliver the owner's events to this session's subscribers as they are
        stored, so that a host attached here sees a run executing elsewhere (spec R1).

        Returns once the follower listens: every event the owner emits from then on reaches
        the subscribers (E6). Bounded by the store's timeout (W1): past it the follower goes
        on, reading the stored events as they come, and live ones once it listens."""
        if self._follower is None:
            if self._runner.closed:
                return
            listening = asyncio.Event()
            follower = asyncio.get_running_loop().create_task(
                self._follow(listening), name=f"trimtab-follow-{self._log.session_id}"
            )
            self._follower = (follower, listening)
        _, listening = self._follower
        store = self._log.store
        try:
            async with asyncio.timeout(store.timeout):
                await listening.wait()
        except TimeoutError:
            _log.warning(
                "session %s: its owner's live events are not heard here yet (no listener"
                " within %s s); its stored events still come",
                self._log.session_id,
                store.timeout,
            )

    async def _follow(self, listening: asyncio.Event) -> None:
        log = self._log
        events = log.store.subscribe(log.session_id, after=log.state.event_count, ready=listening)
        try:
            async for event in events:
                log.follow(event)
        except SessionNotFoundError:
            pass  # deleted: nothing more will come
        finally:
            listening.set()  # (ended: nothing to wait for)
            await events.aclose()

    async def unfollow(self) -> None:
        if self._follower is not None:
            follower, listening = self._follower
            follower.cancel()
            listening.set()  # (a follower cancelled before it began never sets it)
            await asyncio.wait([follower])
            self._follower = None

    async def adopt(self, lease: Lease) -> None:
        """Take the session over from a runtime whose lease expired: catch up, then recover.

        The writer is held throughout, so that a `send` racing the takeover comes after its
        `session.resume` and recovery, never between them (E3)."""
        await self.unfollow()
        log = self._log
        async with log.exclusive():
            await log.catch_up()
            log.lease = lease
            # Not a resume asked with `continue_pending_work` (unfinished calls of tools that
            # are not idempotent end `cancelled`): every resume says which it was (spec D5).
            resumed = _resume(log, continue_pending=False)
            await log.emit_unlocked((resumed,))
            # Hosts here were following a run the crashed owner left: it goes on, from here.
            await self._recover(continue_pending=False, continue_run=True)
        await self._runner.take_inputs()

    async def resumed(self, event: SessionResumeEvent) -> None:
        """Log the session's opening by this runtime (the first event it writes)."""
        await self._log.emit(event)

    async def reopened(self, *, continue_pending: bool) -> None:
        """Log a resume of the session while it is open here already (spec D5): every
        resume has its `session.resume`. A session another runtime runs is logged there;
        here the resume returns once its follower listens, as the first one did (R1)."""
        log = self._log
        if log.writable:
            await log.emit(_resume(log, continue_pending=continue_pending))
        else:
            await self.follow()

    async def attempt(self) -> None:
        """Take the session up for an engine's attempt at running it (spec EN3): a run the
        log holds in progress (one a crashed worker left, or one parked) goes on from here,
        after a `session.resume`, as after a takeover (P3, C10), except that a call waiting
        for the answer to a question it announced waits for it again (EN5); then the inputs
        in the inbox are queued, in order (P4)."""
        log = self._log
        async with log.exclusive():
            if log.state.run_id is not None:
                resumed = SessionResumeData(event_count=log.state.event_count)
                await log.emit_unlocked((SessionResumeEvent(data=resumed),))
            await self._recover(continue_pending=False, continue_run=True, waiting=True)
        await self._runner.take_inputs()

    async def take_inputs(self) -> None:
        """Queue the inputs other runtimes stored for the session (spec R1, P4)."""
        await self._runner.take_inputs()

    async def recover(self, *, continue_pending: bool = False) -> None:
        """Finish what a crash left (spec P3, C10), then queue the inputs stored for the
        session, in order (P4)."""
        async with self._log.exclusive():
            await self._recover(continue_pending=continue_pending, continue_run=False)
        await self._runner.take_inputs()

    async def _recover(
        self, *, continue_pending: bool, continue_run: bool, waiting: bool = False
    ) -> None:
        """Unfinished calls of idempotent tools (all of them with `continue_pending`) run
        again, the others end `cancelled`. The interrupted run goes on when a call runs again,
        when a committed clear's seed has not run yet (C10), or when asked
        (`continue_pending`, `continue_run`); otherwise it is left as the crash left it.
        With `waiting`, a call waiting for the answer to a question it announced goes on
        waiting for it (EN5)."""
        state = self._log.state
        tools = self._runner.toolbox.own
        waits = state.waiting if waiting else {}
        again = {
            call_id: start
            for call_id, start in state.unfinished_calls.items()
            if continue_pending or call_id in waits or _idempotent(tools.get(start.tool_name))
        }
        ended = [
            _loop.cancelled(call_id, start.tool_name)
            for call_id, start in state.unfinished_calls.items()
            if call_id not in again
        ]
        if ended:
            await self._log.emit_unlocked(ended)
        go_on = continue_pending or continue_run or again or state.pending_seed is not None
        if state.run_id is not None and go_on:
            calls = tuple(
                ToolCall(id=call_id, name=d.tool_name, arguments=_arguments_text(d.arguments))
                for call_id, d in again.items()
            )
            resumed = {call_id: wait for call_id, wait in waits.items() if call_id in again}
            interrupted = _loop.Interrupted(state.open_turn, calls, resumed)
            self._runner.go_on(interrupted, state.run_id)


def _idempotent(tool: Tool | None) -> bool:
    return tool is not None and tool.definition.idempotent


def _arguments_text(arguments: object) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _resume(log: SessionLog, *, continue_pending: bool) -> SessionResumeEvent:
    """A resume of the session as its log has it (its configuration unchanged)."""
    config = log.state.config
    data = SessionResumeData(
        event_count=log.state.event_count,
        selected_model=config.model,
        reasoning_effort=config.reasoning_effort,
        continue_pending_work=continue_pending,
    )
    return SessionResumeEvent(data=data)
