"""`Session`: the public face of one agent session, and the only writer of its log."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
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
from trimtab._runs import RunLedger
from trimtab._subscribers import EventHandler, Subscribers
from trimtab._tools import Tool, ToolInvocation, valid_text
from trimtab._toolsearch import TOOL_SEARCH, deferred, make_tool_search
from trimtab._window import ContextWindow, Replay, context_window
from trimtab.events import (
    AssistantMessageEvent,
    Event,
    EventType,
    ModelLimits,
    SessionConfigData,
    SessionErrorData,
    SessionErrorEvent,
    SessionIdleEvent,
    SessionResumeData,
    SessionResumeEvent,
    ToolDefinition,
    ToolExecutionCompleteData,
    ToolExecutionCompleteEvent,
    ToolResultError,
    new_id,
)
from trimtab.providers import Message, Provider, ToolCall, Usage
from trimtab.providers._limits import limits_for
from trimtab.store import Lease, Store

__all__ = ["Session"]

T = TypeVar("T")

log = logging.getLogger("trimtab")


_NOTHING_DEFERRED: frozenset[str] = frozenset()

_STORE_RETRY_DELAYS = (0.1, 0.2, 0.5, 1.0, 2.0, 4.0)
"""Seconds between tries of an append while the store is unavailable (~8 s in all): a
database restart; past that the run ends in a `store` error (and the lease may be gone)."""


class _Rpc:
    __slots__ = ("history",)

    def __init__(self, history: History) -> None:
        self.history = history


@dataclass(slots=True)
class _Pending:
    """A queued message: it becomes a run when the runs before it have ended."""

    prompt: str
    message_id: str
    appended: bool
    source: str = "user"
    waiter: asyncio.Future[RunResult] | None = None
    interrupted: _loop.Interrupted | None = None
    """Set when this run continues one a crash interrupted (`continue_pending_work`)."""


@dataclass(slots=True)
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
    ) -> None:
        self.session_id = session_id
        self.state = LoopState()
        self.history = History(self)
        self.rpc = _Rpc(self.history)
        """`session.rpc.history.*`: the Copilot SDK's spelling of `session.history.*`."""
        self._store = store
        self._lease = lease
        self._replay = replayed
        # Windows come from the replay's incremental projection; the events behind it need
        # not stay in memory (an idle session holds its messages only).
        replayed.keep_events, replayed.window_events = False, []
        self._provider = provider
        # The client hands over a dict of its own: no copy (~200 bytes per idle session).
        self._tools = tools if type(tools) is dict else dict(tools)
        self._hidden: tuple[SessionConfigData, frozenset[str], dict[str, Tool]] | None = None
        self._permission_handler = permission_handler
        self._on_close = on_close
        self._on_fork = on_fork
        self._subscribers = Subscribers()
        # A list, not a deque: an empty deque takes ~600 bytes in every idle session, and a
        # queue holds a message or two.
        self._queue: list[_Pending | _Operation] = []
        self._worker: asyncio.Task[None] | None = None
        self._current: asyncio.Task[RunResult] | None = None
        self._follower: asyncio.Task[None] | None = None
        self._inbox: set[str] | None = None
        """Message ids of inputs queued from the store whose user message is not stored yet."""
        self._closed = False

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
        replay = self._replay
        epoch = replay.epoch + (event.type == "session.context_cleared")
        event = event.model_copy(update={"parent_id": replay.last_id, "context_epoch": epoch})
        if not event.ephemeral:
            if self._lease is None:
                raise LeaseLostError(
                    f"session {self.session_id} is remote: this runtime cannot write it"
                )
            await self._append(event)
            replay.apply(event)
        elif self._lease is not None:
            # Hosts following this session from other runtimes see its live events too.
            await self._store.publish(self.session_id, event, after=replay.event_count)
        self._subscribers.deliver(event)
        return event

    async def _append(self, event: Event) -> None:
        """Store one event, riding out a short store outage (a database restart): appends are
        idempotent by event id, so a try whose outcome was unknown is simply repeated."""
        assert self._lease is not None
        for delay in (*_STORE_RETRY_DELAYS, None):
            try:
                await self._store.append(self.session_id, (event,), lease=self._lease)
                return
            except StoreUnavailableError:
                if delay is None:
                    raise
                log.warning("store unavailable for session %s; retrying", self.session_id)
                await asyncio.sleep(delay)

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
        """Queue `prompt` for the agent and return its message id at once.

        The run starts right away when the session is idle; otherwise after the runs queued
        before it. On a remote session the message is queued in the store for its owner.
        """
        return (await self._submit(prompt, None)).message_id

    async def send_and_wait(
        self, prompt: str, *, timeout: float | None = None
    ) -> AssistantMessageEvent | None:
        """Send `prompt` and wait for its run to end.

        Returns the run's last `assistant.message` (after a clear, the seeded run's), or None
        if there was none (an abort before the model answered). Raises `SessionError` if the
        run ended in `session.error`, and `TimeoutError` after `timeout` seconds (the run
        goes on). On a remote session the run executes in its owner, and its end is read
        from the events this runtime follows.
        """
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
        """Stop the current run: running handlers are cancelled, the run ends with `abort` and
        `session.idle`. Messages queued behind it still run."""
        current = self._current
        if current is not None and not current.done():
            current.cancel()
            await asyncio.wait([current])

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
        """Abort any run, drop queued messages, release the lease. The log stays."""
        if self._closed:
            return
        self._closed = True
        await self._unfollow()
        for item in self._queue:
            if item.waiter is not None and not item.waiter.done():
                item.waiter.cancel()
        self._queue.clear()
        await self.abort()
        if self._worker is not None:
            await asyncio.wait([self._worker])
        if self._lease is not None:
            # Between runs the state is small: keep it, so the next open need not replay.
            snapshot = self._replay.snapshot()
            await self._store.save_snapshot(
                self.session_id, snapshot.event_count, snapshot.model_dump_json()
            )
            await self._store.release_lease(self._lease)
            self._lease = None
        if self._on_close is not None:
            self._on_close(self)

    # --- runs ----------------------------------------------------------------------------

    async def _submit(
        self, prompt: str, waiter: asyncio.Future[RunResult] | None, message_id: str | None = None
    ) -> _Pending:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        if valid_text(prompt) != prompt:
            raise ValueError("prompt is not valid Unicode text (it holds a lone surrogate)")
        if self._closed:
            raise TrimtabError(f"session {self.session_id} is disconnected")
        pending = _Pending(prompt, message_id or new_id(), appended=False, waiter=waiter)
        if self._lease is None:
            await self._store.enqueue_input(self.session_id, prompt, pending.message_id)
            return pending
        if self._worker is None:
            # Idle: record the message before returning, so the log shows what was sent.
            await self.emit(_loop.user_message(prompt, pending.message_id, "user"))
            pending.appended = True
        self._queue.append(pending)
        self._start_worker()
        return pending

    async def _take_inputs(self, pending: list[tuple[str, str]]) -> None:
        """Queue the inputs other runtimes sent (spec R1) that are not queued here yet.

        An input stays pending in the store until its user message is stored, so that a
        crash cannot lose it; until then it must not be queued twice.
        """
        queued = {message_id for _, message_id in pending} & (self._inbox or set())
        for prompt, message_id in pending:
            if message_id not in queued:
                queued.add(message_id)
                await self._submit(prompt, None, message_id)
        self._inbox = queued or None  # None, not an empty set, in every idle session

    def _start_worker(self) -> None:
        if self._worker is None and self._queue:
            self._worker = asyncio.get_running_loop().create_task(
                self._drain(), name=f"trimtab-{self.session_id}"
            )

    async def _drain(self) -> None:
        """Run queued items one after another; each run ends in one idle (spec E1)."""
        try:
            while self._queue:
                item = self._queue.pop(0)
                if isinstance(item, _Operation):
                    await self._apply(item)
                    continue
                run = _loop.run(
                    self,
                    item.prompt,
                    item.message_id,
                    source=item.source,
                    append_user=not item.appended,
                    interrupted=item.interrupted,
                )
                self._current = asyncio.get_running_loop().create_task(run)
                try:
                    result = await asyncio.shield(self._current)
                except asyncio.CancelledError:
                    result = RunResult(aborted=True)
                except Exception as exc:
                    # The store failed or the lease was lost: nothing more can be logged,
                    # but no waiter may hang, here or in a host following the session.
                    self._failed(exc, item.message_id, item.waiter)
                    continue
                finally:
                    self._current = None
                if item.waiter is not None and not item.waiter.done():
                    item.waiter.set_result(result)
        finally:
            self._worker = None

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
        if isinstance(exc, LeaseLostError):
            self._lease_lost()
        log.exception("run of session %s failed", self.session_id)
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        # Delivered, not stored (the store is what failed): the run still ends in a typed
        # error and one idle for whoever watches (spec E1).
        error_type = "lease_lost" if isinstance(exc, LeaseLostError) else "store"
        data = SessionErrorData(
            error_type=error_type,
            message=f"{type(exc).__name__}: {exc}",
            retryable=True,
            originating_message_id=message_id,
        )
        self._subscribers.deliver(SessionErrorEvent(data=data, ephemeral=True))
        self._subscribers.deliver(SessionIdleEvent())

    async def _exclusive(self, apply: Callable[[], Awaitable[T]]) -> T:
        """Run a window operation between runs, never during one (queued behind them)."""
        if _loop.current_tool_call.get() in self.state.in_flight:
            raise TrimtabError(
                "this operation cannot run inside a tool call of the same session; "
                "use history.clear_context from a tool handler"
            )
        if self._lease is None:
            raise TrimtabError(f"session {self.session_id} is run by another runtime (remote)")
        if self._closed:
            raise TrimtabError(f"session {self.session_id} is disconnected")
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Operation(apply, waiter))
        self._start_worker()
        result: T = await waiter
        return result

    # --- clear_context -------------------------------------------------------------------

    def _stage_clear(self, prompt: str) -> ClearContextResult:
        if self.is_remote:
            raise ClearContextError(
                "remote_session", f"session {self.session_id} is run by another runtime"
            )
        if not isinstance(prompt, str) or not prompt.strip():
            raise ClearContextError("empty_prompt", "the seed prompt must be a non-empty string")
        in_flight = self.state.in_flight
        call_id = _loop.current_tool_call.get()
        if call_id not in in_flight:
            # Called from outside the handler's context (e.g. over JSON-RPC): the earliest
            # running call of this session is the enclosing one.
            call_id = next(iter(in_flight), None)
        if call_id is None:
            raise ClearContextError(
                "no_tool_call_in_flight",
                "clear_context can only be called from a running tool handler",
            )
        if self.state.staged is not None or self.state.seed is not None:
            raise ClearContextError("clear_pending", "a clear is already pending in this run")
        cleared = self._replay.conversation_length()
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

    # --- leases and resume -------------------------------------------------------------

    def _lease_lost(self) -> None:
        """Another runtime may own the session now: stop writing (the next append would fail)."""
        self._lease = None
        self._follow()

    def _follow(self) -> None:
        """While remote, deliver the owner's events to this session's subscribers as they are
        stored, so that a host attached here sees a run executing elsewhere (spec R1)."""
        if self._follower is None and not self._closed:
            self._follower = asyncio.get_running_loop().create_task(
                self._follow_log(), name=f"trimtab-follow-{self.session_id}"
            )

    async def _follow_log(self) -> None:
        events = self._store.subscribe(self.session_id, after=self._replay.event_count)
        try:
            async for event in events:
                if not event.ephemeral:
                    self._replay.apply(event)
                self._subscribers.deliver(event)
        except SessionNotFoundError:
            pass  # deleted: nothing more will come
        finally:
            await events.aclose()

    async def _unfollow(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.wait([self._follower])
            self._follower = None

    async def _adopt(self, lease: Lease) -> None:
        """Take the session over from a runtime whose lease expired: catch up, then recover."""
        await self._unfollow()
        for event in await self._store.read(self.session_id, after=self._replay.event_count):
            self._replay.apply(event)
        self._lease = lease
        await self.emit(
            SessionResumeEvent(data=SessionResumeData(event_count=self._replay.event_count))
        )
        # Hosts here were following a run the crashed owner left: it goes on, from here.
        await self._recover(continue_run=True)

    # --- resume --------------------------------------------------------------------------

    async def _recover(self, *, continue_pending: bool = False, continue_run: bool = False) -> None:
        """Finish what a crash left (P3): unfinished calls of idempotent tools (all of them
        with `continue_pending`) run again, the others end `cancelled`; a run interrupted
        mid-turn goes on when a call runs again or when asked (`continue_pending`,
        `continue_run`). Then a pending seed is delivered (C10)."""
        replay = self._replay
        unfinished = list(replay.unfinished_calls.items())
        again = {
            call_id: start
            for call_id, start in unfinished
            if continue_pending or _is_idempotent(self._tools.get(start.tool_name))
        }
        for call_id, start in unfinished:
            if call_id not in again:
                await self.emit(
                    ToolExecutionCompleteEvent(
                        data=ToolExecutionCompleteData(
                            tool_call_id=call_id,
                            success=False,
                            outcome="cancelled",
                            error=ToolResultError(message=_loop.INTERRUPTED, code="cancelled"),
                            tool_name=start.tool_name,
                        )
                    )
                )
        if replay.open_turn is not None and (continue_pending or continue_run or again):
            calls = tuple(
                ToolCall(id=call_id, name=d.tool_name, arguments=_arguments_text(d.arguments))
                for call_id, d in again.items()
            )
            interrupted = _loop.Interrupted(replay.open_turn, calls)
            message_id = replay.last_message_id or new_id()
            self._queue.append(_Pending("", message_id, appended=True, interrupted=interrupted))
            self._start_worker()
            return
        seed = self._replay.pending_seed
        if seed is not None:
            self._queue.append(
                _Pending(
                    seed, new_id(), appended=self._replay.seed_recorded, source="context_cleared"
                )
            )
            self._start_worker()


def _is_idempotent(tool: Tool | None) -> bool:
    return tool is not None and tool.definition.idempotent


def _arguments_text(arguments: object) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
