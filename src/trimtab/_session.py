"""`Session`: the public face of one agent session.

It is a facade over the session's parts, each with one job: `SessionLog` writes (or follows)
the log and keeps what the session knows from it; `Runner` runs its inputs one after another
and hosts the loop; `Ownership` holds or follows its lease and finishes what a crash left;
`History` moves its window.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Unpack, cast, get_args, overload

import pydantic_core
from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import TypedDict

from trimtab import _loop
from trimtab._answerer import Answerer
from trimtab._budget import exhausted
from trimtab._durations import check_seconds
from trimtab._errors import (
    BudgetExceededError,
    PromptBlockedError,
    SessionNotFoundError,
    StoreUnavailableError,
    TrimtabError,
    session_error,
)
from trimtab._history import History
from trimtab._hooks import Hooks
from trimtab._log import SessionLog
from trimtab._metrics import SessionMetrics, metrics_of
from trimtab._options import SessionOptions
from trimtab._output import DEFAULT_MAX_INVALID, Output, checked_schema, typed_output, value_of
from trimtab._ownership import Ownership
from trimtab._permissions import PermissionHandlerFn
from trimtab._runner import Attached, Command, Pending, Runner
from trimtab._runs import RunEnd, results_of
from trimtab._subscribers import EventHandler
from trimtab._toolbox import Toolbox
from trimtab._tools import Tool, valid_text
from trimtab._tracing import OFF, Tracing
from trimtab._window import ContextWindow, context_window
from trimtab._workspace import Workspace
from trimtab.events import (
    AssistantMessageEvent,
    Budget,
    Event,
    EventType,
    Image,
    InfoData,
    ModeChangedData,
    ModelChangeData,
    OutputResult,
    PermissionsChangedData,
    SessionConfigData,
    SessionErrorData,
    SessionErrorEvent,
    SessionInfoEvent,
    SessionLimits,
    SessionLimitsChangedData,
    SessionLimitsChangedEvent,
    SessionMode,
    SessionModeChangedEvent,
    SessionModelChangeEvent,
    SessionPermissionsChangedEvent,
    SessionShutdownEvent,
    SessionTitleChangedEvent,
    SessionWarningEvent,
    ShutdownData,
    Spending,
    TitleChangedData,
    UserMessageData,
    WarningData,
    new_id,
    now,
)
from trimtab.providers import Message, Provider, Usage
from trimtab.providers._headers import FRAMING, checked_headers

if TYPE_CHECKING:
    from trimtab._engine import Engine
    from trimtab._history import SessionOwner
    from trimtab.store import Lease

__all__ = [
    "LogLevel",
    "QueuedCommand",
    "QueuedMessage",
    "SendMode",
    "Session",
    "answer_waiting",
    "ownership_of",
]

LogLevel = Literal["info", "warning", "error"]

SendMode = Literal["enqueue", "immediate"]
"""How a `send` meets a run in progress: queued behind it, or taken by it (spec X6)."""
_T = TypeVar("_T")

_log = logging.getLogger("trimtab")


class QueuedMessage(BaseModel):
    """A message waiting in the session's queue (`Session.pending_messages`)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    message_id: str
    prompt: str
    immediate: bool = False
    """Sent with `mode="immediate"`: the run in progress takes it at its next model call
    (spec X6)."""


class QueuedCommand(BaseModel):
    """A slash command waiting in the session's queue (`Session.pending_items`, spec K13)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    request_id: str
    command: str
    display_text: str


MAX_COMMAND_LENGTH = 10_000
"""Characters of a queued slash command."""

MAX_NAME_LENGTH = 100
"""Characters a session's name may have (as the Copilot clients allow)."""


class _Rpc:
    __slots__ = ("history",)

    def __init__(self, history: History[Session]) -> None:
        self.history = history


