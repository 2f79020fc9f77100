"""`Runner`: runs a session's inputs one after another, each to its one idle.

It owns the queue (inputs and window operations, in order), the task of the run in progress
(what `abort` cancels), the one way to wait for a run's end (`RunLedger`, from the events
the session delivers: the same whether the run is here or in another runtime), and builds
the `RunContext` each turn of the loop works with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from trimtab import _loop
from trimtab._compaction import needs_fitting
from trimtab._errors import (
    ClearContextError,
    LeaseLostError,
    LogTailLostError,
    QueueEditError,
    TrimtabError,
)
from trimtab._hooks import Hooks
from trimtab._log import SessionLog, Settle
from trimtab._loop import LoopState
from trimtab._output import Output, output_of
from trimtab._permissions import PermissionHandlerFn
from trimtab._results import ClearContextResult
from trimtab._run_context import RunContext
from trimtab._runs import RunEnd, RunLedger
from trimtab._state import SessionState
from trimtab._toolbox import Toolbox
from trimtab._tools import SessionHandle, valid_text
from trimtab._tracing import Tracing
from trimtab._window import estimate_tokens
from trimtab.events import (
    AssistantTurnStartEvent,
    Budget,
    CommandCompletedData,
    CommandCompletedEvent,
    CommandQueuedData,
    CommandQueuedEvent,
    Event,
    Image,
    ModelLimits,
    PendingMessagesModifiedData,
    PendingMessagesModifiedEvent,
    SessionConfigData,
    SessionErrorData,
    SessionErrorEvent,
    SessionIdleData,
    SessionIdleEvent,
    SessionWarningEvent,
    UserMessageData,
    UserMessageEvent,
    WarningData,
    new_id,
)
from trimtab.providers import Message, Provider
from trimtab.providers._limits import limits_for

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = ["COMMAND_TIMEOUT", "Attached", "Command", "Pending", "Runner", "Waiting"]

T = TypeVar("T")

EDIT_TRIES = 3
"""Times an edit of the queue is made again when the store's inbox changed meanwhile (an
input another runtime queued), before it is refused."""

COMMAND_TIMEOUT = 120.0
"""Seconds a queued command waits for a host's answer once its turn came (spec K13); then
the queue goes on without it."""

log = logging.getLogger("trimtab")


@dataclass(slots=True, eq=False)
class Pending:
    """A run to make: a queued message (its input waits in the store's inbox until its
    `user.message` is stored), or the continuation of a run a crash interrupted."""

    prompt: str
    message_id: str
    appended: bool
    """Its `user.message` is logged already."""
    interrupted: _loop.Interrupted | None = None
    """Set when this run goes on from one a crash interrupted (spec P3, C10)."""
    aborted: bool = False
    """`abort()` came before the run started: it ends at once, as an abort."""
    started: bool = False
    """Its run's task has begun (cancelling a task before that would skip its body, and the
    abort it logs)."""
    turn: str | None = None
    """Its run's first turn, when its `assistant.turn_start` was logged with the message."""
    ended: asyncio.Event | None = None
    """Set once the run ended (created for whoever waits for that)."""
    parent: Context | None = None
    """The trace context of whoever sent it (spec OT2)."""
    headers: dict[str, str] | None = None
    """The `send`'s `request_headers`: held here only, never stored (they may be secrets)."""
    attached: Attached | None = None
    """What the `send` attached: stored with its `user.message`, held here until then (the
    inbox keeps the prompt only, spec D14)."""
    cleared: int | None = None
    """Set for a clear the host made between runs (spec X4): the messages it clears, logged
    with its seed (the prompt) in one append."""
    stored: asyncio.Future[None] | None = None
    """Settled once its message is stored (or could not be)."""
    immediate: bool = False
    """Sent with `mode="immediate"` (spec X6): the run in flight may take it first."""
    output: Output | None = None
    """The typed result the run must end with (OUT1): the send's (its Python type checks
    it), else the one its logged message names (its JSON Schema does)."""
    budget: Budget | None = None
    """What the run may spend (U3): stored with its message, held here until then."""


@dataclass(frozen=True, slots=True)
class Attached:
    """A `send`'s attachments (spec D14)."""

    images: tuple[Image, ...] = ()
    """Shown to the model after the prompt."""
    attachments: tuple[dict[str, Any], ...] = ()
    """As the sender described them, for clients to show."""

    def fields(self) -> dict[str, Any]:
        """What the input's `user.message` holds of them."""
        return {"images": list(self.images) or None, "attachments": list(self.attachments) or None}


@dataclass(slots=True, eq=False)
class Command:
    """A slash command queued behind the session's runs, for a host to run (spec K13)."""

    request_id: str
    command: str
    display_text: str
    answered: asyncio.Future[bool]
    """Set by `Runner.answer`: whether a host ran it."""


Waiting: TypeAlias = tuple[str, str] | Command
"""An item of the queue as its clients see it: an input's `(prompt, message_id)`, or a
command (`Runner.queued`)."""


