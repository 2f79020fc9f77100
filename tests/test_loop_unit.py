"""The loop alone: one run driven with a `RunContext` made by hand and a log that is a list.

No `Client`, no `Session`, no store: what the loop needs is its context and a writer, and
this is what it does with them (spec section 4's orders, T1, O2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from trimtab import _loop
from trimtab._hooks import Hooks
from trimtab._log import chained
from trimtab._loop import LoopState
from trimtab._run_context import RunContext
from trimtab._state import SessionState
from trimtab._tools import Tool, define_tool
from trimtab._tracing import OFF
from trimtab.events import (
    Event,
    ModelLimits,
    SessionConfigData,
    SessionStartData,
    SessionStartEvent,
)
from trimtab.testing import ScriptedModel, tool_call


class Args(BaseModel):
    text: str


@dataclass
class ListLog:
    """A `LoopHost` whose log is a list: events are stamped, applied and kept, nothing more."""

    model: ScriptedModel
    tools: Sequence[Tool] = ()
    events: list[Event] = field(default_factory=list)
    live: LoopState = field(default_factory=LoopState)
    _state: SessionState = field(default_factory=SessionState)

    @property
    def state(self) -> SessionState:
        return self._state

    async def emit_all(self, events: Sequence[Event]) -> list[Event]:
        stamped = chained(events, self._state.last_id, self._state.epoch)
        for event in stamped:
            if not event.ephemeral:
                self._state.apply(event)
            self.events.append(event)
        return stamped

    def context(self) -> RunContext:
        config = self._state.config
        tools = {tool.name: tool for tool in self.tools}
        return RunContext(
            session=_NoSession(),
            config=config,
            provider=self.model,
            limits=ModelLimits(context_window=100_000, max_output_tokens=1_000),
            tools=tools,
            deferred=frozenset(),
            shown=tuple(tool.definition for tool in self.tools),
            permission_handler=None,
            approve_all=True,
            hooks=Hooks("s", None),
            tracing=OFF,
        )

    async def refresh_tools(self) -> None:
        return None

    async def steer(self) -> None:
        messages, self.live.steering = self.live.steering, ()
        await self.emit_all(messages)

    def types(self) -> list[str]:
        return [event.type for event in self.events if not event.ephemeral]


class _NoSession:
    """A handle no handler of these tests uses."""

    session_id = "s"

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the loop used the session's {name}")


async def _started(log: ListLog, prompt: str) -> str:
    config = SessionConfigData(system_message="SYSTEM", tools=[t.definition for t in log.tools])
    start = SessionStartEvent(data=SessionStartData(session_id="s", config=config))
    message = _loop.user_message(prompt, "m1", "user")
    await log.emit_all([start, message])
    return "m1"


async def test_a_plain_reply_is_one_turn_in_the_order_of_section_4() -> None:
    log = ListLog(ScriptedModel(["hello"]))
    end = await _loop.run(log, await _started(log, "hi"))
    assert end.error is None and end.last_message is not None
    assert end.last_message.data.content == "hello"
    assert log.types()[2:] == [
        "assistant.turn_start",
        "assistant.message",
        "assistant.usage",
        "assistant.turn_end",
    ]
    assert [m.role for m in log.model.requests[0].messages] == ["system", "user"]
    assert log.state.run_id is None  # the log says the run ended


async def test_t1_a_successful_terminal_call_ends_the_run_after_its_batch() -> None:
    ran: list[str] = []

    def finish(params: Args) -> str:
        ran.append(params.text)
        return "ok"

    done = define_tool("done", params_type=Args, is_terminal=True, handler=finish)
    echo = define_tool("echo", params_type=Args, handler=lambda p: p.text)
    model = ScriptedModel(
        [
            [tool_call("echo", {"text": "a"}, id="c1")],
            [tool_call("done", {"text": "b"}, id="c2"), tool_call("echo", {"text": "c"}, id="c3")],
        ]
    )
    log = ListLog(model, (done, echo))
    end = await _loop.run(log, await _started(log, "go"))
    assert end.error is None and ran == ["b"]
    model.assert_done()  # no third model call (T1)
    completes = [e.data for e in log.events if e.type == "tool.execution_complete"]
    assert sorted((c.tool_call_id, c.outcome) for c in completes) == [
        ("c1", "success"),
        ("c2", "success"),
        ("c3", "success"),
    ]
    assert log.types()[-1] == "assistant.turn_end"


async def test_o2_a_failing_terminal_call_goes_back_to_the_model() -> None:
    def fail(params: Args) -> str:
        raise RuntimeError("internal detail")

    done = define_tool("done", params_type=Args, is_terminal=True, handler=fail)
    model = ScriptedModel([[tool_call("done", {"text": "x"}, id="c1")], "gave up"])
    log = ListLog(model, (done,))
    end = await _loop.run(log, await _started(log, "go"))
    assert end.last_message is not None and end.last_message.data.content == "gave up"
    result = model.requests[1].messages[-1]
    assert result.role == "tool" and "internal detail" not in result.content
