"""`Session`: the public face of one agent session, and the only writer of its log."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from trimtab import _loop
from trimtab._errors import (
    ClearContextError,
    LeaseLostError,
    SessionError,
    SessionNotFoundError,
    StoreUnavailableError,
    TrimtabError,
)
from trimtab._history import ClearContextResult, History
from trimtab._loop import LoopState, RunResult
from trimtab._permissions import PermissionHandlerFn
from trimtab._replay import Replay
from trimtab._runs import RunLedger
from trimtab._subscribers import EventHandler, Subscribers
from trimtab._tools import Tool, ToolInvocation, ToolSource, valid_text
from trimtab._toolsearch import TOOL_SEARCH, deferred, make_tool_search
from trimtab._window import ContextWindow, context_window
from trimtab.events import (
    AbortEvent,
    AssistantMessageEvent,
    AssistantTurnEndEvent,
    Event,
    EventType,
    ModelLimits,
    SessionConfigData,
    SessionErrorData,
    SessionErrorEvent,
    SessionIdleData,
    SessionIdleEvent,
    SessionResumeData,
    SessionResumeEvent,
    SessionWarningEvent,
    ToolDefinition,
    ToolExecutionCompleteData,
    ToolExecutionCompleteEvent,
    ToolResultError,
    TurnData,
    UserMessageEvent,
    WarningData,
    new_id,
)
from trimtab.providers import Message, Provider, ToolCall, Usage
from trimtab.providers._limits import limits_for
from trimtab.store import Lease, Store

__all__ = ["Session", "chained"]

T = TypeVar("T")

log = logging.getLogger("trimtab")


_NOTHING_DEFERRED: frozenset[str] = frozenset()

_STORE_RETRY_DELAYS = (0.1, 0.2, 0.5, 1.0, 2.0)
"""Seconds between tries of an append while the store is unavailable (a database restart),
the last one repeated, for as long as the store's `timeout` allows in all; past that the run
ends in a `store` error (and the lease may be gone)."""


class _Rpc:
    __slots__ = ("history",)

    def __init__(self, history: History) -> None:
        self.history = history


@dataclass(slots=True, eq=False)
class _Pending:
    """A run to make: a queued message (its input waits in the store's inbox until its
    `user.message` is stored), or the continuation of a run a crash interrupted."""

    prompt: str
    message_id: str
    appended: bool
    """Its `user.message` is logged already."""
    waiter: asyncio.Future[RunResult] | None = None
    interrupted: _loop.Interrupted | None = None
    """Set when this run goes on from one a crash interrupted (spec P3, C10)."""
    aborted: bool = False
    """`abort()` came before the run started: it ends at once, as an abort."""
    started: bool = False
    """Its run's task has begun (cancelling a task before that would skip its body, and the
    abort it logs)."""
    ended: asyncio.Event | None = None
    """Set once the run ended (created for whoever waits for that)."""


@dataclass(slots=True, eq=False)
class _Operation:
    """A queued window operation (compact, truncate): it never overlaps a run."""

    apply: Callable[[], Awaitable[Any]]
    waiter: asyncio.Future[Any]


class Session:
    """A live agent session: send messages, watch events, manage the context window.

    Create one with `Client.create_session` or `Client.resume_session`.
    """

    def __init__(
        self,
        session_id: str,
        *,
        store: Store,
        lease: Lease | None,
        replayed: Replay,
        provider: Provider,
        tools: Mapping[str, Tool],
        permission_handler: PermissionHandlerFn | None,
        on_close: Callable[[Session], None] | None = None,
        on_fork: Callable[[Session, list[Event]], Awaitable[Session]] | None = None,
        tool_source: ToolSource | None = None,
    ) -> None:
        self.session_id = session_id
        self.state = LoopState()
        self.history = History(self)
        self.rpc = _Rpc(self.history)
        """`session.rpc.history.*`: the Copilot SDK's spelling of `session.history.*`."""
        self._store = store
        self._lease = lease
        self._replay = replayed
        self._provider = provider
        # The client hands over a dict of its own: no copy (~200 bytes per idle session).
        self._tools = tools if type(tools) is dict else dict(tools)
        self._own_tools = self._tools
        """The tools the session was given; `_tools` adds the tool source's to them."""
        self._tool_source = tool_source
        self._hidden: tuple[SessionConfigData, frozenset[str], dict[str, Tool]] | None = None
        self._permission_handler = permission_handler
        self._on_close = on_close
        self._on_fork = on_fork
        self._subscribers = Subscribers()
        self._event_loop = asyncio.get_running_loop()
        self._writer = asyncio.Lock()
        """Held while events are stamped, stored and delivered: one chain (E3) however many
        tool calls finish at once, whatever the store awaits."""
        # A list, not a deque: an empty deque takes ~600 bytes in every idle session, and a
        # queue holds a message or two.
        self._queue: list[_Pending | _Operation] = []
        self._worker: asyncio.Task[None] | None = None
        self._current: asyncio.Task[RunResult] | None = None
        self._running: _Pending | None = None
        self._follower: asyncio.Task[None] | None = None
        self._idle_sent = False
        """While following: the idle of the owner's last run was delivered from its log."""
        self._inbox: set[str] | None = None
        """Message ids of stored inputs queued here whose user message is not stored yet."""
        self._closing: asyncio.Task[None] | None = None
        self._unsure = False
        """An append was given up on: the log may hold more than the replay has applied."""

    def __repr__(self) -> str:
        return f"Session({self.session_id!r}, remote={self.is_remote})"

    # --- what the loop sees (LoopHost) ---------------------------------------------------

    @property
    def config(self) -> SessionConfigData:
        return self._replay.config

    @property
    def provider(self) -> Provider:
        return self._provider

    @property
    def tools(self) -> Mapping[str, Tool]:
        """Every callable tool, the built-in `tool_search` included when tools are deferred."""
        return self._deferral()[1]

    def deferred(self) -> frozenset[str]:
        """Tools left out of the model's list until `tool_search` finds them."""
        return self._deferral()[0]

    def _deferral(self) -> tuple[frozenset[str], dict[str, Tool]]:
        # Recomputed only when the configuration changes (it is replaced, never mutated).
        config = self._replay.config
        if self._hidden is None or self._hidden[0] is not config:
            # One shared empty set when nothing is deferred (the usual case): ~200 bytes less
            # per session.
            hidden = deferred(self._tools, config.tool_search) or _NOTHING_DEFERRED
            tools = self._tools
            if hidden and TOOL_SEARCH not in tools:
                tools = {**tools, TOOL_SEARCH: make_tool_search(self._tools, hidden)}
            self._hidden = (config, hidden, tools)
        return self._hidden[1], self._hidden[2]

    async def refresh_tools(self) -> None:
        """Take in what changed in the tool source (MCP servers started, their lists
        changed) before a turn: never during one, so a batch sees one set of tools."""
        if self._tool_source is None:
            return
        try:
            tools, warnings = await self._tool_source.refresh()
        except Exception:
            log.exception("the tool source of session %s failed", self.session_id)
            return
        if warnings:
            await self.emit_all(
                [
                    SessionWarningEvent(data=WarningData(warning_type="mcp", message=valid_text(w)))
                    for w in warnings
                ]
            )
        if tools is not None:
            self._tools = {**tools, **self._own_tools}
            self._hidden = None

    def model_tools(self) -> list[ToolDefinition]:
        """The tool definitions sent to the model on its next call."""
        hidden, discovered = self.deferred(), self.state.discovered
        return [t.definition for n, t in self.tools.items() if n not in hidden or n in discovered]

    @property
    def limits(self) -> ModelLimits:
        """The model's context window and output limit (the session's override, else the table)."""
        config = self.config
        model = config.model
        if model is None and (config.provider or {}).get("type") == "local":
            model = "smollm2"  # the embedded default model, whose window is small
        return limits_for(model, config.model_limits)

    @property
    def usage(self) -> Usage:
        """Tokens used by every model call of the session, clears and compactions included."""
        return self._replay.usage

    @property
    def permission_handler(self) -> PermissionHandlerFn | None:
        return self._permission_handler

    @property
    def is_remote(self) -> bool:
        """Another runtime holds this session's lease: it may be read, not driven (spec R1)."""
        return self._lease is None

    @property
    def context_epoch(self) -> int:
        """How many clears this session has committed."""
        return self._replay.epoch

    def window(self) -> list[Message]:
        """The messages the model will see on its next call."""
        return self._replay.window()

    def conversation(self) -> list[Message]:
        """The window without its system and developer messages."""
        return self._replay.conversation()

    def get_context(self) -> ContextWindow:
        """What the model will see next, with token counts, so a host can inspect its budget."""
        return context_window(self.window(), self.model_tools(), self.limits.context_window)

    @property
    def approved_tools(self) -> frozenset[str]:
        """Tools approved for the rest of the session (`approve-for-session`, from the log)."""
        return self._replay.approved_tools

    @property
    def running(self) -> bool:
        """Whether the log shows a run in progress (it may have been interrupted by a crash)."""
        return self._replay.run_id is not None

    @property
    def pending_seed(self) -> tuple[str, bool] | None:
        replay = self._replay
        if replay.pending_seed is None:
            return None
        return replay.pending_seed, replay.seed_recorded

    def next_turn_id(self) -> str:
        return str(self._replay.turns)

    def invocation(self, call: ToolCall, arguments: object) -> ToolInvocation:
        return ToolInvocation(
            session_id=self.session_id,
            tool_call_id=call.id,
            tool_name=call.name,
            arguments=arguments,
            session=self,
        )

    async def emit(self, event: Event) -> Event:
        """Stamp, persist (unless ephemeral), then deliver one event; the log's only writer."""
        return (await self.emit_all((event,)))[0]

    async def emit_all(self, events: Sequence[Event]) -> list[Event]:
        """`emit` for events that must be stored together (one atomic append) and in a row.

        Never half done: an abort that cancels the caller meanwhile takes effect once the
        events are stored and delivered (a call's start without its end, or an end that is
        stored but not known here, would break O1 and E3)."""
        emitting = asyncio.ensure_future(self._emit_locked(events))
        try:
            return await asyncio.shield(emitting)
        except asyncio.CancelledError:
            while not emitting.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([emitting])
            raise

    async def _emit_locked(self, events: Sequence[Event]) -> list[Event]:
        async with self._writer:
            return await self._emit(events)

    async def _emit(self, events: Sequence[Event]) -> list[Event]:
        """`emit_all`, with the writer lock held by the caller."""
        replay = self._replay
        if self._unsure and self._lease is not None and not all(e.ephemeral for e in events):
            await self._catch_up()
        stamped = chained(events, replay.last_id, replay.epoch)
        stored = [e for e in stamped if not e.ephemeral]
        if stored:
            if self._lease is None:
                raise LeaseLostError(
                    f"session {self.session_id} is remote: this runtime cannot write it"
                )
            await self._append(stored)
        for event in stamped:
            if not event.ephemeral:
                replay.apply(event)
                if self._inbox and isinstance(event, UserMessageEvent):
                    self._inbox.discard(event.data.message_id or "")
            elif self._lease is not None:
                # Hosts following this session from other runtimes see its live events too.
                await self._store.publish(self.session_id, event, after=replay.event_count)
            self._subscribers.deliver(event)
        return stamped

    async def _append(self, events: Sequence[Event]) -> None:
        """Store events, riding out a short store outage (a database restart) for at most the
        store's `timeout` in all: appends are idempotent by event id, so a try whose outcome
        was unknown is simply repeated."""
        assert self._lease is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        for attempt in itertools.count():
            try:
                await self._store.append(self.session_id, events, lease=self._lease)
                return
            except StoreUnavailableError:
                delay = _STORE_RETRY_DELAYS[min(attempt, len(_STORE_RETRY_DELAYS) - 1)]
                if loop.time() + delay >= started + self._store.timeout:
                    # Given up, but it may still land (a frozen server that wakes): the next
                    # append first reads the log's tail, so that it follows whatever did.
                    self._unsure = True
                    raise
                log.warning("store unavailable for session %s; retrying", self.session_id)
                await asyncio.sleep(delay)

    async def _catch_up(self) -> None:
        """Apply (and deliver) the events stored after what this session knows (appends given
        up on or cancelled, that landed), so that the next one follows the log's tail (E3)."""
        for event in await self._store.read(self.session_id, after=self._replay.event_count):
            self._replay.apply(event)
            self._subscribers.deliver(event)
        self._unsure = False

    # --- public API ----------------------------------------------------------------------

    @overload
    def on(self, handler: EventHandler, /) -> Callable[[], None]: ...
    @overload
    def on(self, event_type: EventType, handler: EventHandler, /) -> Callable[[], None]: ...
    def on(
        self, first: EventType | EventHandler, handler: EventHandler | None = None, /
    ) -> Callable[[], None]:
        """Subscribe to events (all, or one type); returns a function that unsubscribes.

        Handlers are called synchronously, in log order, right after each event is stored.
        """
        return self._subscribers.add(first, handler)

    async def send(self, prompt: str) -> str:
        """Queue `prompt` for the agent and return its message id once it is stored.

        The run starts right away when the session is idle (its `user.message` is stored
        before this returns); otherwise the input waits in the store's inbox until the runs
        queued before it have ended, so that a crash cannot lose it. On a remote session the
        input is queued in the store for its owner.
        """
        return (await self._submit(prompt, None)).message_id

    async def send_and_wait(
        self, prompt: str, *, timeout: float | None = None
    ) -> AssistantMessageEvent | None:
        """Send `prompt` and wait for its run to end.

        Returns the run's last `assistant.message` as stored (after a clear, the seeded
        run's), or None if there was none (an abort before the model answered). Raises
        `SessionError` if the run ended in `session.error`, `TimeoutError` after `timeout`
        seconds (the run goes on), and `TrimtabError` when the session is disconnected
        before the run ends, or when called from a tool handler of this session (the run
        would wait for itself). On a remote session the run executes in its owner, and its
        end is read from the events this runtime follows.
        """
        current = _loop.current_tool_call.get()
        if current is not None and current[0] == self.session_id:
            raise TrimtabError(
                "send_and_wait from a tool handler of the same session would wait for its own "
                "run to end: use send(), which queues the message behind the run"
            )
        if self.is_remote:
            return await self._send_and_follow(prompt, timeout)
        waiter: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        await self._submit(prompt, waiter)
        result = await asyncio.wait_for(asyncio.shield(waiter), timeout)
        if result.error is not None:
            data = result.error.data
            raise SessionError(data.error_type, data.message, status_code=data.status_code)
        return result.last_message

    async def _send_and_follow(
        self, prompt: str, timeout: float | None
    ) -> AssistantMessageEvent | None:
        ledger = RunLedger()
        unsubscribe = self.on(ledger.observe)  # before the send: no event may slip by
        try:
            message_id = (await self._submit(prompt, None)).message_id
            run = await asyncio.wait_for(ledger.wait(message_id), timeout)
        finally:
            unsubscribe()
        if run.error is not None:
            data = run.error.data
            raise SessionError(data.error_type, data.message, status_code=data.status_code)
        return run.last_message

    async def abort(self) -> None:
        """Stop the current run, or the one about to start (right after `send`): running
        handlers are cancelled, the run ends with `abort` and `session.idle`. Messages queued
        behind it still run. Returns once the run has ended."""
        target = self._running
        if target is None and self._worker is not None:
            target = next((item for item in self._queue if isinstance(item, _Pending)), None)
        if target is None:
            return
        current = self._current
        if target.started and current is not None and not current.done():
            current.cancel()
        else:
            target.aborted = True  # it ends as an abort as soon as it starts
        target.ended = target.ended or asyncio.Event()
        await target.ended.wait()

    @property
    def busy(self) -> bool:
        """A run or window operation is in progress or queued."""
        return self._worker is not None

    async def wait_idle(self) -> None:
        """Return once no run or operation is in progress or queued."""
        while (worker := self._worker) is not None:
            await asyncio.wait([worker])

    async def get_events(self) -> list[Event]:
        """The persisted log, oldest first."""
        return await self._store.read(self.session_id)

    async def disconnect(self) -> None:
        """Abort any run, release the lease; the log stays, and so do inputs queued behind the
        run (stored, they run when the session is next opened). Waiters of those get a
        `TrimtabError`. Safe from anywhere, a tool handler of this session included: the
        handler is cancelled, and the disconnect completes."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(
                self._close(), name=f"trimtab-close-{self.session_id}"
            )
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        await self._unfollow()
        kept: list[_Pending | _Operation] = []
        for item in self._queue:
            if isinstance(item, _Pending) and item.appended and item.interrupted is None:
                item.aborted = True  # its message is logged: the run ends, as an abort
                kept.append(item)
            elif item.waiter is not None and not item.waiter.done():
                item.waiter.set_exception(
                    TrimtabError(
                        f"session {self.session_id} was disconnected before this ran"
                        + (" (the message stays queued in the store)" if _queued(item) else "")
                    )
                )
        self._queue[:] = kept
        self._inbox = None
        await self.abort()
        if self._worker is not None:
            await asyncio.wait([self._worker])
        if self._lease is not None:
            if not self._replay.unfinished_calls:
                # Between runs the state is small: keep it, so the next open need not replay.
                snapshot = self._replay.snapshot()
                await self._store.save_snapshot(
                    self.session_id, snapshot.event_count, snapshot.model_dump_json()
                )
            await self._store.release_lease(self._lease)
            self._lease = None
        if self._tool_source is not None:
            await self._tool_source.close()
        if self._on_close is not None:
            self._on_close(self)

    @property
    def closed(self) -> bool:
        """`disconnect()` was called: the session can no longer be used."""
        return self._closing is not None

    # --- runs ----------------------------------------------------------------------------

    async def _submit(
        self, prompt: str, waiter: asyncio.Future[RunResult] | None, message_id: str | None = None
    ) -> _Pending:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        if valid_text(prompt) != prompt:
            raise ValueError("prompt is not valid Unicode text (it holds a lone surrogate)")
        if self.closed:
            raise TrimtabError(f"session {self.session_id} is disconnected")
        pending = _Pending(prompt, message_id or new_id(), appended=False, waiter=waiter)
        if self._lease is None:
            await self._store.enqueue_input(self.session_id, prompt, pending.message_id)
            return pending
        async with self._writer:
            if self._worker is None:
                # Idle: the message is stored before this returns, and its run starts.
                user = _loop.user_message(prompt, pending.message_id, "user")
                await self._emit((user,))
                pending.appended = True
            else:
                # Busy: the input waits in the store, never only in memory (nothing
                # acknowledged may be lost to a crash); its run stores its message.
                await self._store.enqueue_input(self.session_id, prompt, pending.message_id)
                self._inbox = (self._inbox or set()) | {pending.message_id}
            self._queue.append(pending)
            self._start_worker()
        return pending

    async def _take_inputs(self) -> None:
        """Queue the stored inputs (sent by other runtimes, or left by a crash, spec R1) that
        are not queued here yet. An input stays pending in the store until its user message
        is stored, so that a crash cannot lose it; until then it must not be queued twice.
        The inbox is read under the writer lock: an input whose message is being stored
        right now is either still pending and queued here, or claimed, never both."""
        if self.closed or self._lease is None:
            return
        async with self._writer:
            for prompt, message_id in await self._store.pending_inputs(self.session_id):
                if message_id not in (self._inbox or ()):
                    self._inbox = (self._inbox or set()) | {message_id}
                    self._queue.append(_Pending(prompt, message_id, appended=False))
            self._start_worker()

    def _start_worker(self) -> None:
        if self._worker is None and self._queue:
            self._worker = asyncio.get_running_loop().create_task(
                self._drain(), name=f"trimtab-{self.session_id}"
            )

    async def _drain(self) -> None:
        """Run queued items one after another; each run ends in one idle (spec E1)."""
        try:
            while self._queue:
                if self._lease is None:
                    self._drop_queue(LeaseLostError(f"session {self.session_id} moved"))
                    return
                item = self._queue.pop(0)
                if isinstance(item, _Operation):
                    await self._apply(item)
                    continue
                try:
                    await self._run(item)
                finally:
                    if item.ended is not None:
                        item.ended.set()
        finally:
            self._worker = None

    async def _run(self, item: _Pending) -> None:
        self._running = item
        try:
            if not item.appended:
                # Stored from here, where no abort cancels: the input's message is logged
                # (claiming it in the inbox) before its run can be stopped.
                await self.emit(_loop.user_message(item.prompt, item.message_id, "user"))
                item.appended = True
        except Exception as exc:
            self._running = None
            self._failed(exc, item.message_id, item.waiter)
            return
        self._current = asyncio.get_running_loop().create_task(self._body(item))
        try:
            result = await asyncio.shield(self._current)
        except asyncio.CancelledError:
            result = RunResult(aborted=True)  # aborted again while it stopped
        except Exception as exc:
            # The store failed or the lease was lost: nothing more can be logged, but no
            # waiter may hang, here or in a host following the session.
            self._failed(exc, item.message_id, item.waiter)
            return
        finally:
            self._current = self._running = None
        # The run's one idle (E1), from here: an abort cancels the run's task, not this one.
        await self.emit(SessionIdleEvent(data=SessionIdleData(aborted=result.aborted or None)))
        if item.waiter is not None and not item.waiter.done():
            item.waiter.set_result(result)

    async def _body(self, item: _Pending) -> RunResult:
        """The run's task: it reads `item.aborted` only once it has started."""
        item.started = True
        return await _loop.run(
            self, item.message_id, interrupted=item.interrupted, aborted=item.aborted
        )

    def _drop_queue(self, reason: Exception) -> None:
        """Let go of the queued items: their stored inputs wait for the session's next owner."""
        for item in self._queue:
            if item.waiter is not None and not item.waiter.done():
                item.waiter.set_exception(reason)
            if isinstance(item, _Pending) and item.ended is not None:
                item.ended.set()
        self._queue.clear()
        self._inbox = None

    async def _apply(self, operation: _Operation) -> None:
        try:
            result = await operation.apply()
        except Exception as exc:
            if not operation.waiter.done():
                operation.waiter.set_exception(exc)
            return
        if not operation.waiter.done():
            operation.waiter.set_result(result)

    def _failed(
        self, exc: Exception, message_id: str, waiter: asyncio.Future[RunResult] | None
    ) -> None:
        cause = _cause(exc)
        if isinstance(cause, LeaseLostError):
            self._lease_lost()
        log.error("run of session %s failed", self.session_id, exc_info=exc)
        if waiter is not None and not waiter.done():
            waiter.set_exception(cause)
        # Delivered, not stored (the store is what failed): the run still ends in a typed
        # error and one idle for whoever watches (spec E1).
        error_type = "lease_lost" if isinstance(cause, LeaseLostError) else "store"
        data = SessionErrorData(
            error_type=error_type,
            message=valid_text(f"{type(cause).__name__}: {cause}"),
            retryable=True,
            originating_message_id=message_id,
        )
        self._subscribers.deliver(SessionErrorEvent(data=data, ephemeral=True))
        self._subscribers.deliver(SessionIdleEvent())

    async def _exclusive(self, apply: Callable[[], Awaitable[T]]) -> T:
        """Run a window operation between runs, never during one (queued behind them)."""
        current = _loop.current_tool_call.get()
        if current is not None and current[0] == self.session_id:
            raise TrimtabError(
                "this operation cannot run inside a tool call of the same session; "
                "use history.clear_context from a tool handler"
            )
        if self._lease is None:
            raise TrimtabError(f"session {self.session_id} is run by another runtime (remote)")
        if self.closed:
            raise TrimtabError(f"session {self.session_id} is disconnected")
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Operation(apply, waiter))
        self._start_worker()
        result: T = await waiter
        return result

    # --- clear_context -------------------------------------------------------------------

    def _stage_clear(self, prompt: str) -> ClearContextResult:
        if not _on_loop(self._event_loop):
            # A sync handler runs in a worker thread: stage on the loop, in its context.
            return _call_on_loop(self._event_loop, self._stage_clear, prompt)
        if self.is_remote:
            raise ClearContextError(
                "remote_session", f"session {self.session_id} is run by another runtime"
            )
        if not isinstance(prompt, str) or not prompt.strip():
            raise ClearContextError("empty_prompt", "the seed prompt must be a non-empty string")
        if valid_text(prompt) != prompt:
            raise ClearContextError(
                "invalid_prompt", "the seed prompt is not valid Unicode text (a lone surrogate)"
            )
        in_flight = self.state.in_flight
        current = _loop.current_tool_call.get()
        if current is None:
            # Called from outside any handler's context (e.g. over JSON-RPC): the earliest
            # running call of this session is the enclosing one.
            call_id = next(iter(in_flight), None)
        elif current[0] == self.session_id and current[1] in in_flight:
            call_id = current[1]
        else:
            call_id = None  # a handler of another session: never this session's call (C1)
        if call_id is None:
            raise ClearContextError(
                "no_tool_call_in_flight",
                "clear_context can only be called from a running tool handler of this session",
            )
        if self.state.staged is not None or self._replay.pending_seed is not None:
            raise ClearContextError("clear_pending", "a clear is already pending in this run")
        cleared = self._replay.messages_cleared()
        self.state.staged = _loop.StagedClear(prompt, cleared, call_id)
        return ClearContextResult(messages_cleared=cleared)

    async def _fork(self, event_id: str | None) -> Session:
        events = await self.get_events()
        cut = len(events)
        if event_id is not None:
            cut = next((i for i, e in enumerate(events) if e.id == event_id), 0)
            if not cut:
                raise ValueError(f"session {self.session_id} has no event {event_id!r} to fork at")
        if self._on_fork is None:
            raise TrimtabError("this session was not opened by a Client that can fork it")
        return await self._on_fork(self, events[1:cut])

    async def _settle(self) -> None:
        """Bring a copied log to rest without running anything (a fork is inert): calls
        left unfinished end `cancelled`, an open turn is closed, a committed clear's seed is
        kept in the window, and a run left in progress ends as aborted."""
        replay = self._replay
        events: list[Event] = [
            _cancelled(call_id, start.tool_name)
            for call_id, start in replay.unfinished_calls.items()
        ]
        if replay.open_turn is not None:
            events.append(AssistantTurnEndEvent(data=TurnData(turn_id=replay.open_turn)))
        if replay.pending_seed is not None and not replay.seed_recorded:
            events.append(_loop.user_message(replay.pending_seed, new_id(), "context_cleared"))
        if replay.run_id is not None:
            events.append(AbortEvent())
        if events:
            await self.emit_all(events)

    # --- leases and resume -------------------------------------------------------------

    def _lease_lost(self) -> None:
        """Another runtime may own the session now: stop writing (the next append would fail)."""
        self._lease = None
        self._follow()

    def _follow(self) -> None:
        """While remote, deliver the owner's events to this session's subscribers as they are
        stored, so that a host attached here sees a run executing elsewhere (spec R1)."""
        if self._follower is None and not self.closed:
            self._follower = asyncio.get_running_loop().create_task(
                self._follow_log(), name=f"trimtab-follow-{self.session_id}"
            )

    async def _follow_log(self) -> None:
        events = self._store.subscribe(self.session_id, after=self._replay.event_count)
        try:
            async for event in events:
                self._deliver_followed(event)
        except SessionNotFoundError:
            pass  # deleted: nothing more will come
        finally:
            await events.aclose()

    def _deliver_followed(self, event: Event) -> None:
        """Deliver one of the owner's events, with exactly one idle per run (spec E1): the
        log tells when a run ended, so the idle is delivered then; the owner's own idle,
        where the store carries it here at all, comes right after and is dropped."""
        if isinstance(event, SessionIdleEvent) and self._idle_sent:
            self._idle_sent = False
            return
        ended = not event.ephemeral and self._replay.apply(event)
        self._idle_sent = False
        self._subscribers.deliver(event)
        if ended:
            aborted = isinstance(event, AbortEvent) or None
            self._subscribers.deliver(SessionIdleEvent(data=SessionIdleData(aborted=aborted)))
            self._idle_sent = True

    async def _unfollow(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.wait([self._follower])
            self._follower = None

    async def _adopt(self, lease: Lease) -> None:
        """Take the session over from a runtime whose lease expired: catch up, then recover.

        The writer lock is held throughout, so that a `send` racing the takeover comes after
        its `session.resume` and recovery, never between them (E3)."""
        await self._unfollow()
        async with self._writer:
            for event in await self._store.read(self.session_id, after=self._replay.event_count):
                self._replay.apply(event)
            self._lease = lease
            resumed = SessionResumeData(event_count=self._replay.event_count)
            await self._emit((SessionResumeEvent(data=resumed),))
            # Hosts here were following a run the crashed owner left: it goes on, from here.
            await self._recover_locked(continue_pending=False, continue_run=True)

    async def _recover(self, *, continue_pending: bool = False) -> None:
        """Finish what a crash left (spec P3, C10), then queue the inputs stored for the
        session, in order."""
        async with self._writer:
            await self._recover_locked(continue_pending=continue_pending, continue_run=False)

    async def _recover_locked(self, *, continue_pending: bool, continue_run: bool) -> None:
        """Unfinished calls of idempotent tools (all of them with `continue_pending`) run
        again, the others end `cancelled`. The interrupted run goes on when a call runs again,
        when a committed clear's seed has not run yet (C10), or when asked
        (`continue_pending`, `continue_run`); otherwise it is left as the crash left it."""
        replay = self._replay
        again = {
            call_id: start
            for call_id, start in replay.unfinished_calls.items()
            if continue_pending or _is_idempotent(self._tools.get(start.tool_name))
        }
        cancelled = [
            _cancelled(call_id, start.tool_name)
            for call_id, start in replay.unfinished_calls.items()
            if call_id not in again
        ]
        if cancelled:
            await self._emit(cancelled)
        go_on = continue_pending or continue_run or again or replay.pending_seed is not None
        if replay.run_id is not None and go_on:
            calls = tuple(
                ToolCall(id=call_id, name=d.tool_name, arguments=_arguments_text(d.arguments))
                for call_id, d in again.items()
            )
            interrupted = _loop.Interrupted(replay.open_turn, calls)
            self._queue.append(_Pending("", replay.run_id, appended=True, interrupted=interrupted))
            self._start_worker()


def chained(events: Sequence[Event], parent: str | None, epoch: int) -> list[Event]:
    """`events` stamped to follow the stored event `parent` in context epoch `epoch`: each
    stored one links to the one before it (E3), and a clear starts the next epoch (C9)."""
    stamped: list[Event] = []
    for event in events:
        epoch += event.type == "session.context_cleared"
        stamped.append(event.model_copy(update={"parent_id": parent, "context_epoch": epoch}))
        if not event.ephemeral:
            parent = event.id
    return stamped


def _cancelled(call_id: str, tool_name: str) -> ToolExecutionCompleteEvent:
    return ToolExecutionCompleteEvent(
        data=ToolExecutionCompleteData(
            tool_call_id=call_id,
            success=False,
            outcome="cancelled",
            error=ToolResultError(message=_loop.INTERRUPTED, code="cancelled"),
            tool_name=tool_name,
        )
    )


def _queued(item: _Pending | _Operation) -> bool:
    return isinstance(item, _Pending) and not item.appended and item.interrupted is None


def _cause(exc: BaseException) -> Exception:
    """The exception that ended a run: the first one inside an `ExceptionGroup` (a batch's
    calls fail together when the store fails)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


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


def _is_idempotent(tool: Tool | None) -> bool:
    return tool is not None and tool.definition.idempotent


def _arguments_text(arguments: object) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
