"""Runs are bounded (issue 14, item 5; spec E5): a model that keeps calling tools ends at the
run's cap, `max_turns` model calls (default 100, a session option), with a stored
`session.error {error_type: "max_turns"}` and one `session.idle`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Recorder, open_session
from trimtab import Client, Session, SessionError, Tool, define_tool
from trimtab.events import DEFAULT_MAX_TURNS, Event
from trimtab.testing import ScriptedModel, tool_call


def tool_forever() -> ScriptedModel:
    """A model that answers every request with a call of the `work` tool."""
    return ScriptedModel(then=lambda request: tool_call("work"))


def work() -> Tool:
    return define_tool("work", handler=lambda params: "worked")


async def capped_run(session: Session, model: ScriptedModel) -> tuple[int, list[str]]:
    """Send one prompt to a session whose model never stops calling tools; the model calls
    the run made and the events it delivered, once its `send_and_wait` raised."""
    before = len(model.requests)
    seen = Recorder(session)
    with pytest.raises(SessionError, match="max_turns"):
        await session.send_and_wait("go", timeout=60)
    await seen.wait_for("session.idle")
    return len(model.requests) - before, seen.types


def check_cap(log: list[Event], types: list[str]) -> None:
    """The run ended in a stored `max_turns` error and one idle, every call completed."""
    assert types.count("session.idle") == 1 and types[-2:] == ["session.error", "session.idle"]
    error = log[-1]
    assert error.type == "session.error" and not error.ephemeral
    assert (error.data.error_type, error.data.retryable) == ("max_turns", True)
    starts = [e.data.tool_call_id for e in log if e.type == "tool.execution_start"]
    completes = [e.data.tool_call_id for e in log if e.type == "tool.execution_complete"]
    assert sorted(starts) == sorted(completes)


async def test_e5_a_model_that_always_calls_a_tool_ends_at_the_default_cap() -> None:
    """Before `max_turns`, such a run never ended: 543 model calls in 30 s, a growing log."""
    model = tool_forever()
    async with Client(store="memory") as client:
        session = await open_session(client, model, work())
        calls, types = await capped_run(session, model)
        log = await session.get_events()

    assert calls == DEFAULT_MAX_TURNS == 100
    check_cap(log, types)


async def test_e5_max_turns_is_a_session_option_logged_and_set_again_on_resume(
    tmp_path: Path,
) -> None:
    """Before `max_turns`, there was no cap to set: the first run never ended."""
    model = tool_forever()
    async with Client(store=tmp_path / "trimtab.db") as client:
        with pytest.raises(ValueError, match="at least 1"):
            await open_session(client, model, work(), max_turns=0)
        assert await client.list_sessions() == []
        session = await open_session(client, model, work(), max_turns=3)
        assert (await capped_run(session, model))[0] == 3
        # Each run counts its own model calls.
        calls, types = await capped_run(session, model)
        assert calls == 3
        check_cap(await session.get_events(), types)
        await session.disconnect()

        resumed = await client.resume_session(session.session_id, provider=model, tools=[work()])
        assert (await capped_run(resumed, model))[0] == 3  # the logged option
        await resumed.disconnect()
        again = await client.resume_session(
            session.session_id, provider=model, tools=[work()], max_turns=5
        )
        assert (await capped_run(again, model))[0] == 5
