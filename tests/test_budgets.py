"""Cost and budgets (issue 39; spec U1-U6): a call's cost by its provider's price table, the
sums of a run, an epoch and the session, and budgets that end a run before its next model call
and refuse the next send, all read from the log (so they hold across processes)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import EchoArgs, Recorder, clear_tool, echo_tool, open_session
from tests.test_persistence import copy_log
from trimtab import BudgetExceededError, Client, PermissionHandler, Session, define_tool
from trimtab.events import Budget, Event, SessionStartEvent, Spending
from trimtab.providers import ModelResponse, Usage, make_provider
from trimtab.providers._config import ModelPrice, ProviderConfig
from trimtab.testing import (
    Conversation,
    ConversationMessage,
    ReplayServer,
    ScriptedModel,
    tool_call,
)


def tool_forever(tokens: tuple[int, int] = (100, 10)) -> ScriptedModel:
    """A model that answers every request with a call of `echo`, reporting `tokens`."""
    usage = Usage(input_tokens=tokens[0], output_tokens=tokens[1])
    return ScriptedModel(
        then=lambda request: ModelResponse(
            tool_calls=(tool_call("echo", {"text": "x"}, id=f"c{len(request.messages)}"),),
            usage=usage,
            finish_reason="tool_calls",
        )
    )


def of(log: list[Event], event_type: str) -> list[Any]:
    return [e for e in log if e.type == event_type]


def check_exceeded(log: list[Event], types: list[str], *, scope: str, limit: str) -> None:
    """The run ended in a stored `budget_exceeded` error naming the limit, then one idle;
    every call that started completed (O1)."""
    assert types.count("session.idle") == 1 and types[-2:] == ["session.error", "session.idle"]
    error = log[-1]
    assert error.type == "session.error" and error.data.error_type == "budget_exceeded"
    assert f"the {scope} used" in error.data.message and limit in error.data.message
    starts = [e.data.tool_call_id for e in of(log, "tool.execution_start")]
    assert sorted(starts) == sorted(e.data.tool_call_id for e in of(log, "tool.execution_complete"))


async def exceeded_run(session: Session, **send: Any) -> list[str]:
    """One run that must end in `budget_exceeded`: the event types it delivered."""
    seen = Recorder(session)
    with pytest.raises(BudgetExceededError):
        await session.send_and_wait("go", timeout=30, **send)
    await seen.wait_for("session.idle")
    return seen.types


# --- U1, U2: cost and what was spent -----------------------------------------------------------


PRICES = {"gpt-test": {"input": 2.0, "cached_input": 0.5, "output": 8.0}}


def test_u1_a_price_counts_cached_input_apart() -> None:
    price = ModelPrice.model_validate(PRICES["gpt-test"])
    assert price.cost(1_000_000, 400_000, 100_000) == pytest.approx(1.2 + 0.2 + 0.8)
    # Without a cached price, cached tokens cost what input does.
    assert ModelPrice(input=2, output=8).cost(1_000_000, 400_000, 0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="input"):
        ProviderConfig(type="openai", prices={"m": {"input": -1, "output": 1}})
    with pytest.raises(ValueError, match="cachedinput|cached_input|extra"):
        ProviderConfig(type="openai", prices={"m": {"input": 1, "output": 1, "cache": 1}})


async def test_u1_u2_usage_carries_the_cost_and_usage_info_the_sums() -> None:
    """A real provider over HTTP (the replay server's Chat Completions), its config naming a
    price for the session's model: each `assistant.usage` carries its cost, each
    `session.usage_info` what the run, the epoch and the session spent; a clear starts a new
    epoch's sum and keeps the session's (C9)."""
    recorded = Conversation(
        messages=[
            ConversationMessage.model_validate(m)
            for m in (
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Again"},
                {"role": "assistant", "content": "Hello again!"},
            )
        ]
    )
    server = ReplayServer([recorded])
    config = ProviderConfig(
        type="openai", base_url="http://model.test/v1", api_key="k", prices=PRICES
    )
    provider = make_provider(config, transport=server.transport())
    async with Client(store="memory") as client:
        session = await client.create_session(provider=provider, model="gpt-test")
        seen = Recorder(session)
        await session.send_and_wait("Hi")
        await session.send_and_wait("Again")
        log = await session.get_events()
        other = await client.create_session(provider=provider, model="unpriced")
        await other.send_and_wait("Hi")
        unpriced = of(await other.get_events(), "assistant.usage")[0].data
        other_spent = other.spent

    usages = [e.data for e in of(log, "assistant.usage")]
    expected = [(u.input_tokens * 2.0 + u.output_tokens * 8.0) / 1_000_000 for u in usages]
    assert [u.cost for u in usages] == pytest.approx(expected) and all(expected)
    infos = [e.data for e in seen.of("session.usage_info")]
    assert infos[1].run_spending.cost == pytest.approx(expected[1])  # its own run only
    assert infos[1].session_spending.cost == pytest.approx(sum(expected))
    assert infos[1].session_spending.model_calls == 2
    assert session.spent.cost == pytest.approx(sum(expected))
    assert unpriced.cost is None  # no price: no cost, and counted as such
    assert (other_spent.unpriced_calls, other_spent.cost) == (1, 0.0)
    # The price table is logged with the configuration (no secret), for whoever reads it.
    start = log[0]
    assert isinstance(start, SessionStartEvent) and start.data.config.provider is not None
    assert start.data.config.provider["prices"]["gpt-test"]["cachedInput"] == 0.5


async def test_u2_a_clear_starts_a_new_epochs_sum_and_the_session_keeps_counting() -> None:
    model = ScriptedModel([tool_call("clear_context", {"prompt": "Fresh"}), "fresh reply"])
    async with Client(store="memory") as client:
        session = await open_session(client, model, clear_tool())
        seen = Recorder(session)
        await session.send_and_wait("Clear, please")
    first, second = [e.data for e in seen.of("session.usage_info")]
    assert first.epoch_spending.model_calls == 1 and second.epoch_spending.model_calls == 1
    assert second.session_spending.model_calls == 2
    assert second.run_spending.model_calls == 2  # the seeded run is the same send's (C8)


# --- U3: budgets end the run before its next model call ---------------------------------------


async def test_u3_a_run_budget_crossed_mid_run_ends_it_after_the_model_call(
    client: Client,
) -> None:
    """On every store: the run makes model calls until its budget is reached, the batch of
    the call that reached it still runs, and no further call is made."""
    model = tool_forever(tokens=(100, 10))
    session = await open_session(client, model, echo_tool())
    types = await exceeded_run(session, budget={"total_tokens": 250})
    log = await session.get_events()

    assert len(model.requests) == 3  # 110, 220, 330 tokens: the third reached 250
    check_exceeded(log, types, scope="run", limit="total_tokens budget of 250")
    assert len(of(log, "tool.execution_complete")) == 3  # the third call's batch ran
    assert log[-2].type == "assistant.turn_end"
    # The budget was the run's: the next send runs (and may be given another budget).
    model.add("done")
    reply = await session.send_and_wait("go on")
    assert reply is not None and reply.data.content == "done"


async def test_u3_u5_a_session_budget_ends_the_run_and_refuses_the_next_send_until_raised(
    client: Client,
) -> None:
    model = tool_forever()
    session = await open_session(client, model, echo_tool(), budget={"model_calls": 2})
    types = await exceeded_run(session)
    log = await session.get_events()
    check_exceeded(log, types, scope="session", limit="model_calls budget of 2")
    assert len(model.requests) == 2

    with pytest.raises(BudgetExceededError, match="raise it"):
        await session.send("more")
    assert len(await session.get_events()) == len(log)  # nothing was stored

    await session.set_budget(Budget(model_calls=4))
    assert session.budget == Budget(model_calls=4)
    types = await exceeded_run(session)
    assert len(model.requests) == 4
    await session.set_budget(None)  # no limit at all
    model.add("the end")
    assert (await session.send_and_wait("last")) is not None


async def test_u3_every_limit_is_a_limit(client: Client) -> None:
    for limit, value, requests in (
        ("input_tokens", 150, 2),
        ("output_tokens", 25, 3),
        ("model_calls", 1, 1),
    ):
        model = tool_forever()
        session = await open_session(client, model, echo_tool())
        await exceeded_run(session, budget={limit: value})
        assert len(model.requests) == requests, limit


async def test_u3_a_cost_budget_counts_the_price_table_and_maps_to_ai_credits() -> None:
    """A real provider over HTTP whose model calls a tool: at 2 and 8 per million tokens, the
    first call costs more than the run's cost budget, so no second call is made."""
    call = {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
        {"role": "assistant", "content": "never asked for"},
    ]
    recorded = Conversation(messages=[ConversationMessage.model_validate(m) for m in messages])
    server = ReplayServer([recorded])
    config = ProviderConfig(type="openai", base_url="http://model.test/v1", prices=PRICES)
    provider = make_provider(config, transport=server.transport())
    echo = define_tool("echo", handler=lambda params: "x")
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=provider,
            tools=[echo],
            model="gpt-test",
            on_permission_request=PermissionHandler.approve_all,
        )
        types = await exceeded_run(session, budget={"cost": 1e-9})
        log = await session.get_events()
        await session.set_budget({"cost": 0.25})
        limits = of(await session.get_events(), "session.session_limits_changed")[0].data
    check_exceeded(log, types, scope="run", limit="cost budget")
    assert len(server.requests) == 1
    assert of(log, "assistant.usage")[0].data.cost > 1e-9
    # Copilot clients read the session's cost budget as AI credits (1 credit = 0.01).
    assert limits.session_limits is not None and limits.session_limits.max_ai_credits == 25


