"""`Answerer`: answers, from a process that has a session open, the questions its runs ask
while an engine executes them elsewhere (spec EN6).

A run on an engine announces each question in the log: a `permission.requested`, or an
`external_tool.requested` for a tool its worker does not hold. The session's processes follow
the log; each one that has what answers a question (its permission handler; that tool, run
here or by its client over the wire) answers it through the engine. The first answer counts;
a question settled meanwhile (an abort) stops its handler here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from trimtab import _loop
from trimtab._engine import MAX_ANSWER_BYTES, Answer, Engine, PermissionAnswer, ToolAnswer
from trimtab._permissions import PermissionDecision, PermissionHandlerFn, decide
from trimtab._state import Wait
from trimtab._tools import CallOutcome, ExternalTool, SessionHandle, Tool, ToolInvocation
from trimtab.events import (
    Event,
    ExternalToolCompletedEvent,
    ExternalToolRequestedData,
    ExternalToolRequestedEvent,
    PermissionCompletedEvent,
    PermissionRequestedData,
    PermissionRequestedEvent,
)

__all__ = ["Answerer"]

log = logging.getLogger("trimtab")


class Answerer:
    """The questions of one session's runs that this process answers."""

    __slots__ = ("_engine", "_handle", "_handler", "_tasks", "_tools")

    def __init__(
        self,
        handle: SessionHandle,
        engine: Engine,
        *,
        tools: Callable[[], Mapping[str, Tool]],
        permission_handler: Callable[[], PermissionHandlerFn | None],
    ) -> None:
        self._handle = handle
        self._engine = engine
        self._tools = tools
        self._handler = permission_handler
        self._tasks: dict[str, asyncio.Task[None]] = {}
        """The answers being worked out, by request id."""

    def observe(self, event: Event) -> None:
        """Take in one of the session's events, as delivered: a question is answered (in a
        task of its own, once the event has reached every subscriber), a settled one is no
        longer worked on."""
        match event:
            case PermissionRequestedEvent() | ExternalToolRequestedEvent():
                self.ask(event.data)
            case PermissionCompletedEvent() | ExternalToolCompletedEvent():
                task = self._tasks.pop(event.data.request_id, None)
                if task is not None:
                    task.cancel()
            case _:
                pass

    def ask(self, wait: Wait, announce: Callable[[Event], None] | None = None) -> None:
        """Work out the answer to `wait`, if this process has what answers it; first,
        `announce` its question again (to the session's subscribers: a server's clients
        asked it before this process had the session open)."""
        if wait.request_id in self._tasks:
            return
        task = asyncio.get_running_loop().create_task(
            self._answer(wait, announce), name=f"trimtab-answer-{wait.request_id}"
        )
        self._tasks[wait.request_id] = task
        task.add_done_callback(lambda _: self._forget(wait.request_id, task))

    def _forget(self, request_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(request_id) is task:
            del self._tasks[request_id]

    async def close(self) -> None:
        """Stop answering: the handlers still at work here are cancelled."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _answer(self, wait: Wait, announce: Callable[[Event], None] | None) -> None:
        # Host code the run waits for: a wait for that run's end from here is refused (C11).
        _loop.awaited_by.set(self._handle.session_id)
        if announce is not None:
            # Live, not stored: the log has it already.
            if isinstance(wait, PermissionRequestedData):
                announce(PermissionRequestedEvent(data=wait, ephemeral=True))
            else:
                announce(ExternalToolRequestedEvent(data=wait, ephemeral=True))
        try:
            if isinstance(wait, PermissionRequestedData):
                answer: Answer | None = await self._decision(wait)
            else:
                answer = await self._result(wait)
            if answer is not None:
                await self._engine.answer(self._handle.session_id, wait.request_id, answer)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The engine's own timer gives the question up if nobody answers (EN5).
            session_id = self._handle.session_id
            log.exception("could not answer %s of session %s", wait.request_id, session_id)

    async def _decision(self, wait: PermissionRequestedData) -> PermissionAnswer | None:
        handler = self._handler()
        if handler is None:
            return None  # another process may have one; else the question times out
        request = wait.permission_request
        invocation = ToolInvocation(
            session_id=self._handle.session_id,
            tool_call_id=request.tool_call_id or "",
            tool_name=request.tool_name,
            arguments=request.args,
            session=self._handle,
        )
        decision = await decide(handler, request, invocation)
        return PermissionAnswer(decision=decision or PermissionDecision(kind="user-not-available"))

    async def _result(self, wait: ExternalToolRequestedData) -> ToolAnswer | None:
        tool = self._tools().get(wait.tool_name)
        if tool is None or (isinstance(tool, ExternalTool) and not tool.provided()):
            return None  # not this process's to run
        params = tool.validate(wait.arguments)
        if isinstance(params, CallOutcome):
            outcome = params
        else:
            invocation = ToolInvocation(
                session_id=self._handle.session_id,
                tool_call_id=wait.tool_call_id,
                tool_name=wait.tool_name,
                arguments=wait.arguments,
                session=self._handle,
                request_id=wait.request_id,
            )
            outcome = await tool.run(params, invocation)
        answer = ToolAnswer(
            outcome=outcome.outcome, text=outcome.text, references=list(outcome.references)
        )
        if len(answer.model_dump_json().encode()) > MAX_ANSWER_BYTES:
            text = (
                f"Failed to execute '{wait.tool_name}': its result is larger than"
                f" {MAX_ANSWER_BYTES} bytes, the most an engine carries."
            )
            answer = ToolAnswer(outcome="failure", text=text)
        return answer