class Session:
    """A live agent session: send messages, watch events, manage the context window.

    Create one with `Client.create_session` or `Client.resume_session`.
    """

    __slots__ = (
        "_answerer",
        "_closing",
        "_engine",
        "_hooks",
        "_log",
        "_owner",
        "_ownership",
        "_runner",
        "_shutting",
        "history",
        "session_id",
    )

    def __init__(
        self,
        log: SessionLog,
        *,
        provider: Provider,
        toolbox: Toolbox,
        permission_handler: PermissionHandlerFn | None,
        hooks: Hooks,
        owner: SessionOwner[Session] | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.session_id = log.session_id
        self._log = log
        self._hooks = hooks
        self._engine = engine
        """The engine that runs this session (spec EN1), if not this runtime or another
        holding its lease."""
        self._answerer: Answerer | None = None
        self._runner = Runner(
            log,
            handle=self,
            provider=provider,
            toolbox=toolbox,
            permission_handler=permission_handler,
            hooks=hooks,
            tracing=owner.tracing if owner is not None else OFF,
            lease_lost=self._lease_lost,
        )
        self._ownership = Ownership(log, self._runner)
        """Who runs the session: what the runtime that opened it (`Client`) drives, through
        `ownership_of`."""
        self.history: History[Session] = History(self, self._runner, owner)
        self._owner = owner
        if engine is not None:
            runner = self._runner
            self._answerer = Answerer(
                self,
                engine,
                tools=lambda: runner.toolbox.callable(self.config),
                permission_handler=lambda: runner.permission_handler,
            )
            log.subscribers.add(self._answerer.observe, None)
        self._closing: asyncio.Task[None] | None = None
        self._shutting: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"Session({self.session_id!r}, remote={self.is_remote})"

    async def _lease_lost(self) -> None:
        await self._ownership.lost()

    # --- what the session is -------------------------------------------------------------

    @property
    def rpc(self) -> _Rpc:
        """`session.rpc.history.*`: the Copilot SDK's spelling of `session.history.*`."""
        return _Rpc(self.history)  # made on use: an idle session holds none

    def options(self) -> SessionOptions:
        """What the host gave this session that its log does not keep (provider, tools,
        handlers, hooks, MCP servers): what a fork of it is given again."""
        runner = self._runner
        # Not validated again: each part was, when the session was opened.
        return SessionOptions.model_construct(
            provider=runner.provider,
            tools=list(runner.toolbox.own.values()),
            on_permission_request=runner.permission_handler,
            hooks=self._hooks.handlers,
            mcp_servers=cast("dict[str, dict[str, Any]] | None", runner.toolbox.source_options),
        )

    @property
    def config(self) -> SessionConfigData:
        """The configuration, as the log last recorded it."""
        return self._log.state.config

    @property
    def tools(self) -> Mapping[str, Tool]:
        """Every tool the model may call, the built-in `tool_search` included."""
        return self._runner.toolbox.callable(self.config)

    @property
    def deferred_tools(self) -> frozenset[str]:
        """The tools left out of the model's list until `tool_search` finds them (§6)."""
        return self._runner.toolbox.deferred(self.config)

    @property
    def workspace(self) -> Workspace:
        """The session's plan and files, kept in its log (spec K16)."""
        return Workspace(self._log, self._writable)  # made on use: an idle session holds none

    def offer_tools(self, tools: Sequence[Tool]) -> None:
        """Offer the model `tools` too while the session is open, in place of those offered
        before, from its next turn on: the tools of another host that joined the open
        session (spec D5). They are not logged, nor given to a fork; the session's own tools
        win a name clash."""
        self._runner.toolbox.offer({tool.name: tool for tool in tools})

    @property
    def usage(self) -> Usage:
        """Tokens used by every model call of the session, clears and compactions included."""
        return self._log.state.usage

    @property
    def name(self) -> str | None:
        """The session's friendly name (`set_name`), None until one is set."""
        return self._log.state.name

    @property
    def named_automatically(self) -> bool:
        """Whether the name came from a summary (`set_auto_name`), not from `set_name`."""
        return self._log.state.name_auto

    @property
    def is_remote(self) -> bool:
        """Another runtime holds this session's lease: it may be read, not driven (spec R1)."""
        return not self._log.writable

    @property
    def tracing(self) -> Tracing:
        """How this session traces: its client's setting (spec OT1)."""
        return self._runner.tracing

    @property
    def context_epoch(self) -> int:
        """How many clears this session has committed."""
        return self._log.state.epoch

    def window(self) -> list[Message]:
        """The messages the model will see on its next call."""
        return self._log.state.window()

    def get_context(self) -> ContextWindow:
        """What the model will see next, with token counts, so a host can inspect its budget."""
        ctx = self._runner.context()
        ratio = self._log.state.token_ratio(ctx.usage_model)
        return context_window(self.window(), list(ctx.shown), ctx.limits.context_window, ratio)

    async def get_events(self, *, after: int = 0) -> list[Event]:
        """The persisted log, oldest first; with `after`, the events past its first `after`."""
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError(f"after must be a count of events (an int >= 0), got {after!r}")
        return await self._log.store.read(self.session_id, after=after)

    async def metrics(self) -> SessionMetrics:
        """What the session spent so far, by model, as its log records it (spec K5)."""
        return metrics_of(await self.get_events())

    # --- changing it ---------------------------------------------------------------------

    async def switch_model(self, model: str, reasoning_effort: str | None = None) -> None:
        """Use `model` for the session's next model calls (spec K1), with `reasoning_effort`
        if given (else the effort set before is kept). Logged as `session.model_change`, so
        a resumed session keeps the model; a run in progress switches at its next turn."""
        model = _text("model", model).strip()
        if reasoning_effort:  # (None or "": the effort set before is kept)
            reasoning_effort = _text("reasoning_effort", reasoning_effort).strip()
        await self._change_model(model, reasoning_effort or self.config.reasoning_effort)

    async def set_reasoning_effort(self, reasoning_effort: str) -> None:
        """Ask the current model for `reasoning_effort` from its next call on (spec K1)."""
        effort = _text("reasoning_effort", reasoning_effort).strip()
        await self._change_model(self.config.model or "default", effort)

    async def _change_model(self, model: str, effort: str | None) -> None:
        config = self.config
        data = ModelChangeData(
            new_model=model,
            previous_model=config.model,
            reasoning_effort=effort,
            previous_reasoning_effort=config.reasoning_effort,
        )
        await self._writable().emit(SessionModelChangeEvent(data=data))

    @property
    def mode(self) -> SessionMode:
        """The agent's mode as the host last set it (`set_mode`); `interactive` at first."""
        return self._log.state.mode

    async def set_mode(self, mode: SessionMode) -> None:
        """Record the agent's mode (spec K7), logged as `session.mode_changed` when it changes.
        trimtab runs the same in every mode: the mode is for the host and its clients."""
        if mode not in get_args(SessionMode):
            raise ValueError(f"mode must be interactive, plan or autopilot, not {mode!r}")
        previous = self.mode
        if mode != previous:
            data = ModeChangedData(new_mode=mode, previous_mode=previous)
            await self._writable().emit(SessionModeChangedEvent(data=data))

    @property
    def approve_all(self) -> bool:
        """Whether every tool call is approved without a permission request, so that no
        handler is asked (spec K6). A setting of this open session, not of its log: a resume
        starts without it."""
        return self._runner.approve_all

    @approve_all.setter
    def approve_all(self, enabled: bool) -> None:
        runner = self._runner
        before, runner.approve_all = runner.approve_all, bool(enabled)
        if runner.approve_all != before:
            # Delivered here only: the setting is this open session's, not its log's (K6).
            modes = ("allow-all", "manual") if runner.approve_all else ("manual", "allow-all")
            data = PermissionsChangedData(mode=modes[0], previous_mode=modes[1])
            self._log.subscribers.deliver(SessionPermissionsChangedEvent(data=data))

    async def set_name(self, name: str) -> None:
        """Name the session (trimmed, 1 to 100 characters); logged as `session.title_changed`
        each time, even when the name is unchanged (spec K2)."""
        title = name.strip() if isinstance(name, str) else ""
        if not title:
            raise ValueError("the session name must not be empty or only whitespace")
        if len(title) > MAX_NAME_LENGTH:
            raise ValueError(f"the session name is longer than {MAX_NAME_LENGTH} characters")
        if valid_text(title) != title:
            raise ValueError("the session name is not valid Unicode text (a lone surrogate)")
        await self._writable().emit(SessionTitleChangedEvent(data=TitleChangedData(title=title)))

    async def set_auto_name(self, summary: str) -> bool:
        """Name the session from a summary of it, unless the user named it (spec K12): the
        summary trimmed, its first line, cut at 100 characters. Returns whether it was
        applied (not when blank, nor over a name `set_name` gave)."""
        if not isinstance(summary, str):
            raise ValueError(f"summary must be a string, got {type(summary).__name__}")
        title = valid_text(summary.strip()).split("\n", 1)[0].strip()[:MAX_NAME_LENGTH].strip()
        if not title:
            return False
        log = self._writable()
        async with log.exclusive():
            state = log.state
            if state.name is not None and not state.name_auto:
                return False
            data = TitleChangedData(title=title, auto=True)
            await log.emit_unlocked((SessionTitleChangedEvent(data=data),))
        return True

    @property
    def budget(self) -> Budget | None:
        """What the whole session may spend (spec U3), as its log last set it."""
        return self.config.budget

    async def set_budget(self, budget: Budget | Mapping[str, Any] | None) -> None:
        """Set what the whole session may spend (None: no limit), logged as
        `session.session_limits_changed` so that a resume, or another runtime, keeps it
        (U5). A session whose budget is spent takes a `send` again once it is raised."""
        checked = _budget(budget)
        credits = None if checked is None or checked.cost is None else checked.cost * 100
        data = SessionLimitsChangedData(
            budget=checked,
            session_limits=SessionLimits(max_ai_credits=credits) if checked is not None else None,
        )
        await self._writable().emit(SessionLimitsChangedEvent(data=data))

    @property
    def spent(self) -> Spending:
        """What the session's model calls have spent, clears and compactions included (U2)."""
        return self._log.state.spent

    async def log(
        self,
        message: str,
        *,
        level: LogLevel = "info",
        ephemeral: bool = False,
        kind: str = "notification",
        url: str | None = None,
    ) -> Event:
        """Write a note into the session's timeline (spec K4): `session.info`, `session.warning`
        or `session.error` by `level`, of type `kind`; stored unless `ephemeral`. An
        error-level note is only a note: it ends no run. Returns the event as emitted."""
        if not isinstance(message, str):
            raise ValueError(f"message must be a string, got {type(message).__name__}")
        text, kind = valid_text(message), valid_text(_text("kind", kind))
        event: Event
        match level:
            case "info":
                data = InfoData(info_type=kind, message=text, url=url)
                event = SessionInfoEvent(data=data, ephemeral=ephemeral)
            case "warning":
                event = SessionWarningEvent(
                    data=WarningData(warning_type=kind, message=text), ephemeral=ephemeral
                )
            case "error":
                error = SessionErrorData(error_type=kind, message=text, logged=True)
                event = SessionErrorEvent(data=error, ephemeral=ephemeral)
            case _:
                raise ValueError(f"level must be info, warning or error, not {level!r}")
        if ephemeral and not self.closed:
            return await self._log.emit(event)  # delivered here only, also on a remote session
        return await self._writable().emit(event)

    def _writable(self) -> SessionLog:
        if self.closed:
            raise TrimtabError(f"session {self.session_id} is disconnected")
        if not self._log.writable:
            raise TrimtabError(f"session {self.session_id} is run by another runtime (remote)")
        return self._log

    # --- driving it ----------------------------------------------------------------------

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
        return self._log.subscribers.add(first, handler)

    async def send(
        self,
        prompt: str,
        *,
        request_headers: Mapping[str, str] | None = None,
        images: Sequence[Image | Mapping[str, str]] = (),
        attachments: Sequence[Mapping[str, Any]] = (),
        mode: SendMode = "enqueue",
        output_type: Any = None,
        output_schema: Mapping[str, Any] | None = None,
        max_invalid_outputs: int = DEFAULT_MAX_INVALID,
        budget: Budget | Mapping[str, Any] | None = None,
    ) -> str:
        """Queue `prompt` for the agent and return its message id once it is stored.

        The run starts right away when the session is idle (its `user.message` is stored
        before this returns); otherwise the input waits in the store's inbox until the runs
        queued before it have ended, so that a crash cannot lose it. On a remote session the
        input is queued in the store for its owner. A `userPromptSubmitted` hook may change
        the prompt, or block it (`PromptBlockedError`: nothing is stored).

        `request_headers` go with this run's model requests only (spec D9); they are not
        stored, so an input that waits for another runtime (a remote session) goes without.
        `images` (`Image`s or `{"mime_type", "data"}`: PNG, JPEG, GIF or WebP, base64, at
        most `MAX_IMAGES` of `MAX_IMAGE_BYTES` each) are shown to the model after the prompt
        where its provider takes images, and `attachments` (JSON objects) are recorded with
        the message for clients to show (spec D14). Both are stored with the message; an
        input that waits in the inbox holds them in memory until then, and one that another
        runtime runs goes without them (its prompt should describe them).

        `output_type` (a Pydantic model, a dataclass, a TypedDict or a simple type such as
        `int`), or `output_schema` (a JSON Schema), makes the run end with a typed result
        (spec OUT1-OUT8): read it with `send_and_wait(output_type=...)`, `run` or `output`;
        `max_invalid_outputs` invalid results end the run in `invalid_output`. `budget`
        (a `Budget`) bounds what this run may spend (U3). Raises `BudgetExceededError`, and
        stores nothing, when the session's own budget is spent (U5).

        With `mode="immediate"` (spec X6) a run in progress takes the message at its next
        model call, which reads it after the current batch's results, and the `send`'s run
        is that one; when the run makes no further call, the message runs next as a queued
        one does. The mode is the sending process's: a remote session's owner, or a crash,
        leaves the input queued. A steering message takes no typed result or budget: it
        joins a run that has its own.
        """
        _text("prompt", prompt)
        if mode not in get_args(SendMode):
            raise ValueError(f"mode must be 'enqueue' or 'immediate', not {mode!r}")
        if mode == "immediate" and (output_type, output_schema, budget) != (None, None, None):
            raise ValueError("a steering message (mode='immediate') takes no output or budget")
        if self.closed:
            raise TrimtabError(f"session {self.session_id} is disconnected")
        output = self._output(output_type, output_schema, max_invalid_outputs)
        run_budget = _budget(budget)
        if not self._log.writable and (output is not None or run_budget is not None):
            # The inbox another runtime takes inputs from keeps prompts only.
            raise TrimtabError(
                f"session {self.session_id} is run by another runtime (remote): a send to it"
                " takes no output_type, output_schema or budget"
            )
        if (reached := exhausted(self._log.state, now())) is not None:
            raise BudgetExceededError(reached)
        if self._hooks:
            prompt = valid_text(await self._prompt(prompt))
        headers = _headers(request_headers)
        attached = _attached(images, attachments)
        message_id = new_id()
        if self._log.writable:
            await self._runner.submit(
                prompt,
                message_id,
                headers,
                attached,
                immediate=mode == "immediate",
                output=output,
                budget=run_budget,
            )
        else:
            await self._log.store.enqueue_input(self.session_id, prompt, message_id)
            if self._engine is not None:
                await self._engine.submit(self.session_id, message_id)
        return message_id

    def _output(
        self, output_type: Any, output_schema: Mapping[str, Any] | None, max_invalid: int
    ) -> Output | None:
        """A send's typed result, checked before anything is stored (OUT1)."""
        if output_type is None and output_schema is None:
            return None
        if output_type is not None and output_schema is not None:
            raise ValueError("give output_type or output_schema, not both")
        if isinstance(max_invalid, bool) or not isinstance(max_invalid, int):
            raise ValueError(f"max_invalid_outputs must be an int, got {max_invalid!r}")
        config = self.config
        native = config.structured_output == "native" and bool(
            getattr(self._runner.provider, "native_output", False)
        )
        taken = set(self.tools)
        if output_schema is not None:
            if not isinstance(output_schema, Mapping):
                raise ValueError("output_schema must be a JSON Schema (a JSON object)")
            return checked_schema(
                output_schema, taken=taken, max_invalid=max_invalid, native=native
            )
        return typed_output(output_type, taken=taken, max_invalid=max_invalid, native=native)

    async def _prompt(self, prompt: str) -> str:
        try:
            return await self._hooks.user_prompt_submitted(prompt)
        except PromptBlockedError as exc:
            # No run, no user message; watchers see why (ephemeral, as in the reference).
            data = WarningData(warning_type="policy_blocked", message=valid_text(str(exc)))
            await self._log.emit(SessionWarningEvent(data=data, ephemeral=True))
            raise

    @overload
    async def send_and_wait(
        self,
        prompt: str,
        *,
        output_type: None = None,
        output_schema: None = None,
        timeout: float | None = None,
        **options: Unpack[SendOptions],
    ) -> AssistantMessageEvent | None: ...
    @overload
    async def send_and_wait(
        self,
        prompt: str,
        *,
        output_type: type[_T],
        output_schema: None = None,
        timeout: float | None = None,
        **options: Unpack[SendOptions],
    ) -> _T: ...
    @overload
    async def send_and_wait(
        self,
        prompt: str,
        *,
        output_type: None = None,
        output_schema: Mapping[str, Any],
        timeout: float | None = None,
        **options: Unpack[SendOptions],
    ) -> Any: ...
    async def send_and_wait(
        self,
        prompt: str,
        *,
        output_type: Any = None,
        output_schema: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **options: Unpack[SendOptions],
    ) -> Any:
        """Send `prompt` (with `request_headers`, `images`, `attachments`, `output_type` or
        `output_schema`, and `budget`, as `send`) and wait for its run to end.

        Returns the run's last `assistant.message` as stored (after a clear, the seeded
        run's), or None if there was none (an abort before the model answered); with
        `output_type`, the run's result as an `output_type` (spec OUT1). Raises
        `SessionError` if the run ended in `session.error` (`BudgetExceededError` for a
        budget, U3), `TimeoutError` after `timeout` seconds (the run goes on), and
        `TrimtabError` when the session is disconnected before the run ends, when called
        from a tool handler of this session (the run would wait for itself), or when a
        typed run ended without a result (an abort, a rejected call, O2). On a remote
        session the run executes in its owner, and its end is read from the events this
        runtime follows.
        """
        end = await self.run(
            prompt,
            output_type=output_type,
            output_schema=output_schema,
            timeout=timeout,
            **options,
        )
        if end.error is not None:
            data = end.error.data
            raise session_error(data.error_type, data.message, status_code=data.status_code)
        if output_type is None and output_schema is None:
            return end.last_message
        return _result(end).value

    async def run(
        self,
        prompt: str,
        *,
        output_type: Any = None,
        output_schema: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **options: Unpack[SendOptions],
    ) -> RunEnd:
        """`send_and_wait`, returning how the run ended: its last message, its error (not
        raised), whether it was aborted, its result (`output`: with `output_type`, its
        value is an `output_type`) and its one `session.idle`."""
        self._not_awaited_by_run("send_and_wait", "use send(), which queues the message")
        check_seconds("timeout", timeout, bounded=False)  # before anything is sent
        runner = self._runner
        ledger = runner.ledger()  # following events before the send: none slips by
        try:
            message_id = await self.send(
                prompt, output_type=output_type, output_schema=output_schema, **options
            )
        except BaseException:
            runner.release_ledger()
            raise
        # Shielded: a timeout leaves the wait (and the ledger) until the run ends.
        wait = asyncio.shield(runner.run_end(ledger, message_id))
        end = await asyncio.wait_for(wait, timeout)
        if output_type is not None and end.output is not None:
            end.output = OutputResult(value=value_of(output_type, end.output))
        return end

    async def output(self, message_id: str | None = None, *, output_type: Any = None) -> Any:
        """The typed result of the run of `message_id` (the latest run that gave one when
        None), read from the log, so also from a resumed session (spec OUT4): JSON data, or
        an `output_type`. Raises `LookupError` when that run gave none."""
        found = results_of(await self.get_events())
        key = message_id if message_id is not None else next(reversed(found), None)
        if key is None or key not in found:
            raise LookupError(f"no result of the run of {message_id or 'any message'}")
        result = found[key]
        return result.value if output_type is None else value_of(output_type, result)

    async def pending_messages(self) -> list[QueuedMessage]:
        """The messages waiting behind the run in progress, oldest first (spec K9): sent
        with `send` while the session was busy, here or from another runtime."""
        if self._log.writable:
            inputs = await self._runner.pending()
        else:
            inputs = await self._log.store.pending_inputs(self.session_id)
        steering = {m.data.message_id for m in self._runner.live.steering}
        return [QueuedMessage(message_id=m, prompt=p, immediate=m in steering) for p, m in inputs]

    async def pending_items(self) -> list[QueuedMessage | QueuedCommand]:
        """The messages and commands waiting behind the run in progress, in the order they
        will run (spec K9, K13)."""
        if not self._log.writable:
            return list(await self.pending_messages())
        runner = self._runner
        steering = {m.data.message_id for m in runner.live.steering}
        return [
            QueuedCommand(request_id=i.request_id, command=i.command, display_text=i.display_text)
            if isinstance(i, Command)
            else QueuedMessage(message_id=i[1], prompt=i[0], immediate=i[1] in steering)
            for i in runner.queued(await runner.pending())
        ]

    async def clear_pending_messages(self) -> list[str]:
        """Remove every message and command still waiting (spec K9), never one whose run has
        begun; the ids removed. The messages' waiters (`send_and_wait`) get a
        `TrimtabError`, and watchers a `pending_messages.modified` event."""
        return await self.remove_pending(None)

    async def remove_pending(self, ids: Collection[str] | None) -> list[str]:
        """Remove the waiting messages and commands named by `ids` (message ids, commands'
        request ids; every one when None), as `clear_pending_messages` does; the ids
        removed, in queue order (spec K9)."""
        if self.closed:
            raise TrimtabError(f"session {self.session_id} is disconnected")
        return await self._runner.remove_queued(None if ids is None else frozenset(ids))

    async def enqueue_command(self, command: str, *, display_text: str | None = None) -> str:
        """Queue a slash command (`/name args`) behind the messages and commands queued
        before it (spec K13); its request id. When its turn comes the session emits
        `command.queued` for a host to run it, and waits up to `COMMAND_TIMEOUT` seconds
        for `respond_to_command` before the queue goes on."""
        command = _text("command", command).strip()
        if not command.startswith("/") or len(command) < 2:
            raise ValueError(f"a queued command starts with '/' and names one: {command!r}")
        if len(command) > MAX_COMMAND_LENGTH:
            raise ValueError(f"a queued command is at most {MAX_COMMAND_LENGTH} characters")
        display = valid_text(_text("display_text", display_text or command))
        self._writable()
        request_id = new_id()
        await self._runner.enqueue_command(valid_text(command), display, request_id)
        return request_id

    async def move_pending(self, item_id: str, position: int) -> bool:
        """Move the waiting message or command `item_id` to `position` of the queue (0: the
        next to run; past either end: that end), spec K18; whether its place changed.
        Raises `QueueEditError` (`item_not_waiting`) when no waiting item has that id: its
        run may have begun meanwhile."""
        self._open()
        return await self._runner.move(item_id, _position(position))

    async def insert_pending(
        self,
        position: int,
        prompt: str,
        *,
        request_headers: Mapping[str, str] | None = None,
        images: Sequence[Image | Mapping[str, str]] = (),
        attachments: Sequence[Mapping[str, Any]] = (),
    ) -> str:
        """Queue `prompt` at `position` of the queue (spec K18) and return its message id, as
        `send` does (which queues at the end); an idle session runs it at once."""
        _text("prompt", prompt)
        position = _position(position)
        self._open()
        if self._hooks:
            prompt = valid_text(await self._prompt(prompt))
        pending = Pending(
            prompt,
            new_id(),
            appended=False,
            parent=self.tracing.parent(),
            headers=_headers(request_headers),
            attached=_attached(images, attachments),
        )
        await self._runner.insert(position, pending)
        return pending.message_id

    async def update_pending(self, message_id: str, prompt: str) -> bool:
        """Give the waiting message `message_id` a new prompt (spec K18), through the
        `userPromptSubmitted` hook as a sent one; whether its prompt changed. Raises
        `QueueEditError` when no message of that id waits."""
        _text("prompt", prompt)
        self._open()
        if self._hooks:
            prompt = await self._prompt(prompt)
        return await self._runner.reword(message_id, valid_text(prompt))

    async def duplicate_pending(self, item_id: str) -> str:
        """Queue a copy of the waiting message or command `item_id` right after it (spec
        K18); the copy's id."""
        self._open()
        copy_id = new_id()
        await self._runner.duplicate(item_id, copy_id)
        return copy_id

    async def steer_pending(self, item_id: str) -> bool:
        """Move the waiting message `item_id` into the steering lane of the run in progress
        (spec K20), as if it had been sent with `mode="immediate"`: the run takes it at its
        next model call. False, and nothing changed, when no run is in progress. Raises
        `QueueEditError` when no message of that id waits (`item_not_waiting`), for a
        command (`not_a_message`), for a message with a typed result or a budget of its own
        (`not_steerable`) and for a remote session (`remote_session`)."""
        self._open()
        return await self._runner.send_now(item_id)

    async def append_steering(
        self,
        message_id: str,
        prompt: str,
        *,
        expected_prompt: str,
        images: Sequence[Image | Mapping[str, str]] = (),
        attachments: Sequence[Mapping[str, Any]] = (),
    ) -> bool:
        """Append `prompt` (after a blank line, through the `userPromptSubmitted` hook as a
        sent one) and what it attaches to the steering message `message_id` (spec K21),
        provided the run has not taken it yet and its prompt is `expected_prompt`; whether
        it was appended to. It keeps its id and its place."""
        _text("prompt", prompt)
        self._open()
        if self._hooks:
            prompt = await self._prompt(prompt)
        attached = _attached(images, attachments)
        return await self._runner.append_steering(
            message_id, expected_prompt, valid_text(prompt), attached, MAX_IMAGES
        )

    @property
    def drain_paused(self) -> bool:
        """Waiting messages and commands do not start (spec K19)."""
        return self._runner.drain_paused

    async def set_drain_paused(self, paused: bool) -> None:
        """Pause the queue (no waiting message or command starts; new sends wait too) or go
        on with it (spec K19). A pause is this runtime's, until `set_drain_paused(False)`
        from anyone or the session's end here. Raises `QueueEditError`
        (`queue_already_paused`) to pause a paused queue."""
        self._open()
        await self._runner.set_drain_paused(bool(paused))

    def _open(self) -> None:
        if self.closed:
            raise TrimtabError(f"session {self.session_id} is disconnected")

    def respond_to_command(self, request_id: str, *, handled: bool = True) -> bool:
        """A host's answer to the queued command whose turn came (`command.queued`): the
        queue goes on. False when no command of that id is waiting for an answer."""
        return self._runner.answer(request_id, bool(handled))

    async def abort(self) -> None:
        """Stop the current run, or the one about to start (right after `send`): running
        handlers are cancelled, the run ends with `abort` and `session.idle`. Messages queued
        behind it still run. Returns once the run has ended."""
        if self._engine is not None:
            await self._engine.abort(self.session_id)
        else:
            await self._runner.abort()

    @property
    def busy(self) -> bool:
        """A run or window operation is in progress or queued."""
        return self._runner.busy

    async def wait_idle(self) -> None:
        """Return once no run or operation is in progress or queued."""
        self._not_awaited_by_run("wait_idle", "return, and the run goes on")
        await self._runner.wait_idle()

    def _not_awaited_by_run(self, what: str, instead: str) -> None:
        """Refuse a wait for this session's run from host code that run awaits (a tool or
        permission handler, a hook): it could only wait for itself (spec C11)."""
        if _loop.awaited_by.get() == self.session_id:
            raise TrimtabError(
                f"{what} from a handler or hook of this session's run would wait for the run"
                f" to end, which waits for the handler: {instead}"
            )

    # --- letting go ----------------------------------------------------------------------

    async def shutdown(
        self, kind: Literal["routine", "error"] = "routine", reason: str | None = None
    ) -> None:
        """End the session for good (spec K5): abort any run, log `session.shutdown` with
        what the session spent, then `disconnect()`. The log stays; a later resume opens the
        session again. From a tool handler of this session, as `disconnect()`: the handler
        is cancelled, and the shutdown completes."""
        log = self._writable()
        if self._shutting is None:
            # A task of its own: the abort cancels the handler that may be calling this.
            self._shutting = asyncio.get_running_loop().create_task(
                self._shut_down(log, kind, reason), name=f"trimtab-shutdown-{self.session_id}"
            )
        await asyncio.shield(self._shutting)

    async def _shut_down(
        self, log: SessionLog, kind: Literal["routine", "error"], reason: str | None
    ) -> None:
        await self.abort()
        metrics = await self.metrics()
        data = ShutdownData(
            shutdown_type=kind,
            error_reason=None if reason is None else valid_text(reason),
            session_start_time=int(metrics.start_time.timestamp() * 1000),
            total_api_duration_ms=metrics.api_duration_ms,
            model_metrics=metrics.models,
            current_model=self.config.model,
        )
        await log.emit(SessionShutdownEvent(data=data))
        await self.disconnect()

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
        log = self._log
        await self._ownership.unfollow()
        if self._answerer is not None:
            await self._answerer.close()
        reason = TrimtabError(
            f"session {self.session_id} was disconnected before this ran"
            " (a queued message stays in the store, and runs when the session is resumed)"
        )
        await self._runner.close(reason)
        await self._hooks.session_end("user_exit")
        try:
            if (lease := log.lease) is not None:
                log.lease = None
                await self._let_go(lease)
        finally:
            await self._runner.toolbox.close()
            if self._owner is not None:
                self._owner.forget_session(self)

    async def _let_go(self, lease: Lease) -> None:
        """Keep a snapshot and release the lease, as far as the store lets: the session is
        closed here whatever it answers (C11), and an unreleased lease lapses (R1)."""
        log = self._log
        try:
            if not log.state.unfinished_calls:
                # Between runs the state is small: keep it, so the next open need not replay.
                snapshot = log.state.snapshot()
                await log.store.save_snapshot(
                    self.session_id, snapshot.event_count, snapshot.model_dump_json()
                )
            await log.store.release_lease(lease)
        except SessionNotFoundError:
            pass  # deleted meanwhile (by another runtime): nothing is left to keep
        except StoreUnavailableError as exc:
            _log.warning(
                "session %s disconnected, but its lease could not be released (%s): it lapses"
                " in at most its ttl",
                self.session_id,
                exc,
            )

    @property
    def closed(self) -> bool:
        """`disconnect()` was called: the session can no longer be used."""
        return self._closing is not None


def ownership_of(session: Session) -> Ownership:
    """The session's lease, as the runtime that opened it drives it (not the host's API)."""
    return session._ownership


def answer_waiting(session: Session) -> None:
    """Answer the questions the session's log shows waiting (a run parked on an engine,
    spec EN6), each announced again to the session's subscribers first: call it once the
    session is handed to whoever subscribes."""
    answerer = session._answerer
    if answerer is not None:
        for wait in session._log.state.waiting.values():
            answerer.ask(wait, session._log.subscribers.deliver)


class SendOptions(TypedDict, total=False):
    """What `send` takes beside its prompt, which `send_and_wait` and `run` pass on."""

    request_headers: Mapping[str, str] | None
    images: Sequence[Image | Mapping[str, str]]
    attachments: Sequence[Mapping[str, Any]]
    mode: SendMode
    max_invalid_outputs: int
    budget: Budget | Mapping[str, Any] | None


def _result(end: RunEnd) -> OutputResult:
    """The result of a typed run that ended without error."""
    if end.output is None:
        why = "it was aborted" if end.aborted else "no result was given (a rejected call?)"
        raise TrimtabError(f"the run ended without a result: {why}")
    return end.output


def _budget(given: Budget | Mapping[str, Any] | None) -> Budget | None:
    """A budget as given (a `Budget` or its fields), checked (U3)."""
    if given is None or isinstance(given, Budget):
        return given
    try:
        return Budget.model_validate(given)
    except ValidationError as exc:
        raise ValueError(f"invalid budget: {exc}") from None


def _text(what: str, value: object) -> str:
    """`value`, if it is text with something in it that the log can store (no lone
    surrogate: the stores encode UTF-8); else `ValueError` naming `what`."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string")
    if valid_text(value) != value:
        raise ValueError(f"{what} is not valid Unicode text (it holds a lone surrogate)")
    return value


_SEND_REFUSED = FRAMING | {"host"}
"""Per-send headers the HTTP client sets, and `host`: sent with a send, it would route the
provider's credentials to another virtual host of the provider's address."""


def _position(position: int) -> int:
    """A place in the queue, as given (past either end means that end)."""
    if isinstance(position, bool) or not isinstance(position, int):
        raise ValueError(f"a position in the queue is an integer, not {position!r}")
    return position


def _headers(given: Mapping[str, str] | None) -> dict[str, str] | None:
    """Per-send headers, checked (spec D9)."""
    return checked_headers(given, "request_headers", refused=_SEND_REFUSED) if given else None


MAX_IMAGES = 20
"""Images one `send` may show the model."""

MAX_IMAGE_BYTES = 10 * 1024 * 1024
"""The largest image (decoded) a `send` takes: the log stores it with the message."""


def _attached(
    images: Sequence[Image | Mapping[str, str]], attachments: Sequence[Mapping[str, Any]]
) -> Attached | None:
    """A send's images and attachments, checked (spec D14); None when it has neither."""
    if not images and not attachments:
        return None
    if len(images) > MAX_IMAGES:
        raise ValueError(f"a send takes at most {MAX_IMAGES} images")
    checked: list[Image] = []
    for image in images:
        try:
            image = image if isinstance(image, Image) else Image.model_validate(image)
        except ValidationError as exc:
            raise ValueError(f"invalid image: {exc}") from None
        if len(image.data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
            raise ValueError(f"an image is larger than {MAX_IMAGE_BYTES} bytes")
        try:
            base64.b64decode(image.data, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("an image's data is not base64") from None
        checked.append(image)
    described = tuple(dict(attachment) for attachment in attachments)
    attached = Attached(tuple(checked), described)
    try:
        pydantic_core.to_json(described)  # what the log can store
        # Built now, as the run will build it: an input that waits in the inbox must not
        # fail there, where nobody hears it (its message would block the inbox).
        UserMessageData(content="-", **attached.fields())
    except (pydantic_core.PydanticSerializationError, ValidationError):
        raise ValueError("attachments must be JSON objects (text keys) of valid text") from None
    return attached
