"""`Session`: the public face of one agent session.

It is a facade over the session's parts, each with one job: `SessionLog` writes (or follows)
the log and keeps what the session knows from it; `Runner` runs its inputs one after another
and hosts the loop; `Ownership` holds or follows its lease and finishes what a crash left;
`History` moves its window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, overload

from trimtab import _loop
from trimtab._errors import PromptBlockedError, SessionError, TrimtabError
from trimtab._history import History
from trimtab._hooks import Hooks
from trimtab._log import SessionLog
from trimtab._ownership import Ownership
from trimtab._permissions import PermissionHandlerFn
from trimtab._runner import Runner
from trimtab._runs import RunEnd
from trimtab._subscribers import EventHandler
from trimtab._toolbox import Toolbox
from trimtab._tools import Tool, valid_text
from trimtab._tracing import OFF, Tracing
from trimtab._window import ContextWindow, context_window
from trimtab.events import (
    AssistantMessageEvent,
    Event,
    EventType,
    SessionConfigData,
    SessionWarningEvent,
    WarningData,
    new_id,
)
from trimtab.providers import Message, Provider, Usage

if TYPE_CHECKING:
    from trimtab._history import SessionOwner

__all__ = ["Session"]


class _Rpc:
    __slots__ = ("history",)

    def __init__(self, history: History) -> None:
        self.history = history


class Session:
    """A live agent session: send messages, watch events, manage the context window.

    Create one with `Client.create_session` or `Client.resume_session`.
    """

    __slots__ = (
        "_closing",
        "_hooks",
        "_log",
        "_owner",
        "_runner",
        "history",
        "ownership",
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
        owner: SessionOwner | None = None,
    ) -> None:
        self.session_id = log.session_id
        self._log = log
        self._hooks = hooks
        self._runner = Runner(
            self,
            log,
            provider=provider,
            toolbox=toolbox,
            permission_handler=permission_handler,
            hooks=hooks,
        )
        self.ownership = Ownership(log, self._runner)
        """Who runs the session: what the runtime that opened it (`Client`) drives."""
        self.history = History(self._runner, owner)
        self._owner = owner
        self._closing: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"Session({self.session_id!r}, remote={self.is_remote})"

    # --- what the session is -------------------------------------------------------------

    @property
    def rpc(self) -> _Rpc:
        """`session.rpc.history.*`: the Copilot SDK's spelling of `session.history.*`."""
        return _Rpc(self.history)  # made on use: one object less in every idle session

    def options(self) -> dict[str, Any]:
        """What the host gave this session that its log does not keep (provider, tools,
        handlers, hooks, MCP servers): what a fork of it is given again."""
        runner = self._runner
        return {
            "provider": runner.provider,
            "tools": list(runner.toolbox.own.values()),
            "on_permission_request": runner.permission_handler,
            "hooks": self._hooks.handlers,
            "mcp_servers": runner.toolbox.source_options,
        }

    @property
    def config(self) -> SessionConfigData:
        """The configuration, as the log last recorded it."""
        return self._log.state.config

    @property
    def tools(self) -> Mapping[str, Tool]:
        """Every tool the model may call, the built-in `tool_search` included."""
        return self._runner.tools

    @property
    def usage(self) -> Usage:
        """Tokens used by every model call of the session, clears and compactions included."""
        return self._log.state.usage

    @property
    def is_remote(self) -> bool:
        """Another runtime holds this session's lease: it may be read, not driven (spec R1)."""
        return not self._log.writable

    @property
    def tracing(self) -> Tracing:
        """How this session traces: its client's setting (spec OT1)."""
        return self._owner.tracing if self._owner is not None else OFF

    @property
    def context_epoch(self) -> int:
        """How many clears this session has committed."""
        return self._log.state.epoch

    def window(self) -> list[Message]:
        """The messages the model will see on its next call."""
        return self._log.state.window()

    def get_context(self) -> ContextWindow:
        """What the model will see next, with token counts, so a host can inspect its budget."""
        runner = self._runner
        return context_window(self.window(), runner.model_tools(), runner.limits.context_window)

    async def get_events(self) -> list[Event]:
        """The persisted log, oldest first."""
        return await self._log.store.read(self.session_id)

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

    async def send(self, prompt: str) -> str:
        """Queue `prompt` for the agent and return its message id once it is stored.

        The run starts right away when the session is idle (its `user.message` is stored
        before this returns); otherwise the input waits in the store's inbox until the runs
        queued before it have ended, so that a crash cannot lose it. On a remote session the
        input is queued in the store for its owner. A `userPromptSubmitted` hook may change
        the prompt, or block it (`PromptBlockedError`: nothing is stored).
        """
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        if valid_text(prompt) != prompt:
            raise ValueError("prompt is not valid Unicode text (it holds a lone surrogate)")
        if self.closed:
            raise TrimtabError(f"session {self.session_id} is disconnected")
        if self._hooks:
            prompt = valid_text(await self._prompt(prompt))
        message_id = new_id()
        if self._log.writable:
            await self._runner.submit(prompt, message_id)
        else:
            await self._log.store.enqueue_input(self.session_id, prompt, message_id)
        return message_id

    async def _prompt(self, prompt: str) -> str:
        try:
            return await self._hooks.user_prompt_submitted(prompt)
        except PromptBlockedError as exc:
            # No run, no user message; watchers see why (ephemeral, as in the reference).
            data = WarningData(warning_type="policy_blocked", message=valid_text(str(exc)))
            await self._log.emit(SessionWarningEvent(data=data, ephemeral=True))
            raise

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
        end = await self.run(prompt, timeout=timeout)
        if end.error is not None:
            data = end.error.data
            raise SessionError(data.error_type, data.message, status_code=data.status_code)
        return end.last_message

    async def run(self, prompt: str, *, timeout: float | None = None) -> RunEnd:
        """`send_and_wait`, returning how the run ended: its last message, its error (not
        raised), whether it was aborted, and its one `session.idle`."""
        current = _loop.current_tool_call.get()
        if current is not None and current[0] == self.session_id:
            raise TrimtabError(
                "send_and_wait from a tool handler of the same session would wait for its own "
                "run to end: use send(), which queues the message behind the run"
            )
        runner = self._runner
        ledger = runner.ledger()  # following events before the send: none slips by
        try:
            message_id = await self.send(prompt)
        except BaseException:
            runner.release_ledger()
            raise
        # Shielded: a timeout leaves the wait (and the ledger) until the run ends.
        return await asyncio.wait_for(asyncio.shield(runner.run_end(ledger, message_id)), timeout)

    async def abort(self) -> None:
        """Stop the current run, or the one about to start (right after `send`): running
        handlers are cancelled, the run ends with `abort` and `session.idle`. Messages queued
        behind it still run. Returns once the run has ended."""
        await self._runner.abort()

    @property
    def busy(self) -> bool:
        """A run or window operation is in progress or queued."""
        return self._runner.busy

    async def wait_idle(self) -> None:
        """Return once no run or operation is in progress or queued."""
        await self._runner.wait_idle()

    # --- letting go ----------------------------------------------------------------------

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
        await self.ownership.unfollow()
        reason = TrimtabError(
            f"session {self.session_id} was disconnected before this ran"
            " (a queued message stays in the store, and runs when the session is resumed)"
        )
        await self._runner.close(reason)
        await self._hooks.session_end("user_exit")
        if log.lease is not None:
            if not log.state.unfinished_calls:
                # Between runs the state is small: keep it, so the next open need not replay.
                snapshot = log.state.snapshot()
                await log.store.save_snapshot(
                    self.session_id, snapshot.event_count, snapshot.model_dump_json()
                )
            await log.store.release_lease(log.lease)
            log.lease = None
        await self._runner.toolbox.close()
        if self._owner is not None:
            self._owner.forget_session(self)

    @property
    def closed(self) -> bool:
        """`disconnect()` was called: the session can no longer be used."""
        return self._closing is not None