async def test_u3_wall_seconds_are_checked_before_each_model_call() -> None:
    async def slow(params: EchoArgs) -> str:
        await asyncio.sleep(0.3)
        return params.text

    model = tool_forever()
    async with Client(store="memory") as client:
        session = await open_session(client, model, define_tool("echo", handler=slow))
        types = await exceeded_run(session, budget={"wall_seconds": 0.2})
        check_exceeded(await session.get_events(), types, scope="run", limit="wall_seconds")
    assert len(model.requests) == 1  # the call was not cut: its tool ran, then no next call


async def test_u3_a_budget_is_checked_when_the_run_starts_too() -> None:
    """A send queued while another run spent the session's budget starts, and ends at once
    (its turn, stored with its message, is closed first: E7)."""
    model = tool_forever()
    async with Client(store="memory") as client:
        session = await open_session(client, model, echo_tool(), budget={"model_calls": 2})
        seen = Recorder(session)
        first = asyncio.ensure_future(session.send_and_wait("one"))
        await seen.wait_for("assistant.turn_start")
        queued = await session.send("two")  # accepted: the budget is not spent yet
        with pytest.raises(BudgetExceededError):
            await first
        await seen.wait_for("session.idle", 2)
        log = await session.get_events()
    second = [e for e in log if e.type == "user.message" and e.data.message_id == queued]
    after = log[log.index(second[0]) :]
    assert [e.type for e in after] in (
        ["user.message", "session.error"],
        ["user.message", "assistant.turn_start", "assistant.turn_end", "session.error"],
    )
    assert len(model.requests) == 2