@dataclass(slots=True, eq=False)
class _Operation:
    """A queued window operation (compact, truncate): it never overlaps a run."""

    apply: Callable[[], Awaitable[Any]]
    waiter: asyncio.Future[Any]


class Runner:
    """The runs of one session; the host the loop runs in (`LoopHost`)."""

    __slots__ = (
        "_current",
        "_dispatching",
        "_handle",
        "_lease_lost",
        "_ledger",
        "_ledger_users",
        "_stop_ledger",
        "_queue",
        "_running",
        "_store_failed",
        "_worker",
        "approve_all",
        "closed",
        "drain_paused",
        "hooks",
        "live",
        "log",
        "permission_handler",
        "provider",
        "session_id",
        "toolbox",
        "tracing",
    )

    def __init__(
        self,
        log: SessionLog,
        *,
        handle: SessionHandle,
        provider: Provider,
        toolbox: Toolbox,
        permission_handler: PermissionHandlerFn | None,
        hooks: Hooks,
        tracing: Tracing,
        lease_lost: Callable[[], Awaitable[None]],
    ) -> None:
        self.session_id = log.session_id
        self.log = log
        self.live = LoopState()
        self.toolbox = toolbox
        self.hooks = hooks
        self.provider = provider
        self.permission_handler = permission_handler
        self.tracing = tracing
        self.approve_all = False
        """Approve every call without asking the handler, or anyone (spec K6)."""
        self.drain_paused = False
        """No waiting input or command starts (spec K19)."""
        self._handle = handle
        """The session, as the tool handlers of its runs get it."""
        self._lease_lost = lease_lost
        """Awaited when a run finds the session's lease gone (another runtime may own it):
        returns once the session follows its log (R1)."""
        self._queue: list[Pending | _Operation | Command] = []
        self._dispatching: Command | None = None
        """The command whose turn came, waiting for a host's answer."""
        self._worker: asyncio.Task[None] | None = None
        self._current: asyncio.Task[RunEnd] | None = None
        self._running: Pending | None = None
        self._store_failed = False
        """The last run failed under a store error here: its end is not in the log yet, and
        its error and idle were delivered then."""
        self._ledger: RunLedger | None = None
        self._ledger_users = 0
        self._stop_ledger: Callable[[], None] | None = None
        self.closed = False

    # --- what the loop sees (LoopHost) ---------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self.log.state

    def context(self) -> RunContext:
        """What a turn (or a window operation) works with, as things stand now."""
        config = self.log.state.config
        toolbox = self.toolbox
        running = self._running
        tools = toolbox.callable(config)
        shown = tuple(toolbox.shown(config, self.live.discovered))
        output = self._output(running)
        if output is not None and not output.spec.native:
            # The run's output tool, for this run only (OUT2).
            tool = output.tool
            tools, shown = {**tools, tool.name: tool}, (*shown, tool.definition)
        return RunContext(
            session=self._handle,
            config=config,
            provider=self.provider,
            limits=limits(config),
            tools=tools,
            deferred=toolbox.deferred(config),
            shown=shown,
            permission_handler=self.permission_handler,
            approve_all=self.approve_all,
            hooks=self.hooks,
            tracing=self.tracing,
            request_headers=running.headers if running is not None else None,
            prompt=(running.prompt or None) if running is not None else None,
            output=output,
        )

    def _output(self, running: Pending | None) -> Output | None:
        """The typed result of the run in progress: the send's, else its logged spec's (a
        run this runtime continues, after a crash or a takeover), checked by its schema."""
        run = self.log.state.run
        if running is None or run is None or run.output is None:
            return None
        given = running.output
        if given is None or (given.spec is not run.output and given.spec != run.output):
            running.output = output_of(run.output)
        return running.output

    async def refresh_tools(self) -> None:
        warnings = await self.toolbox.refresh()
        if warnings:
            await self.log.emit_all(
                [
                    SessionWarningEvent(data=WarningData(warning_type="mcp", message=valid_text(w)))
                    for w in warnings
                ]
            )

    async def steer(self) -> None:
        def take(state: SessionState) -> Sequence[Event]:
            messages, self.live.steering = self.live.steering, ()
            return messages

        # (The lane's messages come first, then the queue's change, in one append.)
        stored = await self.log.emit_all((PendingMessagesModifiedEvent(),), first=take)
        self.tracing.note(stored)

    async def emit_all(self, events: Sequence[Event]) -> list[Event]:
        # One event goes through `emit`, whose path for a streamed delta is the short one.
        if len(events) == 1:
            stored = [await self.log.emit(events[0])]
        else:
            stored = await self.log.emit_all(events)
        self.tracing.note(stored)
        return stored

    # --- inputs --------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._worker is not None

    async def wait_idle(self) -> None:
        while (worker := self._worker) is not None:
            await asyncio.wait([worker])

    def ledger(self) -> RunLedger:
        """The ledger of this session's runs, following every event while someone waits for
        a run's end (an idle session keeps none); `release_ledger` when done with it."""
        self._ledger_users += 1
        if self._ledger is None:
            self._ledger = RunLedger()
            self._stop_ledger = self.log.subscribers.add(self._ledger.observe, None)
        return self._ledger

    def release_ledger(self) -> None:
        self._ledger_users -= 1
        if self._ledger_users == 0 and self._stop_ledger is not None:
            self._stop_ledger()
            self._ledger = self._stop_ledger = None

    async def run_end(self, ledger: RunLedger, message_id: str) -> RunEnd:
        """The end of the run of `message_id`, then `release_ledger`."""
        try:
            return await ledger.wait(message_id)
        finally:
            self.release_ledger()

    async def submit(
        self,
        prompt: str,
        message_id: str,
        headers: dict[str, str] | None = None,
        attached: Attached | None = None,
        *,
        immediate: bool = False,
        output: Output | None = None,
        budget: Budget | None = None,
    ) -> None:
        """Accept an input once it is stored: as the run's `user.message` when idle, else in
        the store's inbox behind the runs queued before it (spec P4). An `immediate` input
        is also offered to the run in flight, whose next model call takes it (X6)."""
        log_ = self.log
        pending = Pending(
            prompt,
            message_id,
            False,
            parent=self.tracing.parent(),
            headers=headers,
            attached=attached,
            immediate=immediate,
            output=output,
            budget=budget,
        )
        async with log_.exclusive():
            if self._worker is None and not self.drain_paused:
                # Idle: the message is stored before this returns, and its run starts.
                await self._store_message(pending, log_.emit_unlocked)
            else:
                # Busy: the input waits in the store, never only in memory (nothing
                # acknowledged may be lost to a crash); its run stores its message.
                await log_.store.enqueue_input(self.session_id, prompt, message_id)
                log_.claimed = (log_.claimed or set()) | {message_id}
                await log_.emit_unlocked((PendingMessagesModifiedEvent(),))
                if immediate and self._in_flight():
                    steer = _message(pending, "immediate")
                    self.live.steering = (*self.live.steering, steer)
            self._queue.append(pending)
            self._start_worker()

    def _in_flight(self) -> bool:
        """A run is in progress that has not ended in the log: it makes another model call
        before it ends only if it is to make one anyway (X6)."""
        current = self._current
        return current is not None and not current.done() and self.log.state.run_id is not None

    def _steered(self, item: Pending) -> bool:
        """The input's message was logged by the run it steered (X6): it has no run of its
        own (an input's message is claimed until it is stored)."""
        return (
            item.immediate and not item.appended and item.message_id not in (self.log.claimed or ())
        )

    async def take_inputs(self) -> None:
        """Queue the stored inputs (sent by other runtimes, or left by a crash, spec R1) that
        are not queued here yet. An input stays pending in the store until its user message
        is stored, so that a crash cannot lose it; until then it must not be queued twice.
        The inbox is read with the writer held: an input whose message is being stored right
        now is either still pending and queued here, or claimed, never both."""
        log_ = self.log
        if self.closed or not log_.writable:
            return
        async with log_.exclusive():
            taken = False
            for prompt, message_id in await log_.store.pending_inputs(self.session_id):
                if message_id not in (log_.claimed or ()):
                    log_.claimed = (log_.claimed or set()) | {message_id}
                    self._queue.append(Pending(prompt, message_id, appended=False))
                    taken = True
            if taken:
                await log_.emit_unlocked((PendingMessagesModifiedEvent(),))
            self._start_worker()

    async def pending(self) -> list[tuple[str, str]]:
        """The `(prompt, message_id)` inputs waiting behind the run in progress, oldest first:
        the store's inbox, less the input whose run is starting (spec K9)."""
        starting = self._running.message_id if self._running is not None else None
        inputs = await self.log.store.pending_inputs(self.session_id)
        return [(prompt, message_id) for prompt, message_id in inputs if message_id != starting]

    def queued(self, inputs: Sequence[tuple[str, str]]) -> list[tuple[str, str] | Command]:
        """What waits behind the run in progress, in order: `inputs` (`pending()`) and the
        commands queued here among them; inputs this runtime has not taken yet come last."""
        waiting = {message_id: prompt for prompt, message_id in inputs}
        items: list[tuple[str, str] | Command] = []
        for item in self._queue:
            if isinstance(item, Command):
                items.append(item)
            elif isinstance(item, Pending) and item.message_id in waiting:
                items.append((waiting.pop(item.message_id), item.message_id))
        items += [(prompt, message_id) for message_id, prompt in waiting.items()]
        return items

    async def remove_queued(self, ids: Collection[str] | None = None) -> list[str]:
        """Remove the waiting inputs and commands named by `ids` (every one when None), spec
        K9; the ids removed, in queue order.

        With the writer held, no input's message can be stored meanwhile: an input is either
        still pending and removed, or its run has begun and it stays (never half of each)."""
        log_ = self.log
        if not log_.writable:
            raise TrimtabError(f"session {self.session_id} is run by another runtime (remote)")
        async with log_.exclusive():
            items = self.queued(await self.pending())
            chosen = [i for i in items if ids is None or _id(i) in ids]
            inputs = [_id(i) for i in chosen if not isinstance(i, Command)]
            removed = await log_.store.discard_inputs(self.session_id, inputs) if inputs else []
            gone = set(removed) | {i.request_id for i in chosen if isinstance(i, Command)}
            if not gone:
                return []
            for item in self._queue:
                if isinstance(item, Pending) and item.message_id in gone and item.ended:
                    item.ended.set()  # an abort waiting for it to end
            self._queue = [item for item in self._queue if _queue_id(item) not in gone]
            steering = self.live.steering
            self.live.steering = tuple(m for m in steering if m.data.message_id not in gone)
            log_.claimed = (log_.claimed or set()) - gone or None
            data = PendingMessagesModifiedData(removed=removed or None)
            await log_.emit_unlocked((PendingMessagesModifiedEvent(data=data),))
        return [_id(i) for i in items if _id(i) in gone]

    async def enqueue_command(self, command: str, display_text: str, request_id: str) -> None:
        """Queue a command behind the inputs and commands queued before it (spec K13)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        async with self.log.exclusive():
            self._queue.append(Command(request_id, command, display_text, future))
            await self.log.emit_unlocked((PendingMessagesModifiedEvent(),))
        self._start_worker()

    async def edit_queue(
        self,
        change: Callable[[list[Waiting]], tuple[list[Waiting], T]],
        added: Sequence[Pending] = (),
        after: Callable[[], None] | None = None,
    ) -> T:
        """Edit the waiting items in place (spec K18): `change` gives them in their new order
        (with `added`'s inputs among them, which it may fill) from the queue as it is, and
        what to answer; `after`, once the store took the edit, changes the inputs here with
        it (the writer still held).

        The store's inbox takes the edit in one atomic step, with the writer held (no input's
        run can begin meanwhile), and only from the inputs it read: when another runtime
        queued one in between, the edit is made again from the queue as it is then."""
        self._local()
        log_ = self.log
        async with log_.exclusive():
            for _ in range(EDIT_TRIES):
                stored = await log_.store.pending_inputs(self.session_id)
                starting = self._running.message_id if self._running is not None else None
                items = self.queued([i for i in stored if i[1] != starting])
                edited, answer = change(items)
                if edited == items:
                    return answer
                inputs = [i for i in stored if i[1] == starting]
                inputs += [i for i in edited if not isinstance(i, Command)]
                if await log_.store.rewrite_inputs(self.session_id, [m for _, m in stored], inputs):
                    break
            else:
                raise TrimtabError(f"the queue of session {self.session_id} kept changing")
            self._requeue(edited, {pending.message_id: pending for pending in added})
            if after is not None:
                after()
            self._relane()
            await log_.emit_unlocked((PendingMessagesModifiedEvent(),))
        self._start_worker()
        return answer

    async def move(self, item_id: str, position: int) -> bool:
        """Move a waiting item to `position` of the queue (K18); whether its place changed."""

        def move(items: list[Waiting]) -> tuple[list[Waiting], bool]:
            at = _find(items, item_id)
            rest = items[:at] + items[at + 1 :]
            to = min(max(position, 0), len(rest))
            edited = [*rest[:to], items[at], *rest[to:]]
            return edited, edited != items

        return await self.edit_queue(move)

    async def insert(self, position: int, pending: Pending) -> None:
        """Queue a new input at `position` (K18): run at once when the session is idle."""
        self._local()
        if self._worker is None and not self.drain_paused:
            await self.submit(pending.prompt, pending.message_id, pending.headers, pending.attached)
            return
        new = (pending.prompt, pending.message_id)

        def insert(items: list[Waiting]) -> tuple[list[Waiting], None]:
            at = min(max(position, 0), len(items))
            return [*items[:at], new, *items[at:]], None

        await self.edit_queue(insert, (pending,))

    async def reword(self, message_id: str, prompt: str) -> bool:
        """Give a waiting input a new prompt (K18); whether its prompt changed."""

        def reword(items: list[Waiting]) -> tuple[list[Waiting], bool]:
            at = _find(items, message_id)
            if isinstance(items[at], Command):
                raise QueueEditError("not_a_message", f"{message_id} is a queued command")
            edited = [*items[:at], (prompt, message_id), *items[at + 1 :]]
            return edited, edited != items

        return await self.edit_queue(reword)

    async def duplicate(self, item_id: str, copy_id: str) -> None:
        """Queue a copy of a waiting item right after it, as `copy_id` (K18)."""
        copies: list[Pending] = []

        def duplicate(items: list[Waiting]) -> tuple[list[Waiting], None]:
            at = _find(items, item_id)
            item = items[at]
            copy: Waiting
            if isinstance(item, Command):
                future = asyncio.get_running_loop().create_future()
                copy = Command(copy_id, item.command, item.display_text, future)
            else:
                copy = (item[0], copy_id)
                copies[:] = [self._copy(item, copy_id)]
            return [*items[: at + 1], copy, *items[at + 1 :]], None

        await self.edit_queue(duplicate, copies)

    async def send_now(self, item_id: str) -> bool:
        """Move the waiting message `item_id` into the steering lane of the run in flight
        (spec K20); False, and nothing changed, when no run is in flight."""
        self._local()
        log_ = self.log
        async with log_.exclusive():
            items = self.queued(await self.pending())
            item = items[_find(items, item_id)]
            if isinstance(item, Command):
                raise QueueEditError("not_a_message", f"{item_id} is a queued command")
            if not self._in_flight():
                return False
            if any(m.data.message_id == item_id for m in self.live.steering):
                return True
            pending = self._pending(item)
            if pending.output is not None or pending.budget is not None:
                raise QueueEditError(
                    "not_steerable",
                    f"{item_id} asks for a typed result or a budget of its own: it runs alone",
                )
            pending.immediate = True
            self.live.steering = (*self.live.steering, _message(pending, "immediate"))
            await log_.emit_unlocked((PendingMessagesModifiedEvent(),))
        return True

    async def append_steering(
        self,
        message_id: str,
        expected: str,
        prompt: str,
        attached: Attached | None,
        max_images: int,
    ) -> bool:
        """Append `prompt` (after a blank line) and what it attaches to the steering message
        `message_id` (spec K21) while the run has not taken it and its prompt is `expected`;
        whether it did. Its images may not come to more than `max_images`."""
        joined: list[Attached | None] = []

        def append(items: list[Waiting]) -> tuple[list[Waiting], bool]:
            lane = {m.data.message_id for m in self.live.steering}
            at = next((i for i, item in enumerate(items) if _id(item) == message_id), None)
            if at is None or message_id not in lane or items[at] != (expected, message_id):
                return items, False
            held = self._held(message_id)
            both = _joined(held.attached if held is not None else None, attached)
            if both is not None and len(both.images) > max_images:
                raise ValueError(f"a message takes at most {max_images} images")
            joined[:] = [both]
            return [*items[:at], (f"{expected}\n\n{prompt}", message_id), *items[at + 1 :]], True

        def attach() -> None:
            if (held := self._held(message_id)) is not None:
                held.attached = joined[0]

        return await self.edit_queue(append, after=attach)

    def _held(self, message_id: str) -> Pending | None:
        """The input `message_id` as queued here."""
        return next(
            (i for i in self._queue if isinstance(i, Pending) and i.message_id == message_id),
            None,
        )

    def _pending(self, item: tuple[str, str]) -> Pending:
        """The input of the waiting `item` as queued here; one another runtime queued is
        taken here now (the writer held: it is claimed before its run can begin)."""
        if (queued := self._held(item[1])) is not None:
            return queued
        pending = Pending(item[0], item[1], appended=False)
        self.log.claimed = (self.log.claimed or set()) | {item[1]}
        self._queue.append(pending)
        return pending

    def _relane(self) -> None:
        """Make the steering lane's messages again from their inputs as edited (spec K21):
        the run logs what the queue holds."""
        held = {i.message_id: i for i in self._queue if isinstance(i, Pending)}
        self.live.steering = tuple(
            _message(held[m.data.message_id], "immediate") if m.data.message_id in held else m
            for m in self.live.steering
        )

    def _copy(self, item: tuple[str, str], copy_id: str) -> Pending:
        """A new input of the waiting input `item` as it was sent here (what it attached, its
        typed result, its budget, its headers); its prompt only when another runtime queued
        it (the inbox keeps no more)."""
        for queued in self._queue:
            if isinstance(queued, Pending) and queued.message_id == item[1]:
                return replace(
                    queued, prompt=item[0], message_id=copy_id, aborted=False, ended=None
                )
        return Pending(item[0], copy_id, appended=False)

    def _requeue(self, edited: list[Waiting], new: dict[str, Pending]) -> None:
        """Put the queue here in the order of `edited` (the writer held): each waiting item
        in the place of one that waited, those added after; a window operation, or the run a
        crash interrupted, keeps its place."""
        held = {_queue_id(item): item for item in self._queue}
        order: list[Pending | Command] = []
        for item in edited:
            if isinstance(item, Command):
                order.append(item)
                continue
            prompt, message_id = item
            pending = held.get(message_id) or new.get(message_id)
            if not isinstance(pending, Pending):  # queued by another runtime: taken here now
                pending = Pending(prompt, message_id, appended=False)
            pending.prompt = prompt
            order.append(pending)
        self.log.claimed = (self.log.claimed or set()) | {
            i.message_id for i in order if isinstance(i, Pending)
        }
        rest = iter(order)  # an edit removes nothing: as many items as places, or more
        queue = [next(rest) if _waits(item) else item for item in self._queue]
        self._queue = [*queue, *rest]

    def _local(self) -> None:
        """Refuse an edit of a remote session's queue: its owner runs it (K18)."""
        if not self.log.writable:
            raise QueueEditError(
                "remote_session", f"session {self.session_id} is run by another runtime"
            )

    async def set_drain_paused(self, paused: bool) -> None:
        """Pause or resume the start of waiting inputs and commands (spec K19)."""
        self._local()
        if paused and self.drain_paused:
            raise QueueEditError("queue_already_paused", "the queue is paused already")
        self.drain_paused = paused
        self._start_worker()

    def answer(self, request_id: str, handled: bool) -> bool:
        """A host's answer to the command whose turn came; False for any other id."""
        command = self._dispatching
        if command is None or command.request_id != request_id or command.answered.done():
            return False
        command.answered.set_result(handled)
        return True

    async def _dispatch(self, command: Command) -> None:
        """Ask the hosts to run `command` (`command.queued`), and wait a bounded time for one
        to answer before the queue goes on."""
        self._dispatching = command
        request_id = command.request_id
        try:
            queued = CommandQueuedData(request_id=request_id, command=command.command)
            await self.log.emit(CommandQueuedEvent(data=queued))
            await asyncio.wait_for(asyncio.shield(command.answered), COMMAND_TIMEOUT)
        except TimeoutError:
            log.warning("session %s: no host answered command %s", self.session_id, request_id)
        except Exception:
            log.exception("session %s: command %s failed", self.session_id, request_id)
        finally:
            self._dispatching = None
        try:
            done = CommandCompletedData(request_id=request_id)
            await self.log.emit(CommandCompletedEvent(data=done))
        except Exception:
            log.exception("session %s: command %s failed", self.session_id, request_id)

    def clear(self, prompt: str, messages_cleared: int) -> ClearContextResult:
        """Commit a clear of the host's between runs (spec X4): `session.context_cleared` and
        its seed's `user.message` in one append, then the seeded run, as a `send`'s. Refused
        (`run_in_flight`) while a run or window operation is in progress or queued."""
        if self._worker is not None:
            raise ClearContextError(
                "run_in_flight",
                "a run or window operation is in progress or queued: clear from a tool handler"
                " of the run, or once the session is idle",
            )
        stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stored.add_done_callback(_retrieve)  # (the host need not await it)
        pending = Pending(prompt, new_id(), False, parent=self.tracing.parent(), stored=stored)
        pending.cleared = messages_cleared
        self._queue.append(pending)
        self._start_worker()
        return ClearContextResult.committing(messages_cleared, pending.message_id, stored)

    def go_on(self, interrupted: _loop.Interrupted, message_id: str) -> None:
        """Queue the continuation of a run a crash interrupted (spec P3, C10)."""
        self._queue.append(Pending("", message_id, appended=True, interrupted=interrupted))
        self._start_worker()

    async def exclusive(self, apply: Callable[[], Awaitable[T]]) -> T:
        """Run a window operation between runs, never during one (queued behind them)."""
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Operation(apply, waiter))
        self._start_worker()
        result: T = await waiter
        return result

    # --- runs ----------------------------------------------------------------------------

    def _next(self) -> Pending | _Operation | Command | None:
        """The queued item to make next: the first, or while the queue is paused (K19) the
        first window operation or run the log holds already (a crash interrupted it)."""
        if not self.drain_paused:
            return self._queue[0] if self._queue else None
        return next((i for i in self._queue if not _waits(i)), None)

    def _start_worker(self) -> None:
        if self._worker is None and self._next() is not None:
            self._worker = asyncio.get_running_loop().create_task(
                self._drain(), name=f"trimtab-{self.session_id}"
            )

    async def _drain(self) -> None:
        """Run queued items one after another; each run ends in one idle (spec E1)."""
        try:
            while (item := self._next()) is not None:
                if not self.log.writable:
                    self.drop(LeaseLostError(f"session {self.session_id} moved"))
                    return
                self._queue.remove(item)
                if isinstance(item, _Operation):
                    await _settle(item)
                    continue
                if isinstance(item, Command):
                    await self._dispatch(item)
                    continue
                if self._steered(item):
                    if item.ended is not None:
                        item.ended.set()
                    continue
                try:
                    await self._run(item)
                finally:
                    if item.ended is not None:
                        item.ended.set()
        finally:
            self._worker = None

    async def _run(self, item: Pending) -> None:
        self._running = item
        try:
            if not item.appended:
                # From the run's waiter, where no abort cancels: the message is logged
                # (claiming it in the inbox) before its run can be stopped.
                await self._store_message(item, self.log.emit_all, queued=item.cleared is None)
        except Exception as exc:
            self._running = None
            if item.stored is not None and not item.stored.done():
                item.stored.set_exception(exc)
            await self._failed(exc, item.message_id)
            return
        if item.stored is not None and not item.stored.done():
            item.stored.set_result(None)
        self._current = asyncio.get_running_loop().create_task(self._body(item))
        # When this waiter is cancelled (close), the run's task may still fail on its own:
        # its failure was already reported by the loop, so it is read here, not left to warn.
        self._current.add_done_callback(_retrieve)
        try:
            end = await asyncio.shield(self._current)
        except asyncio.CancelledError:
            end = RunEnd(item.message_id, aborted=True)  # aborted again while it stopped
        except Exception as exc:
            # The store failed or the lease was lost: nothing more can be logged, but no
            # waiter may hang, here or in a host following the session.
            await self._failed(exc, item.message_id, logged=True)
            return
        finally:
            self._current = self._running = None
            self.live.steering = ()  # not taken by the run: each runs as queued (X6)
        # The run's one idle (E1), from here: an abort cancels the run's task, not this one.
        await self.log.emit(SessionIdleEvent(data=SessionIdleData(aborted=end.aborted or None)))

    async def _store_message(
        self,
        item: Pending,
        emit: Callable[..., Awaitable[list[Event]]],
        *,
        queued: bool = False,
    ) -> None:
        """Store the input's `user.message` with `emit` (`_store_message_once`). Refused
        because the database lost the log's last appends in a crash, it is stored once more,
        after what the log kept, which the session has read again meanwhile (spec P6)."""
        try:
            await self._store_message_once(item, emit, queued=queued)
        except LogTailLostError:
            await self._store_message_once(item, emit, queued=queued)
        item.appended, item.attached = True, None

    async def _store_message_once(
        self, item: Pending, emit: Callable[..., Awaitable[list[Event]]], *, queued: bool
    ) -> None:
        """Store the input's message, and its run's first turn start in the same append when
        nothing comes between them (E7): the end of a run the log holds open goes first, in
        an append of its own; the end of one the store failed under, in the same. A queued
        input's message also tells watchers the queue changed (an ephemeral event, last:
        stores that do not carry one in their append store what comes before it in one)."""
        message = _message(item)
        if self._interrupted():
            await emit((), first=self._end_of_interrupted_run)
        events: tuple[Event, ...]
        start = None
        if item.cleared is not None:
            # A clear and its seed (X4): never one without the other (C6, C10).
            seed = _loop.user_message(item.prompt, item.message_id, "context_cleared")
            events = (_loop.cleared(item.prompt, item.cleared), seed)
        else:
            start = self._turn_start(message)
            events = (message,) if start is None else (message, start)
        if queued:
            events += (PendingMessagesModifiedEvent(),)
        await emit(events, first=self._first())
        item.turn = start.data.turn_id if start else None
        self._store_failed = False

    async def _body(self, item: Pending) -> RunEnd:
        """The run's task: it reads `item.aborted` only once it has started."""
        item.started = True
        return await _loop.run(
            self,
            item.message_id,
            interrupted=item.interrupted,
            aborted=item.aborted,
            started=item.turn,
            parent=item.parent,
        )

    def _first(self) -> Settle | None:
        """What a new input stores with its message: the end of the run the store failed
        under here (its error and idle were delivered then), in the same append."""
        return _loop.end_of_failed_run if self._store_failed else None

    def _turn_start(self, message: UserMessageEvent) -> AssistantTurnStartEvent | None:
        """The first `assistant.turn_start` of the run of `message`, to be stored with it in
        one append, when nothing would come between them: no run's end to log first, no tool
        source to refresh, no window to fit (spec P5: one statement less per run)."""
        if self._store_failed or self._interrupted() or not self.toolbox.settled:
            return None
        data = message.data
        images = tuple(data.images) if data.images else ()
        more = estimate_tokens((Message(role="user", content=data.content, images=images),))
        if needs_fitting(self.context(), self.log.state, more):
            return None
        return _loop.turn_start(str(self.log.state.turns), self.log.state.config.model)

    def _end_of_interrupted_run(self, state: SessionState) -> list[Event]:
        """`_loop.end_of_interrupted_run`, without the idle of a run whose idle was delivered
        here already (its end was in a tail the database lost, P6: E1)."""
        events = _loop.end_of_interrupted_run(state)
        if events and state.run_id == self.log.idle_given:
            self.log.idle_given = None
            return events[:-1]
        return events

    def _interrupted(self) -> bool:
        """The log holds a run nothing here runs (a crash interrupted it, and the session was
        resumed without continuing it, P3; or the database lost its end, P6): a new input ends
        it first, with its idle unless delivered already, in an append of their own (the idle
        comes right after the run's end there, for whoever follows the log: after a batch's
        stored events, it would come late)."""
        return not self._store_failed and self.log.state.run_id is not None

    async def _failed(self, exc: Exception, message_id: str, *, logged: bool = False) -> None:
        """A run that could not go on (`logged`: its `user.message` is in the log).

        A lost lease is followed before the run's end is told: a host that answers it with
        a `send` (which the new owner runs) sees that run whole (R1)."""
        self._store_failed = True
        cause = _cause(exc)
        # (A log that lost its tail is still this runtime's to write: the run ends as under a
        # failed store, and the session goes on from the log, P6.)
        lost = isinstance(cause, LeaseLostError) and not isinstance(cause, LogTailLostError)
        if lost:
            await self._lease_lost()
        log.error("run of session %s failed", self.session_id, exc_info=exc)
        if self._ledger is not None:
            self._ledger.fail(message_id, cause)
        # Delivered, not stored (the store is what failed): the run still ends in a typed
        # error and one idle for whoever watches (spec E1).
        data = SessionErrorData(
            error_type="lease_lost" if lost else "store",
            message=valid_text(f"{type(cause).__name__}: {cause}"),
            retryable=True,
            originating_message_id=message_id,
        )
        if lost and logged:
            # The run is in the log, which its new owner ends as this runtime follows it (E5):
            # its one idle is this one, or, once that end came already, the one it brought.
            if (run := self.log.state.run_id) is None:
                return
            self.log.idle_given = run
        self.log.subscribers.deliver(SessionErrorEvent(data=data, ephemeral=True))
        self.log.subscribers.deliver(SessionIdleEvent())

    # --- stopping ------------------------------------------------------------------------

    async def abort(self) -> None:
        """Stop the run in progress, or the one about to start (right after `send`); return
        once it ended. Runs queued behind it still run."""
        target = self._running
        if target is None and self._worker is not None:
            target = next((item for item in self._queue if isinstance(item, Pending)), None)
        if target is None:
            return
        current = self._current
        if target.started and current is not None and not current.done():
            current.cancel()
        else:
            target.aborted = True  # it ends as an abort as soon as it starts
        target.ended = target.ended or asyncio.Event()
        await target.ended.wait()

    def drop(self, reason: Exception) -> None:
        """Let go of the queued items: their stored inputs wait for the session's next
        owner, and whoever waits for them gets `reason`."""
        for item in self._queue:
            if isinstance(item, _Operation):
                if not item.waiter.done():
                    item.waiter.set_exception(reason)
                continue
            if isinstance(item, Command):
                continue  # a host's request, not an acknowledged input: gone with the session
            if self._ledger is not None:
                self._ledger.fail(item.message_id, reason)
            if item.ended is not None:
                item.ended.set()
        self._queue.clear()
        self.log.claimed = None

    async def close(self, reason: Exception) -> None:
        """Stop: the run in progress (and one about to start) ends as an abort, the rest of
        the queue is dropped; returns once nothing runs."""
        self.closed = True
        if self._dispatching is not None:
            self.answer(self._dispatching.request_id, False)  # no host will answer now
        kept: list[Pending | _Operation | Command] = []
        dropped: list[Pending | _Operation | Command] = []
        for item in self._queue:
            if isinstance(item, Pending) and item.appended and item.interrupted is None:
                item.aborted = True  # its message is logged: the run ends, as an abort
                kept.append(item)
            else:
                dropped.append(item)
        self._queue = dropped
        self.drop(reason)
        self._queue = kept
        await self.abort()
        if self._worker is not None:
            await asyncio.wait([self._worker])
        if self._ledger is not None:
            self._ledger.close(reason)


