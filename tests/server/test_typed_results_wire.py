"""Typed results and budgets over `trimtab serve` (issue 39; spec OUT7, U6): trimtab's remote
client sends a result's JSON Schema and a run's budget with a send, reads the result back as
its type and the budget's errors as `BudgetExceededError`; an official Copilot client's
`sessionLimits` is the session budget's cost in AI credits."""

from __future__ import annotations

import json

import pytest
from copilot import CopilotClient
from copilot.generated.rpc import SessionUpdateOptionsParams
from copilot.generated.session_events import SessionLimitsConfig
from copilot.session import PermissionHandler as OfficialPermissionHandler
from pydantic import BaseModel

from tests.server.conftest import (
    ServerProcess,
    StartServer,
    assistant,
    call,
    conversation,
    provider,
    tool,
    user,
)
from trimtab import BudgetExceededError, PermissionHandler, define_tool
from trimtab.events import Budget, Event, SessionStartEvent
from trimtab.store import open_store
from trimtab.testing import ReplayServer


class City(BaseModel):
    town: str
    population: int


INVALID = "Invalid tool arguments:\n(root): 'population' is a required property"
"""What the server tells a model whose result lacks a field (its JSON Schema's check)."""


async def logged(server: ServerProcess, session_id: str) -> list[Event]:
    store = open_store(server.store)
    try:
        return await store.read(session_id)
    finally:
        await store.close()


async def test_out7_the_remote_client_gets_the_typed_result_checked_by_the_server(
    start_server: StartServer,
) -> None:
    recorded = conversation(
        user("A city."),
        assistant(None, call("c1", "final_result", town="Oslo")),
        tool("c1", INVALID),
        assistant(None, call("c2", "final_result", town="Oslo", population=7)),
    )
    server = start_server()
    async with ReplayServer([recorded]) as model, server.remote() as client:
        session = await client.create_session(provider=provider(model))
        city = await session.send_and_wait("A city.", output_type=City, timeout=30)
        assert city == City(town="Oslo", population=7)
        # The result is in the log, where any client reads it back.
        assert await session.output(output_type=City) == city
        assert len(model.requests) == 2
        body = model.requests[0]
        assert body["tool_choice"] == "required"
        assert body["tools"][0]["function"]["parameters"]["required"] == ["town", "population"]


async def test_u6_a_runs_budget_goes_with_its_send_and_its_error_comes_back_typed(
    start_server: StartServer,
) -> None:
    looping = conversation(
        user("go"),
        assistant(None, call("c1", "echo", text="a")),
        tool("c1", "a"),
        assistant(None, call("c2", "echo", text="b")),
        tool("c2", "b"),
        assistant("never reached"),
    )
    server = start_server()
    async with ReplayServer([looping]) as model, server.remote() as client:
        session = await client.create_session(
            provider=provider(model),
            tools=[define_tool("echo", handler=lambda params: params["text"])],
            on_permission_request=PermissionHandler.approve_all,
        )
        with pytest.raises(BudgetExceededError, match="model_calls budget of 2"):
            await session.send_and_wait("go", budget=Budget(model_calls=2), timeout=30)
        assert len(model.requests) == 2

        # The session's own budget: set over the wire, and a spent one refuses a send.
        await session.set_budget({"model_calls": 2})
        with pytest.raises(BudgetExceededError, match="raise it"):
            await session.send("more")
        await session.set_budget(None)
    log = await logged(server, session.session_id)
    changes = [e.data for e in log if e.type == "session.session_limits_changed"]
    assert [c.budget for c in changes] == [Budget(model_calls=2), None]
    assert [e.data.content for e in log if e.type == "user.message"] == ["go"]


async def test_u6_an_official_clients_session_limits_are_the_budgets_cost_in_ai_credits(
    shared_server: ServerProcess,
) -> None:
    official = CopilotClient(connection=shared_server.connection(), log_level="warning")
    await official.start()
    try:
        session = await official.create_session(
            provider={"type": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key": "k"},
            on_permission_request=OfficialPermissionHandler.approve_all,
            session_limits={"max_ai_credits": 250},
        )
        updated = await session.rpc.options.update(
            SessionUpdateOptionsParams(session_limits=SessionLimitsConfig(max_ai_credits=40))
        )
        assert updated.success
        session_id = session.session_id
        await session.disconnect()
    finally:
        await official.force_stop()

    log = await logged(shared_server, session_id)
    start = log[0]
    assert isinstance(start, SessionStartEvent)
    assert start.data.config.budget == Budget(cost=2.5)  # 250 credits of 0.01
    [change] = [e for e in log if e.type == "session.session_limits_changed"]
    assert change.data.budget == Budget(cost=0.4)
    # Dumped as a Copilot client reads the event: `sessionLimits.maxAiCredits`.
    wire = json.loads(change.model_dump_json(by_alias=True, exclude_none=True))
    assert wire["data"]["sessionLimits"] == {"maxAiCredits": 40}