async def test_u3_invalid_budgets_are_refused_before_anything_is_stored() -> None:
    async with Client(store="memory") as client:
        session = await open_session(client, ScriptedModel())
        for bad in ({"cost": 0}, {"model_calls": 1.5}, {"max_cost": 1}, {"warn_at": 1.5}):
            with pytest.raises(ValueError, match="budget"):
                await session.send("x", budget=bad)
            with pytest.raises(ValueError, match="budget"):
                await session.set_budget(bad)
        with pytest.raises(ValueError, match="budget"):
            await client.create_session(provider=ScriptedModel(), budget={"cost": -1})
        assert len(await session.get_events()) == 1


# --- U3 across processes: the budget is the log's ---------------------------------------------


async def test_u3_a_session_budget_holds_after_a_resume_in_another_client(tmp_path: Path) -> None:
    store = tmp_path / "trimtab.db"
    async with Client(store=store) as first:
        model = tool_forever()
        session = await open_session(first, model, echo_tool(), budget={"model_calls": 3})
        await exceeded_run(session)
        await session.disconnect()
    async with Client(store=store) as second:
        resumed = await second.resume_session(
            session.session_id, provider=tool_forever(), tools=[echo_tool()]
        )
        assert resumed.budget == Budget(model_calls=3)
        with pytest.raises(BudgetExceededError):
            await resumed.send("more")
        await resumed.set_budget({"model_calls": 5})
        await resumed.disconnect()
    async with Client(store=store) as third:
        raised = await third.resume_session(
            session.session_id,
            provider=tool_forever(),
            tools=[echo_tool()],
            on_permission_request=PermissionHandler.approve_all,
        )
        assert raised.budget == Budget(model_calls=5)  # `set_budget` is logged: it replays
        assert raised.spent.model_calls == 3
        await exceeded_run(raised)
        assert raised.spent.model_calls == 5