async def _settle(operation: _Operation) -> None:
    try:
        result = await operation.apply()
    except Exception as exc:
        if not operation.waiter.done():
            operation.waiter.set_exception(exc)
        return
    if not operation.waiter.done():
        operation.waiter.set_result(result)


def _cause(exc: BaseException) -> Exception:
    """The exception that ended a run: the first one inside an `ExceptionGroup` (a batch's
    calls fail together when the store fails)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


def limits(config: SessionConfigData) -> ModelLimits:
    """The model's context window and output limit (the session's override, else the table)."""
    model = config.model
    if model is None and (config.provider or {}).get("type") == "local":
        model = "smollm2"  # the embedded default model, whose window is small
    return limits_for(model, config.model_limits)


def _find(items: list[Waiting], item_id: str) -> int:
    """The place of the waiting item `item_id`; `QueueEditError` when none waits."""
    for at, item in enumerate(items):
        if _id(item) == item_id:
            return at
    raise QueueEditError(
        "item_not_waiting", f"no item {item_id!r} waits in the queue (its run may have begun)"
    )


def _waits(item: Pending | _Operation | Command) -> bool:
    """Whether `item` is one of the queue's waiting items (a command, or an input whose run
    has not begun), which an edit moves and a pause holds back (K18, K19)."""
    return isinstance(item, Command) or (isinstance(item, Pending) and not item.appended)


def _id(item: tuple[str, str] | Command) -> str:
    """A waiting item's id: an input's message id, a command's request id."""
    return item.request_id if isinstance(item, Command) else item[1]


def _queue_id(item: Pending | _Operation | Command) -> str | None:
    match item:
        case Command():
            return item.request_id
        case Pending():
            return item.message_id
        case _:
            return None


def _joined(first: Attached | None, then: Attached | None) -> Attached | None:
    """What a message attaches once `then` is appended to it (spec K21)."""
    if first is None or then is None:
        return first or then
    return Attached(first.images + then.images, first.attachments + then.attachments)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _message(item: Pending, source: str = "user") -> UserMessageEvent:
    """An input's `user.message`, with what it attached, its typed result and its budget."""
    if item.attached is None and item.output is None and item.budget is None:
        return _loop.user_message(item.prompt, item.message_id, source)
    data = UserMessageData(
        content=item.prompt,
        message_id=item.message_id,
        source=source,
        output=item.output.spec if item.output is not None else None,
        budget=item.budget,
        **(item.attached.fields() if item.attached is not None else {}),
    )
    return UserMessageEvent(data=data)
