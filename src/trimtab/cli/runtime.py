"""How the command line runs sessions: an event loop beside the terminal, and a bridge
between them.

The main thread stays the terminal's: it reads input (with line editing and plain Ctrl-C),
asks for permissions and does all the printing. Sessions run on an asyncio loop in a
background thread (`Portal`). A `TerminalBridge` carries events and permission requests from
the loop to the terminal thread through one queue, so output is never interleaved and a
permission prompt can wait as long as the person needs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from trimtab import (
    Event,
    LeaseLostError,
    PermissionDecision,
    Session,
    SessionError,
    SessionNotFoundError,
    ToolInvocation,
)
from trimtab.cli.demo_tools import CLEAR_CONTEXT
from trimtab.cli.errors import CliError
from trimtab.cli.render import Terminal, printable
from trimtab.events import (
    AbortEvent,
    AssistantMessageEvent,
    OutputResult,
    PermissionRequestData,
    SessionContextClearedEvent,
    SessionErrorData,
    SessionErrorEvent,
    ToolExecutionCompleteEvent,
    UserMessageEvent,
)

__all__ = [
    "Approver",
    "TerminalBridge",
    "Portal",
    "TurnOutcome",
    "provider_type",
    "read_line",
    "session_error_hint",
]

T = TypeVar("T")

_TICK = 0.1
"""Seconds between spinner frames, and the longest the terminal thread sleeps."""


class Portal:
    """An asyncio event loop on a background thread, used from the terminal thread.

    ```python
    with Portal(term) as portal:
        session = portal.call(client.create_session(...), progress="starting")
    ```
    """

    def __init__(self, term: Terminal) -> None:
        self._term = term
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="trimtab-cli", daemon=True
        )

    def __enter__(self) -> Portal:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the loop and return at once."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, coro: Coroutine[Any, Any, T], *, progress: str | None = None) -> T:
        """Run `coro` on the loop and wait for it, showing `progress` if it takes a while.

        Ctrl-C raises `KeyboardInterrupt` here; the coroutine itself goes on.
        """
        future = self.submit(coro)
        spinner = self._term.spinner
        if progress:
            spinner.start(progress)
        try:
            while True:
                try:
                    return future.result(timeout=_TICK)
                except TimeoutError:
                    spinner.tick()
        finally:
            if progress:
                spinner.stop()

    def close(self) -> None:
        """Cancel what is still running on the loop, stop it and join its thread."""
        if not self._thread.is_alive():
            return
        try:
            # A task that ignores cancellation must not keep the command from exiting.
            with contextlib.suppress(TimeoutError):
                self.submit(_cancel_others()).result(timeout=5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()


async def _cancel_others() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def read_line(term: Terminal, prompt: str, *, err: bool = False) -> str:
    """One line of input. Raises `EOFError` at end of input, `KeyboardInterrupt` on Ctrl-C."""
    term.spinner.stop()
    if not err:
        # input() draws the prompt itself, so that line editing can redraw it.
        return input(prompt)
    term.write(prompt, err=True)
    return input()


# --- permissions -------------------------------------------------------------------------

ApprovalMode = Literal["yes", "ask", "deny"]

_ANSWERS: dict[str, Literal["approve-once", "approve-for-session", "reject"]] = {
    "y": "approve-once",
    "yes": "approve-once",
    "a": "approve-for-session",
    "always": "approve-for-session",
    "n": "reject",
    "no": "reject",
}


class Approver:
    """Answers permission requests on the terminal thread.

    Args:
        term: Where to ask.
        mode: `yes` approves everything (`--yes`); `ask` prompts; `deny` answers
            `user-not-available` and says so (nobody at a terminal to ask).
        prompt_on_err: Ask on stderr (`run`, whose stdout may be a pipe) rather than stdout.
    """

    def __init__(self, term: Terminal, mode: ApprovalMode, *, prompt_on_err: bool) -> None:
        self._term = term
        self.mode: ApprovalMode = mode
        self._err = prompt_on_err
        self.requested_clear: str | None = None
        """The prompt of a `/clear` the person typed: its `clear_context` call needs no second
        approval. Only that exact call, once."""

    def decide(self, request: PermissionRequestData) -> PermissionDecision:
        """The decision for one request."""
        name = request.tool_name
        if request.kind == "mcp":
            name = f"{request.tool_name} (MCP server {request.server_name})"
        elif request.kind == "shell":
            name = f"{request.tool_name} `{request.full_command_text}`"
        elif request.kind in ("read", "write"):
            name = f"{request.tool_name} {request.path or request.file_name}"
        if self.mode == "yes":
            return PermissionDecision(kind="approve-once")
        if self._is_requested_clear(request):
            self.requested_clear = None
            self._term.note(f"  {name}: approved (you asked for /clear)")
            return PermissionDecision(kind="approve-once")
        if self.mode == "deny":
            self._term.note(
                f"trimtab: {name} denied: nobody can approve it here (stdin is not a terminal);"
                " pass --yes to approve tools"
            )
            return PermissionDecision(kind="user-not-available")
        return self._ask(printable(name))

    def _is_requested_clear(self, request: PermissionRequestData) -> bool:
        args = request.args
        return (
            self.requested_clear is not None
            and request.kind == "custom-tool"
            and request.tool_name == CLEAR_CONTEXT
            and isinstance(args, dict)
            and args.get("prompt") == self.requested_clear
        )

    def _ask(self, name: str) -> PermissionDecision:
        term = self._term
        question = (
            f"  allow {term.paint(name, 'bold', err=self._err)}?"
            " [y]es once / [a]lways this session / [n]o: "
        )
        while True:
            try:
                answer = read_line(term, question, err=self._err).strip().lower()
            except EOFError:
                term.line(err=self._err)
                return PermissionDecision(kind="user-not-available")
            except KeyboardInterrupt:
                term.line(err=self._err)
                return PermissionDecision(kind="reject", feedback="interrupted by the user")
            if answer in _ANSWERS:
                return PermissionDecision(kind=_ANSWERS[answer])


# --- driving a session -------------------------------------------------------------------


@dataclass(slots=True)
class _Ask:
    request: PermissionRequestData
    answer: concurrent.futures.Future[PermissionDecision]


_DONE = object()
"""Queued when a run's `send_and_wait` returned: after all the run's events."""


@dataclass(slots=True)
class TurnOutcome:
    """How one `send` ended, as the terminal thread saw it."""

    reply: AssistantMessageEvent | None = None
    """The run's last assistant message (after a clear, the seeded run's)."""
    error: SessionErrorData | None = None
    aborted: bool = False
    cleared: bool = False
    """The context was cleared during the run."""
    rejected: str | None = None
    """The tool whose call was rejected, which stopped the run (spec O2)."""
    prompt_event: str | None = None
    """The id of the run's own `user.message`, where an interrupted exchange starts."""
    output: OutputResult | None = None
    """The run's typed result, when it was asked for one and gave it (spec OUT8)."""


