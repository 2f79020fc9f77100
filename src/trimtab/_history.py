"""`session.history`: the host's operations on the context window.

Every operation appends events that move the window's base; none edits the log, so every
earlier window stays readable and the session id never changes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from trimtab import _loop
from trimtab._compaction import compact, summarize_for_handoff
from trimtab._errors import ClearContextError, PruneError, TrimtabError
from trimtab._results import ClearContextResult, CompactResult, TruncateResult
from trimtab._retention import PruneResult, prune_log
from trimtab._run_context import emit
from trimtab._runner import Runner
from trimtab._state import state_of
from trimtab._tools import SessionHandle, valid_text
from trimtab._tracing import Tracing
from trimtab.events import (
    Event,
    SessionPrunedEvent,
    SessionTruncatedEvent,
    TruncatedData,
)

__all__ = [
    "ClearContextResult",
    "CompactResult",
    "History",
    "PruneResult",
    "SessionOwner",
    "TruncateResult",
]

T = TypeVar("T")
S = TypeVar("S", bound=SessionHandle)
"""The kind of session a fork makes (the `Client`'s: `Session`)."""


class SessionOwner(Protocol[S]):
    """What opened a session (the `Client`): one reference per session, not a closure."""

    async def fork_session(self, source: S, events: list[Event]) -> S:
        """A new session from `source`'s options and a copy of `events`."""
        ...

    def forget_session(self, session: S) -> None:
        """`session` has closed."""
        ...

    @property
    def tracing(self) -> Tracing:
        """How the owner's sessions trace (spec OT1)."""
        ...


class History(Generic[S]):
    """Context operations on a session's window (`session.history`)."""

    __slots__ = ("_loop", "_owner", "_runner", "_session")

    def __init__(self, session: S, runner: Runner, owner: SessionOwner[S] | None) -> None:
        self._session = session
        self._runner = runner
        self._owner = owner
        self._loop = asyncio.get_running_loop()

    def clear_context(self, prompt: str) -> ClearContextResult:
        """Clear the model-facing conversation, seeded with `prompt` (spec C1-C12, X4).

        From a tool handler it stages the clear: it commits when that tool call succeeds, then
        the session runs `prompt` in the fresh window; if the call fails it is discarded. From
        the host while the session is idle it commits at once (the clear and its seed in one
        append; awaiting the result waits for that) and `prompt` runs as a `send` would: the
        result's `message_id` is its run's. Raises `ClearContextError` (`remote_session`,
        `empty_prompt`, `invalid_prompt`, `no_tool_call_in_flight`, `clear_pending` or
        `run_in_flight`) and changes nothing when the clear cannot be accepted.
        """
        if not _on_loop(self._loop):
            # A sync handler runs in a worker thread: stage on the loop, in its context.
            return _call_on_loop(self._loop, self.clear_context, prompt)
        runner = self._runner
        session_id, state = runner.session_id, runner.live
        if runner.closed:  # (no lease either: not to be taken for a remote session)
            raise ClearContextError(
                "no_tool_call_in_flight", f"session {session_id} is disconnected"
            )
        if not runner.log.writable:
            raise ClearContextError(
                "remote_session", f"session {session_id} is run by another runtime"
            )
        if not isinstance(prompt, str) or not prompt.strip():
            raise ClearContextError("empty_prompt", "the seed prompt must be a non-empty string")
        if valid_text(prompt) != prompt:
            raise ClearContextError(
                "invalid_prompt", "the seed prompt is not valid Unicode text (a lone surrogate)"
            )
        current = _loop.current_tool_call.get()
        if current is None and _loop.awaited_by.get() == session_id:
            call_id = None  # a permission handler or a hook: not a tool handler (C1)
        elif current is None:
            # Called from outside any handler's context (e.g. over JSON-RPC): the earliest
            # running call of this session is the enclosing one; with none, the host clears
            # between runs (X4).
            call_id = next(iter(state.in_flight), None)
            if call_id is None:
                return runner.clear(prompt, runner.log.state.messages_cleared())
        elif current[0] == session_id and current[1] in state.in_flight:
            call_id = current[1]
        else:
            call_id = None  # a handler of another session: never this session's call (C1)
        if call_id is None:
            raise ClearContextError(
                "no_tool_call_in_flight",
                "clear_context can only be called from a running tool handler of this session",
            )
        if state.staged is not None or runner.log.state.pending_seed is not None:
            raise ClearContextError("clear_pending", "a clear is already pending in this run")
        cleared = runner.log.state.messages_cleared()
        state.staged = _loop.StagedClear(prompt, cleared, call_id)
        return ClearContextResult(messages_cleared=cleared)

    async def compact(self, custom_instructions: str | None = None) -> CompactResult:
        """Summarise the older conversation with the session's model; keep the newest messages.

        Runs between runs (queued behind a run in flight). Emits `session.compaction_start`
        and `session.compaction_complete`.
        """
        if custom_instructions is not None:
            if not isinstance(custom_instructions, str):
                raise ValueError("custom_instructions must be a string or None")
            custom_instructions = valid_text(custom_instructions)  # they go to the model
        runner = self._runner
        return await self._between_runs(
            lambda: compact(
                runner.context(), runner, trigger="manual", custom_instructions=custom_instructions
            )
        )

    async def truncate(self, event_id: str) -> TruncateResult:
        """Make the window forget `event_id` and everything after it; the log keeps them."""
        runner = self._runner

        async def apply() -> TruncateResult:
            events = await runner.log.store.read(runner.session_id)
            cut = next((i for i, e in enumerate(events) if e.id == event_id), None)
            if not cut:  # not found, or the session.start event
                raise ValueError(
                    f"no event {event_id!r} to truncate at in session {runner.session_id}"
                )
            if isinstance(events[cut - 1], SessionPrunedEvent):
                raise ValueError(
                    f"the window before event {event_id!r} was pruned (spec X8): truncate at"
                    " a later event"
                )
            data = TruncatedData(
                event_id=event_id,
                events_removed=len(events) - cut,
                base=state_of(events[:cut]).conversation(),
            )
            await emit(runner, SessionTruncatedEvent(data=data))
            return TruncateResult(events_removed=data.events_removed)

        return await self._between_runs(apply)

    async def fork(self, event_id: str | None = None) -> S:
        """A new session whose log is a copy of this one's before `event_id` (all of it if
        None), at rest: it runs nothing by itself (spec §6)."""
        runner = self._runner
        events = await runner.log.store.read(runner.session_id)
        cut = len(events)
        if event_id is not None:
            cut = next((i for i, e in enumerate(events) if e.id == event_id), 0)
            if not cut:
                raise ValueError(
                    f"Event {event_id} not found in session {runner.session_id}: nothing to fork at"
                )
        if self._owner is None:
            raise TrimtabError("this session was not opened by a Client that can fork it")
        return await self._owner.fork_session(self._session, events[1:cut])

    async def summarize_for_handoff(self) -> str:
        """A markdown summary of the conversation for handing the work to another session.

        Refused on a remote session (spec R1): its model call would be logged here."""
        runner = self._runner
        _open(runner)
        if not runner.log.writable:
            raise TrimtabError(
                f"session {runner.session_id} is run by another runtime (remote): "
                "summarize it there"
            )
        return await summarize_for_handoff(runner.context(), runner)

    async def prune(self) -> PruneResult:
        """Remove the log's events before the window's base from the store, keeping what they
        folded to in one `session.pruned` event (spec X8): the window, the configuration, the
        usage and the epochs' markers stay; `get_events()` no longer returns those events.

        Refused with `PruneError` (`run_in_flight`) while a run or window operation is in
        progress or queued, on a remote session (`remote_session`), and while a subscription
        of this runtime's store still has to read what it would remove
        (`follower_behind`)."""
        runner = self._runner
        _open(runner)
        if not runner.log.writable:
            raise PruneError(
                "remote_session", f"session {runner.session_id} is run by another runtime"
            )
        if runner.busy:
            raise PruneError(
                "run_in_flight",
                f"session {runner.session_id} has a run or window operation in progress or"
                " queued: prune it once it is idle",
            )
        log = runner.log
        async with log.exclusive():  # (no append comes between the read and the prune)
            return await prune_log(log.store, runner.session_id, lease=log.lease)

    async def _between_runs(self, apply: Callable[[], Awaitable[T]]) -> T:
        """Run a window operation between runs, never during one (queued behind them)."""
        runner = self._runner
        if _loop.awaited_by.get() == runner.session_id:
            raise TrimtabError(
                "this operation cannot run inside a handler or hook of the same session's run;"
                " use history.clear_context from a tool handler"
            )
        _open(runner)
        if not runner.log.writable:
            raise TrimtabError(f"session {runner.session_id} is run by another runtime (remote)")
        return await runner.exclusive(apply)


def _open(runner: Runner) -> None:
    """Refuse an operation on a disconnected session (which holds no lease either, but is not
    run by another runtime)."""
    if runner.closed:
        raise TrimtabError(f"session {runner.session_id} is disconnected")


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


_LOOP_CALL_TIMEOUT = 60.0
"""Seconds a worker thread waits for the event loop to run a call for it."""


def _call_on_loop(loop: asyncio.AbstractEventLoop, function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` run on `loop`'s thread in the caller's context, from another thread."""
    done: concurrent.futures.Future[T] = concurrent.futures.Future()

    def call() -> None:
        try:
            done.set_result(function(*args))
        except BaseException as exc:
            done.set_exception(exc)

    loop.call_soon_threadsafe(call, context=contextvars.copy_context())
    try:
        return done.result(timeout=_LOOP_CALL_TIMEOUT)
    except concurrent.futures.TimeoutError:
        raise TrimtabError("the event loop did not answer within 60 s") from None
