"""Budgets and typed results on an engine (spec U7): the worker's run checks the session's
budget from the log as any runtime does; a client on the engine, like any remote session,
takes no typed or budgeted send and cannot set the budget; a process that runs the session
raises it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from tests.conftest import Recorder
from tests.temporal.conftest import StartWorker
from trimtab import BudgetExceededError, Client, TrimtabError, define_tool
from trimtab.events import Budget, SessionErrorEvent
from trimtab.providers import ModelResponse, Usage
from trimtab.testing import ScriptedModel, tool_call

pytestmark = pytest.mark.usefixtures("temporal_server")


class Text(BaseModel):
    text: str


def echo_tool() -> Any:
    return define_tool("echo", params_type=Text, skip_permission=True, handler=lambda p: p.text)


def tool_forever() -> ScriptedModel:
    """A model that answers every request with a call of `echo`: a run only a limit ends."""
    return ScriptedModel(
        then=lambda request: ModelResponse(
            tool_calls=(tool_call("echo", {"text": "x"}, id=f"c{len(request.messages)}"),),
            usage=Usage(input_tokens=100, output_tokens=10),
            finish_reason="tool_calls",
        )
    )


async def test_u7_a_session_budget_ends_a_run_on_an_engine_and_refuses_the_next_send(
    pg_dsn: str, engine: Any, start_worker: StartWorker
) -> None:
    model = tool_forever()
    await start_worker(pg_dsn, provider=model, tools=[echo_tool()])
    async with Client(store=pg_dsn, engine=engine) as client:
        session = await client.create_session(
            provider=model, tools=[echo_tool()], budget=Budget(model_calls=2, warn_at=None)
        )
        seen = Recorder(session)
        with pytest.raises(BudgetExceededError, match="the session used 2 of its model_calls"):
            await session.send_and_wait("go", timeout=20)
        await seen.wait_for("session.idle", timeout=10)

        log = await session.get_events()
        last = log[-1]
        assert isinstance(last, SessionErrorEvent) and last.data.error_type == "budget_exceeded"
        assert sum(e.type == "assistant.usage" for e in log) == 2  # the worker's two calls
        with pytest.raises(BudgetExceededError):
            await session.send("again")  # U5, from the log the client follows
        # What a remote session refuses (OUT1, U3, EN1), before anything is stored.
        with pytest.raises(TrimtabError, match="run by another runtime"):
            await session.set_budget(Budget(model_calls=5))
        with pytest.raises(TrimtabError, match="output_type"):
            await session.send("typed", output_type=int)
        stored = len(await session.get_events())

    # A process that runs the session (no engine) raises the budget, and lets it go.
    async with Client(store=pg_dsn) as owner:
        held = await owner.resume_session(session.session_id, provider=model, tools=[echo_tool()])
        await held.set_budget(Budget(model_calls=3, warn_at=None))
        await held.disconnect()

    async with Client(store=pg_dsn, engine=engine) as client:
        session = await client.resume_session(session.session_id, provider=model)
        with pytest.raises(BudgetExceededError, match="the session used 3 of its model_calls"):
            await session.send_and_wait("again", timeout=20)
        log = await session.get_events()
        assert len(log) > stored
        assert sum(e.type == "assistant.usage" for e in log) == 3  # one more call, then the end