class TerminalBridge:
    """Carries a session's events and permission requests to the terminal thread.

    Create the bridge first and pass `permission_handler` to the session, then `attach` it.
    """

    def __init__(
        self, portal: Portal, term: Terminal, render: Callable[[Event], None], approver: Approver
    ) -> None:
        self._portal = portal
        self._term = term
        self._render = render
        self.approver = approver
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._session: Session | None = None
        self._unsubscribe: Callable[[], None] | None = None

    async def permission_handler(
        self, request: PermissionRequestData, invocation: ToolInvocation
    ) -> PermissionDecision:
        """The session's permission handler (runs on the loop): asks the terminal thread."""
        answer: concurrent.futures.Future[PermissionDecision] = concurrent.futures.Future()
        self._inbox.put(_Ask(request, answer))
        return await asyncio.wrap_future(answer)

    @property
    def session(self) -> Session:
        """The attached session."""
        if self._session is None:
            raise RuntimeError("no session attached")
        return self._session

    def attach(self, session: Session) -> None:
        """Receive this session's events from now on (and no other session's)."""
        if self._unsubscribe is not None:
            self._portal.call(_unsubscribe(self._unsubscribe))
        self._session = session
        self._unsubscribe = self._portal.call(_subscribe(session, self._inbox.put))

    def drive(self, prompt: str, *, output_schema: dict[str, Any] | None = None) -> TurnOutcome:
        """Send `prompt` (asking for a result that follows `output_schema`, if given) and
        render the run until it ends. Ctrl-C aborts the run."""
        session = self.session
        future = self._portal.submit(_reply(session, prompt, output_schema))
        future.add_done_callback(lambda _: self._inbox.put(_DONE))
        outcome = TurnOutcome()
        interrupted = False
        while True:
            try:
                if self._step(outcome):
                    break
            except KeyboardInterrupt:
                if interrupted:
                    raise  # a second Ctrl-C: stop waiting for the abort to finish
                interrupted = True
                self._term.note("(interrupted: aborting the run; Ctrl-C again to quit)")
                self._portal.submit(session.abort())
        return _finish(future, outcome, session.session_id)

    def _step(self, outcome: TurnOutcome) -> bool:
        """Handle one queued item; True when the run is over."""
        try:
            item = self._inbox.get(timeout=_TICK)
        except queue.Empty:
            self._term.spinner.tick()
            return False
        if item is _DONE:
            return True
        if isinstance(item, _Ask):
            self._term.spinner.stop()
            decision = self.approver.decide(item.request)
            if not item.answer.done():  # an abort may have cancelled the question meanwhile
                item.answer.set_result(decision)
            return False
        # Only events, questions and _DONE are ever queued.
        self._see(cast(Event, item), outcome)
        return False

    def _see(self, event: Event, outcome: TurnOutcome) -> None:
        match event:
            case SessionErrorEvent():
                outcome.error = event.data
            case AbortEvent():
                outcome.aborted = True
            case SessionContextClearedEvent():
                outcome.cleared = True
            case ToolExecutionCompleteEvent() if event.data.outcome == "rejected":
                outcome.rejected = event.data.tool_name or "tool"
            case ToolExecutionCompleteEvent() | AssistantMessageEvent() if event.data.output:
                outcome.output = event.data.output
            case UserMessageEvent() if event.data.source != "context_cleared":
                outcome.prompt_event = outcome.prompt_event or event.id
            case _:
                pass  # only these change how the turn ended
        self._render(event)