async def test_u3_a_run_budget_holds_for_a_run_continued_after_a_crash(tmp_path: Path) -> None:
    """The process that ran the run died after its second model call; the run goes on in
    another process, which counts what the first one spent (it is in the log)."""

    async def hang(params: Any) -> str:
        await asyncio.Event().wait()
        return "never"

    async with Client(store="memory") as first:
        crashing = tool_forever()
        session = await open_session(first, crashing, define_tool("echo", handler=_EchoOnce(hang)))
        seen = Recorder(session)
        await session.send("go", budget={"model_calls": 3})
        await seen.wait_for("tool.execution_start", 2)
        crashed = await session.get_events()
        await session.disconnect()
    db = tmp_path / "crash.db"
    await copy_log(crashed, db, session.session_id)

    model = tool_forever()
    async with Client(store=db) as second:
        resumed = await second.resume_session(
            session.session_id,
            continue_pending_work=True,
            provider=model,
            tools=[echo_tool()],
            on_permission_request=PermissionHandler.approve_all,
        )
        seen = Recorder(resumed)
        await seen.wait_for("session.idle")
        log = await resumed.get_events()
    assert len(model.requests) == 1  # calls 1 and 2 were the first process's
    check_exceeded(log, seen.types, scope="run", limit="model_calls budget of 3")


class _EchoOnce:
    """The first call answers; the next hangs (the crash comes during it)."""

    def __init__(self, then: Any) -> None:
        self.calls, self.then = 0, then

    async def __call__(self, params: Any) -> str:
        self.calls += 1
        if self.calls == 1:
            return "echoed"
        result: str = await self.then(params)
        return result


# --- U4: the soft threshold warns once --------------------------------------------------------


async def test_u4_warn_at_logs_one_warning_per_run_and_per_session_budget(client: Client) -> None:
    model = tool_forever(tokens=(100, 0))
    session = await open_session(
        client, model, echo_tool(), budget={"input_tokens": 1_000, "warn_at": 0.5}
    )
    await exceeded_run(session, budget={"model_calls": 4, "warn_at": 0.5})
    log = await session.get_events()
    warnings = [e.data for e in of(log, "session.warning")]
    # The run's: 2 of 4 calls (50%), once; the session's not yet (300 of 1,000 tokens).
    assert [(w.warning_type, w.message) for w in warnings] == [
        ("run_budget", "the run used 2 of its model_calls budget of 4 (50%)")
    ]
    # Before the third call, after the second: the warning comes before the next call.
    index = log.index(of(log, "session.warning")[0])
    assert [e.type for e in log[index - 2 : index + 2]] == [
        "tool.execution_complete",
        "assistant.turn_end",
        "session.warning",
        "assistant.turn_start",
    ]

    await exceeded_run(session, budget={"model_calls": 4, "warn_at": None})
    warnings = [e.data for e in of(await session.get_events(), "session.warning")]
    assert [w.warning_type for w in warnings] == ["run_budget", "session_budget"]
    assert "500 of its input_tokens budget of 1,000 (50%)" in warnings[1].message


async def test_u4_no_warning_below_the_threshold() -> None:
    model = ScriptedModel(["a", "b"])
    async with Client(store="memory") as client:
        session = await open_session(client, model, budget={"model_calls": 10})
        await session.send_and_wait("one")
        await session.send_and_wait("two")
        assert not of(await session.get_events(), "session.warning")


def test_u2_spending_adds_up_a_usage() -> None:
    from trimtab.events import AssistantUsageData

    spent = Spending().plus(
        AssistantUsageData(model="m", input_tokens=10, output_tokens=2, cache_read_tokens=4)
    )
    spent = spent.plus(AssistantUsageData(model="m", input_tokens=1, cost=0.25))
    assert (spent.model_calls, spent.total_tokens, spent.cache_read_tokens) == (2, 13, 4)
    assert (spent.cost, spent.unpriced_calls) == (0.25, 1)