async def _reply(
    session: Session, prompt: str, output_schema: dict[str, Any] | None
) -> AssistantMessageEvent | None:
    """The run's last message; with `output_schema`, its result is read from its events."""
    if output_schema is None:
        return await session.send_and_wait(prompt)
    end = await session.run(prompt, output_schema=output_schema)
    if end.error is not None:
        raise SessionError(end.error.data.error_type, end.error.data.message)
    return end.last_message


async def _subscribe(session: Session, handler: Callable[[Event], object]) -> Callable[[], None]:
    # Called on the loop's thread, like every other change to the session's handler list.
    return session.on(handler)


async def _unsubscribe(unsubscribe: Callable[[], None]) -> None:
    unsubscribe()


def _finish(
    future: concurrent.futures.Future[AssistantMessageEvent | None],
    outcome: TurnOutcome,
    session_id: str,
) -> TurnOutcome:
    try:
        outcome.reply = future.result()
    except SessionError:
        pass  # the session.error event already told what happened
    except concurrent.futures.CancelledError:
        outcome.aborted = True
    except SessionNotFoundError:
        raise CliError(
            f"session {session_id} was deleted while it ran", hint="start a new one"
        ) from None
    except LeaseLostError:
        raise CliError(
            f"session {session_id} was taken over by another trimtab process",
            hint="continue it there, or resume it here once that process has ended",
        ) from None
    return outcome


_ERROR_HINTS = {
    "authentication": "check the API key: --api-key, TRIMTAB_API_KEY or the provider's variable",
    "provider_unavailable": "is the model server running? check --provider and --base-url",
    "rate_limit": "the provider is limiting requests: wait a moment and try again",
    "context_length": "the conversation is too long for the model: start a new session",
    "bad_request": "the provider refused the request: check --model",
    "bad_response": "the provider's answer could not be understood: try another model",
    "timeout": "the model did not answer in time: try a longer --timeout, or a smaller model",
    "max_turns": "the model kept calling tools: send again to go on, or raise --max-turns",
    "script_exhausted": "the --script file has no reply left for this model call",
}


def session_error_hint(data: SessionErrorData, provider: str | None = None) -> str:
    """What a person can do about a `session.error` of a session using `provider`."""
    if provider == "local" and data.error_type == "provider_unavailable":
        return "the embedded model could not run; choose another provider with --provider"
    return _ERROR_HINTS.get(data.error_type, "run again with --debug for details")


def provider_type(session: Session) -> str:
    """The type of the session's provider, as its configuration records it."""
    return str((session.config.provider or {}).get("type", "?"))
