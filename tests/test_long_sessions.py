"""Long sessions under the host's control (spec section 16): the estimate calibrated from what
models report (X1), a refused request compacted and retried (X2), a turn too large for any
window cut to fit (X3)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.conftest import Recorder, echo_tool, open_session, roles
from trimtab import Client, ProviderError, QueueEditError, SessionError
from trimtab._calibration import MAX_RATIO, MIN_RATIO, NONE, observed, overflowed, ratio
from trimtab._compaction import COMPACTION_PROMPT, HANDOFF_PROMPT
from trimtab._state import state_of
from trimtab._window import estimate_tokens
from trimtab.events import Event, SessionContextClearedEvent, UserMessageEvent
from trimtab.providers import ModelRequest, ModelResponse, ToolCall, Usage
from trimtab.store import Lease, MemoryStore
from trimtab.testing import ScriptedModel, tool_call


def estimated(request: ModelRequest) -> int:
    """A request's size by the window's estimate: what the runtime logs for it (X1)."""
    return (
        estimate_tokens(request.messages)
        + sum(len(t.model_dump_json()) for t in request.tools) // 4
    )


def is_summary(request: ModelRequest) -> bool:
    return request.messages[0].content.startswith(COMPACTION_PROMPT[:40])


class Counted:
    """A model whose tokenizer counts `ratio` times the window's estimate, and that refuses a
    request past `limit` of them as a real provider does (`context_length`)."""

    def __init__(
        self, limit: int, ratio: float, reply: Callable[[ModelRequest], Any] | None = None
    ):
        self.limit, self.ratio = limit, ratio
        self.reply = reply or (lambda request: "SUMMARY" if is_summary(request) else "ok")
        self.refused: list[int] = []

    def __call__(self, request: ModelRequest) -> Any:
        tokens = math.ceil(estimated(request) * self.ratio)
        if tokens > self.limit:
            self.refused.append(tokens)
            return ProviderError(
                "context_length",
                f"maximum context length is {self.limit} tokens; the request has {tokens}",
                status_code=400,
            )
        answer = self.reply(request)
        if isinstance(answer, ProviderError):
            return answer
        usage = Usage(input_tokens=tokens, output_tokens=len(str(answer)) // 4 + 1)
        if isinstance(answer, ToolCall):
            return ModelResponse(tool_calls=(answer,), usage=usage, finish_reason="tool_calls")
        return ModelResponse(content=answer, usage=usage, finish_reason="stop")


# --- X1: calibration ---------------------------------------------------------------------


def test_x1_ratio_folds_observations_with_bounded_weight() -> None:
    ratios = observed(NONE, "m", 1_000, 2_000)
    assert ratio(ratios, "m") == 2.0 and ratio(ratios, "other") == 1.0
    ratios = observed(ratios, "m", 1_000, 1_000)  # the second weighs a half
    assert ratio(ratios, "m") == 1.5
    for _ in range(20):  # then a quarter each: it follows a change within a few calls
        ratios = observed(ratios, "m", 1_000, 1_200)
    assert ratio(ratios, "m") == pytest.approx(1.2, abs=0.01)
    # A short request (mostly per-message overhead) moves it in proportion to its size.
    assert ratio(observed(ratios, "m", 100, 300), "m") == pytest.approx(1.2 + 0.025 * 1.8, 0.01)
    assert ratio(observed(NONE, "m", 100, 200), "m") == 2.0  # (the first counts fully)
    assert observed(ratios, "m", 100, 0) == ratios  # a provider that reported nothing
    assert observed(ratios, "m", None, 50) == ratios  # a call logged before calibration
    assert ratio(observed(NONE, "m", 10, 10_000), "m") == MAX_RATIO
    assert ratio(observed(NONE, "m", 10_000, 10), "m") == MIN_RATIO


def test_x1_a_refusal_raises_the_ratio_to_explain_it_and_never_lowers_it() -> None:
    ratios = overflowed(NONE, "m", 1000, 1500)
    assert ratio(ratios, "m") == pytest.approx(1.65)  # 1.1 x the least that explains it
    assert overflowed(ratios, "m", 1000, 1000) == ratios


async def test_x1_estimate_calibrated_from_reported_usage_and_kept_on_resume(
    client: Client,
) -> None:
    """The model counts twice the estimate: after one call the session knows it, compacts
    where the model's count (not the estimate) passes the threshold, and a resume (replay)
    keeps what it learned."""
    counted = Counted(limit=10**6, ratio=2.0)
    model = ScriptedModel(then=counted)
    session = await open_session(client, model, model_limits={"context_window": 4_000})
    prompt = "word " * 800  # ~1,000 tokens by the estimate, 2,000 by the model's count
    await session.send_and_wait(prompt)
    assert session.get_context().token_ratio == pytest.approx(2.0, abs=0.01)
    usage = [e.data for e in await session.get_events() if e.type == "assistant.usage"]
    assert usage[0].estimated_tokens == estimated(model.requests[0])

    rec = Recorder(session)
    await session.send_and_wait(prompt)  # ~2,000 by the estimate: 4,000 by the count
    types = rec.types
    assert "session.compaction_complete" in types
    assert types.index("session.compaction_complete") < types.index("assistant.turn_start")
    assert is_summary(model.requests[1])

    learned = session.get_context().token_ratio
    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=ScriptedModel())
    assert resumed.get_context().token_ratio == learned
    assert state_of(await resumed.get_events()).token_ratio("scripted") == learned


async def test_x1_without_calibration_the_same_session_would_not_compact(client: Client) -> None:
    """The control of the test above: a model that counts as the estimate does."""
    model = ScriptedModel(then=Counted(limit=10**6, ratio=1.0))
    session = await open_session(client, model, model_limits={"context_window": 4_000})
    await session.send_and_wait("word " * 800)
    await session.send_and_wait("word " * 800)
    assert not any(is_summary(r) for r in model.requests)


# --- X2: a refused request --------------------------------------------------------------


async def history(session: Any, counted: Counted, turns: int = 3) -> None:
    """Turns that fill the window to ~1,900 tokens while the model counts as the estimate."""
    for _ in range(turns):
        await session.send_and_wait("fact " * 480)


async def test_x2_refused_request_is_compacted_and_retried_once(client: Client) -> None:
    counted = Counted(limit=3_000, ratio=1.0)
    model = ScriptedModel(then=counted)
    session = await open_session(client, model, model_limits={"context_window": 3_000})
    await history(session, counted)
    counted.ratio = 1.6  # the conversation turns to text the estimate undercounts
    rec = Recorder(session)

    reply = await session.send_and_wait("fact " * 240)

    assert reply is not None and reply.data.content == "ok"
    assert len(counted.refused) == 1
    types = [t for t in rec.types if t != "assistant.message_delta"]
    start = types.index("assistant.turn_start")
    assert types[start + 1 : start + 3] == ["session.warning", "session.compaction_start"]
    assert types.index("session.compaction_complete") < types.index("assistant.message")
    warning = rec.of("session.warning")[0].data
    assert warning.warning_type == "context_length" and warning.token_limit == 3_000
    assert warning.estimated_tokens == estimated(model.requests[-3])  # the refused request
    assert session.get_context().token_ratio >= 1.1 * 3_000 / warning.estimated_tokens - 0.01
    assert [is_summary(r) for r in model.requests[-3:]] == [False, True, False]
    assert not rec.of("session.error")


async def test_x2_compacts_with_automatic_compaction_off(client: Client) -> None:
    """`infinite_sessions.enabled: False` turns off compaction before a call, not the
    recovery from a refusal: the `"compact"` policy still summarises."""
    counted = Counted(limit=3_000, ratio=1.0)
    model = ScriptedModel(then=counted)
    session = await open_session(
        client,
        model,
        model_limits={"context_window": 3_000},
        infinite_sessions={"enabled": False},
    )
    await history(session, counted)
    counted.ratio = 1.6
    reply = await session.send_and_wait("fact " * 240)
    assert reply is not None and reply.data.content == "ok"
    assert len(counted.refused) == 1
    assert [is_summary(r) for r in model.requests[-3:]] == [False, True, False]


async def test_x2_a_second_refusal_ends_the_run(client: Client) -> None:
    refusal = ProviderError("context_length", "too long", status_code=400)
    model = ScriptedModel(["a", "b", refusal, "SUMMARY", refusal])
    session = await open_session(client, model)
    await session.send_and_wait("one")
    await session.send_and_wait("two")
    rec = Recorder(session)
    with pytest.raises(SessionError, match="context_length"):
        await session.send_and_wait("three")
    warnings = [e.data.warning_type for e in rec.of("session.warning")]
    assert warnings[0] == "context_length" and warnings.count("context_length") == 1
    assert rec.types[-2:] == ["session.error", "session.idle"]
    model.assert_done()


async def test_x2_policy_fail_ends_the_run_at_once(client: Client) -> None:
    model = ScriptedModel([ProviderError("context_length", "too long", status_code=400)])
    session = await open_session(client, model, context_overflow="fail")
    rec = Recorder(session)
    with pytest.raises(SessionError, match="context_length"):
        await session.send_and_wait("hello")
    assert not rec.of("session.warning") and len(model.requests) == 1


async def test_x2_policy_drop_drops_the_oldest_turns_without_a_summary(client: Client) -> None:
    counted = Counted(limit=3_000, ratio=1.0)
    model = ScriptedModel(then=counted)
    session = await open_session(
        client, model, model_limits={"context_window": 3_000}, context_overflow="drop"
    )
    await history(session, counted)
    counted.ratio = 1.6
    rec = Recorder(session)
    await session.send_and_wait("fact " * 240)
    assert not any(is_summary(r) for r in model.requests)
    complete = rec.of("session.compaction_complete")[0].data
    assert complete.messages_removed > 0 and complete.summary_content is None
    retried = model.requests[-1].messages
    assert retried[-1].content == "fact " * 240 and len(retried) < len(model.requests[-2].messages)


async def test_x2_the_policy_is_logged_and_kept_on_resume(client: Client) -> None:
    session = await open_session(client, ScriptedModel(), context_overflow="drop")
    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=ScriptedModel())
    assert resumed.config.context_overflow == "drop"
    with pytest.raises(ValueError, match="context_overflow"):
        await open_session(client, ScriptedModel(), context_overflow="retry")


# --- X3: a turn larger than any window ---------------------------------------------------


async def test_x3_a_result_larger_than_the_context_is_cut_to_fit(client: Client) -> None:
    """A tool's result four times the context: the oldest turns go, then the result's text
    is cut from its end (its call and result stay paired), and the run goes on."""
    big = tool_call("echo", {"text": "R" * 32_000}, id="big")
    counted = Counted(limit=2_000, ratio=1.0, reply=lambda r: "ok" if len(r.messages) > 2 else big)
    model = ScriptedModel(then=counted)
    session = await open_session(
        client,
        model,
        echo_tool(),
        model_limits={"context_window": 2_000},
        infinite_sessions={"enabled": False},
        context_overflow="drop",
    )
    rec = Recorder(session)
    reply = await session.send_and_wait("read the big file")
    assert reply is not None and reply.data.content == "ok"
    retried = model.requests[-1].messages
    assert [m.role for m in retried] == ["system", "assistant", "tool"]
    assert retried[1].tool_calls[0].id == retried[2].tool_call_id
    assert retried[2].content.startswith("R" * 1_000)
    assert retried[2].content.endswith("characters cut: the context window could not hold them]")
    assert estimated(model.requests[-1]) <= 2_000 * 0.8
    warnings = [e.data.message for e in rec.of("session.warning")]
    assert any("characters of its newest turn were cut" in text for text in warnings)
    # The log keeps the whole result; only the window holds it cut.
    result = next(e for e in await session.get_events() if e.type == "tool.execution_complete")
    assert result.data.result is not None and len(result.data.result.content) == 32_000


# --- X4: a clear the host makes between runs ---------------------------------------------

SEED = "Reply with exactly FRESH_CONTEXT."


async def test_x4_host_clear_while_idle_commits_with_its_seed_and_runs_it(client: Client) -> None:
    model = ScriptedModel(["one", "two", "FRESH_CONTEXT"])
    session = await open_session(client, model, developer_messages=["DEV"])
    await session.send_and_wait("first")
    await session.send_and_wait("second")
    before = len(await session.get_events())
    rec = Recorder(session)

    result = await session.history.clear_context(SEED)

    assert result.messages_cleared == 4 and result.message_id is not None
    stored = (await session.get_events())[before:]
    assert [e.type for e in stored[:2]] == ["session.context_cleared", "user.message"]
    cleared, seed = stored[:2]
    assert isinstance(cleared, SessionContextClearedEvent) and isinstance(seed, UserMessageEvent)
    assert cleared.data.initial_message == SEED and cleared.context_epoch == 1
    assert (seed.data.content, seed.data.source) == (SEED, "context_cleared")
    assert seed.data.message_id == result.message_id
    await session.wait_idle()
    assert [m.role for m in model.requests[-1].messages] == ["system", "developer", "user"]
    assert model.requests[-1].messages[-1].content == SEED
    assert rec.types.count("session.idle") == 1 and rec.types[-1] == "session.idle"
    assert session.context_epoch == 1
    log = await session.get_events()
    assert [e.data.source for e in log if e.type == "user.message"].count("context_cleared") == 1
    assert [m.content for m in session.window()] == ["SYSTEM", "DEV", SEED, "FRESH_CONTEXT"]


async def test_x4_host_clear_is_waited_for_as_a_send(client: Client) -> None:
    """The seeded run is the host's run: `send_and_wait`-like waiting finds its end by the
    result's message id, here and in a follower's ledger."""
    model = ScriptedModel(["FRESH_CONTEXT"])
    session = await open_session(client, model)
    ledger = session._runner.ledger()
    result = await session.history.clear_context(SEED)
    assert result.message_id is not None
    end = await session._runner.run_end(ledger, result.message_id)
    assert end.last_message is not None and end.last_message.data.content == "FRESH_CONTEXT"


async def test_x4_host_clear_during_a_run_is_refused_and_changes_nothing(client: Client) -> None:
    import asyncio

    started, release = asyncio.Event(), asyncio.Event()

    async def slow(params: Any) -> str:
        started.set()
        await release.wait()
        return "slow done"

    from trimtab import ClearContextError, define_tool

    model = ScriptedModel([tool_call("slow"), "done"])
    session = await open_session(client, model, define_tool("slow", handler=slow))
    await session.send("go")
    await asyncio.wait_for(started.wait(), 10)
    before = await session.get_events()
    # A call is in flight: from outside its handler, the clear is staged for it (C1). A run
    # between its calls, or queued, refuses it:
    release.set()
    await session.wait_idle()
    await session.send("again")  # its run is queued to start: the session is busy
    with pytest.raises(ClearContextError) as refused:
        session.history.clear_context(SEED)
    assert refused.value.code == "run_in_flight"
    await session.wait_idle()
    log = await session.get_events()
    assert not [e for e in log if e.type == "session.context_cleared"]
    assert log[: len(before)] == before


async def test_x4_crash_after_the_host_clear_delivers_its_seed_once() -> None:
    """C10 for the host's clear: the clear and its seed are stored together (the crash keeps
    both, the writer never hears back), and a resume runs the seed exactly once."""
    from trimtab.store import MemoryStore
    from trimtab.testing import FaultyStore

    durable = MemoryStore()
    faulty = FaultyStore(durable)
    async with Client(store=faulty) as doomed:
        session = await open_session(doomed, ScriptedModel(["one"]))
        await session.send_and_wait("first")
        faulty.durable = True
        faulty.crash_at_write = faulty.writes + 1  # the clear's append
        result = session.history.clear_context(SEED)
        with pytest.raises(Exception):  # noqa: B017 (the process "dies" under it)
            await result
        faulty.crash()
    durable._sessions[session.session_id].lease_expires_at = 0.0  # its lease lapsed
    model = ScriptedModel(["FRESH_CONTEXT"])
    async with Client(store=durable) as survivor:
        resumed = await survivor.resume_session(session.session_id, provider=model)
        await resumed.wait_idle()
        log = await resumed.get_events()
    assert [m.content for m in model.requests[0].messages] == ["SYSTEM", SEED]
    seeds = [e for e in log if e.type == "user.message" and e.data.source == "context_cleared"]
    assert len(seeds) == 1 and [e.type for e in log].count("session.context_cleared") == 1
    assert [e.type for e in log].count("assistant.message") == 2


# --- X5: the handoff policy --------------------------------------------------------------


def is_note(request: ModelRequest) -> bool:
    return request.messages[0].content == HANDOFF_PROMPT


def handing(request: ModelRequest) -> str:
    return "NOTE: facts gathered so far." if is_note(request) else "ok"


async def test_x5_past_the_threshold_the_work_is_handed_to_a_fresh_window(
    client: Client,
) -> None:
    counted = Counted(limit=4_000, ratio=1.0, reply=handing)
    model = ScriptedModel(then=counted)
    session = await open_session(
        client, model, model_limits={"context_window": 4_000}, handoff={"threshold": 0.5}
    )
    await history(session, counted, turns=3)  # ~1,900 tokens: below the handoff's 2,000
    assert not any(is_note(r) for r in model.requests)
    rec = Recorder(session)

    reply = await session.send_and_wait("fact " * 200 + "now the last fact please")

    assert reply is not None and reply.data.content == "ok"
    assert [is_note(r) for r in model.requests[-2:]] == [True, False]
    seeded = model.requests[-1].messages
    assert [m.role for m in seeded] == ["system", "user"]
    assert seeded[1].content.startswith("NOTE: facts gathered so far.")
    assert seeded[1].content.endswith("now the last fact please")
    types = [t for t in rec.types if t != "assistant.message_delta"]
    cleared = types.index("session.context_cleared")
    assert types[cleared + 1 : cleared + 3] == ["user.message", "assistant.turn_start"]
    assert "session.compaction_start" not in types
    assert types.count("session.idle") == 1 and session.context_epoch == 1
    log = await session.get_events()
    seeds = [e for e in log if e.type == "user.message" and e.data.source == "context_cleared"]
    assert len(seeds) == 1 and seeds[0].data.content == seeded[1].content
    assert reply.data.originating_message_id == rec.of("user.message")[0].data.message_id


async def test_x5_a_tool_loop_hands_off_with_its_request_and_counts_turns_afresh(
    client: Client,
) -> None:
    """Mid-run, the run's own prompt is what the seed carries; the seeded run counts its
    model calls afresh (C8), and the discovered tools are gone with the window."""
    calls = iter(range(100))

    def reply(request: ModelRequest) -> Any:
        if is_note(request):
            return "NOTE: read 3 chunks."
        if request.messages[-1].role == "user" and "NOTE" in request.messages[-1].content:
            return "finished"
        return tool_call("echo", {"text": "chunk " * 300}, id=f"c{next(calls)}")

    model = ScriptedModel(then=Counted(limit=4_000, ratio=1.0, reply=reply))
    session = await open_session(
        client,
        model,
        echo_tool(),
        model_limits={"context_window": 4_000},
        handoff={"threshold": 0.5},
        max_turns=4,
    )
    reply_event = await session.send_and_wait("Read the chunks")
    assert reply_event is not None and reply_event.data.content == "finished"
    seeded = model.requests[-1].messages
    assert seeded[-1].content.endswith("Read the chunks")
    assert session.context_epoch == 1


async def test_x5_a_note_that_cannot_be_written_falls_back_to_compaction(client: Client) -> None:
    def reply(request: ModelRequest) -> Any:
        if is_note(request):
            return ProviderError("provider_unavailable", "down", status_code=503)
        return "SUMMARY" if is_summary(request) else "ok"

    counted = Counted(limit=4_000, ratio=1.0, reply=reply)
    model = ScriptedModel(then=counted)
    session = await open_session(
        client,
        model,
        model_limits={"context_window": 4_000},
        handoff={"threshold": 0.5},
        infinite_sessions={"threshold": 0.5},
    )
    await history(session, counted, turns=3)
    await session.send_and_wait("fact " * 200)
    assert session.context_epoch == 0
    assert [is_note(model.requests[-3]), is_summary(model.requests[-2])] == [True, True]


async def test_x5_the_policy_is_off_by_default_logged_and_checked(client: Client) -> None:
    plain = await open_session(client, ScriptedModel())
    assert plain.config.handoff is None
    session = await open_session(client, ScriptedModel(), handoff={"threshold": 0.6})
    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=ScriptedModel())
    assert resumed.config.handoff is not None and resumed.config.handoff.threshold == 0.6
    for bad in ({"threshold": 0}, {"threshold": 1.5}, {}):
        with pytest.raises(ValueError, match="handoff"):
            await open_session(client, ScriptedModel(), handoff=bad)


# --- X6: steering ------------------------------------------------------------------------


def gated_tool(started: Any, release: Any) -> Any:
    from trimtab import define_tool

    async def slow(params: Any) -> str:
        started.set()
        await release.wait()
        return "slow done"

    return define_tool("slow", handler=slow)


async def test_x6_immediate_send_enters_the_running_turn_after_its_results(
    client: Client,
) -> None:
    import asyncio

    started, release = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([tool_call("slow", id="s1"), "steered answer"])
    session = await open_session(client, model, gated_tool(started, release))
    rec = Recorder(session)
    first = await session.send("do the slow thing")
    await asyncio.wait_for(started.wait(), 10)

    steer = await session.send("STEER: also mention the weather", mode="immediate")
    assert [m.message_id for m in await session.pending_messages()] == [steer]
    release.set()
    await session.wait_idle()

    assert [(m.role, m.content) for m in model.requests[1].messages][-3:] == [
        ("assistant", ""),
        ("tool", "slow done"),
        ("user", "STEER: also mention the weather"),
    ]
    messages = rec.of("user.message")
    assert [(m.data.source, m.data.message_id) for m in messages] == [
        ("user", first),
        ("immediate", steer),
    ]
    assert rec.types.count("session.idle") == 1 and len(model.requests) == 2
    assert await session.pending_messages() == []
    log = await session.get_events()
    assert state_of(log).run_id is None
    steered = [e for e in log if e.type == "user.message" and e.data.source == "immediate"]
    assert len(steered) == 1 and log.index(steered[0]) > next(
        i for i, e in enumerate(log) if e.type == "tool.execution_complete"
    )


async def test_x6_a_steered_send_is_waited_for_with_the_run_it_joined(client: Client) -> None:
    import asyncio

    started, release = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([tool_call("slow"), "the answer"])
    session = await open_session(client, model, gated_tool(started, release))
    rec = Recorder(session)
    await session.send("go")
    await asyncio.wait_for(started.wait(), 10)
    waiting = asyncio.create_task(session.send_and_wait("and hurry", mode="immediate"))
    await rec.wait_for("pending_messages.modified")  # queued, offered to the run
    release.set()
    reply = await asyncio.wait_for(waiting, 10)
    assert reply is not None and reply.data.content == "the answer"
    assert len(model.requests) == 2


async def test_x6_a_run_that_makes_no_further_call_leaves_it_queued(client: Client) -> None:
    """Sent while the run's last model call is answering: it runs next, as a queued input,
    with its own idle (the run was not to call the model again)."""
    import asyncio

    answering, answer = asyncio.Event(), asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        answering.set()
        await answer.wait()
        return "first answer"

    model = ScriptedModel([slow, "second answer"])
    session = await open_session(client, model)
    rec = Recorder(session)
    await session.send("first")
    await asyncio.wait_for(answering.wait(), 10)
    steer = await session.send("too late to steer", mode="immediate")
    answer.set()
    await session.wait_idle()
    assert rec.types.count("session.idle") == 2
    user = [(m.data.source, m.data.message_id) for m in rec.of("user.message")]
    assert user[1] == ("user", steer)
    assert model.requests[1].messages[-1].content == "too late to steer"


async def test_x6_immediate_on_an_idle_session_is_a_send(client: Client) -> None:
    model = ScriptedModel(["hi"])
    session = await open_session(client, model)
    reply = await session.send_and_wait("hello", mode="immediate")
    assert reply is not None and reply.data.content == "hi"
    assert [e.data.source for e in await session.get_events() if e.type == "user.message"] == [
        "user"
    ]
    with pytest.raises(ValueError, match="mode"):
        await session.send("x", mode="later")  # type: ignore[arg-type]


async def test_x6_a_steering_message_takes_no_typed_result_or_budget(client: Client) -> None:
    """It joins a run that has its own result and budget: asking it for either is refused,
    and nothing is stored."""
    session = await open_session(client, ScriptedModel([]))
    asks: list[dict[str, Any]] = [
        {"output_type": int},
        {"output_schema": {"type": "object"}},
        {"budget": {}},
    ]
    for asked in asks:
        with pytest.raises(ValueError, match="steering"):
            await session.send("x", mode="immediate", **asked)
    assert [e.type for e in await session.get_events()] == ["session.start"]


async def test_x6_clearing_the_queue_takes_a_steering_message_away(client: Client) -> None:
    import asyncio

    started, release = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([tool_call("slow"), "done"])
    session = await open_session(client, model, gated_tool(started, release))
    await session.send("go")
    await asyncio.wait_for(started.wait(), 10)
    steer = await session.send("never mind", mode="immediate")
    assert await session.clear_pending_messages() == [steer]
    release.set()
    await session.wait_idle()
    assert all(m.content != "never mind" for m in model.requests[-1].messages)
    assert len(model.requests) == 2


# --- K20, K21: the queue's steering RPCs ---------------------------------------------------


def user_messages(events: Sequence[Event]) -> list[tuple[str | None, str | None, str]]:
    return [
        (e.data.source, e.data.message_id, e.data.content)
        for e in events
        if isinstance(e, UserMessageEvent)
    ]


async def test_k20_steer_pending_takes_a_queued_message_into_the_running_turn(
    client: Client,
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([tool_call("slow", id="s1"), "steered answer", "a's answer"])
    session = await open_session(client, model, gated_tool(started, release))
    rec = Recorder(session)
    first = await session.send("do the slow thing")
    await asyncio.wait_for(started.wait(), 10)
    a, b = await session.send("a"), await session.send("b: be brief")
    typed = await session.send("typed", output_type=int)
    command = await session.enqueue_command("/cmd")
    for item, code in [
        (command, "not_a_message"),
        (typed, "not_steerable"),
        ("x", "item_not_waiting"),
    ]:
        with pytest.raises(QueueEditError) as refused:
            await session.steer_pending(item)
        assert refused.value.code == code
    await session.remove_pending([typed, command])

    assert await session.steer_pending(b) is True
    assert await session.steer_pending(b) is True  # in the lane already: nothing changes
    pending = [(m.message_id, m.immediate) for m in await session.pending_messages()]
    assert pending == [(a, False), (b, True)]
    release.set()
    await session.wait_idle()

    assert roles(model, 1)[-3:] == [
        ("assistant", ""),
        ("tool", "slow done"),
        ("user", "b: be brief"),
    ]
    log = await session.get_events()
    assert [(s, m) for s, m, _ in user_messages(log)] == [
        ("user", first),
        ("immediate", b),
        ("user", a),
    ]
    assert rec.types.count("session.idle") == 2 and len(model.requests) == 3


async def test_k20_with_no_run_in_flight_nothing_is_steered(client: Client) -> None:
    model = ScriptedModel(["done"])
    session = await open_session(client, model)
    await session.set_drain_paused(True)  # idle, and the message waits
    queued = await session.send("waits")
    assert await session.steer_pending(queued) is False
    assert [(m.message_id, m.immediate) for m in await session.pending_messages()] == [
        (queued, False)
    ]
    await session.set_drain_paused(False)
    await session.wait_idle()
    assert user_messages(await session.get_events()) == [("user", queued, "waits")]


async def test_k21_append_steering_extends_a_steering_message_until_the_run_takes_it(
    client: Client,
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([tool_call("slow"), "steered", "queued answer"])
    session = await open_session(client, model, gated_tool(started, release))
    await session.send("go")
    await asyncio.wait_for(started.wait(), 10)
    queued = await session.send("queued")
    steer = await session.send("STEER", mode="immediate")

    assert not await session.append_steering(steer, "more", expected_prompt="stale")
    assert not await session.append_steering(queued, "more", expected_prompt="queued")
    note = {"type": "note", "text": "seen"}
    assert await session.append_steering(steer, "more", expected_prompt="STEER", attachments=[note])
    # (The inbox holds the new text: `pending_messages` reads it from the store.)
    assert [(m.message_id, m.prompt, m.immediate) for m in await session.pending_messages()] == [
        (queued, "queued", False),
        (steer, "STEER\n\nmore", True),
    ]
    release.set()
    await session.wait_idle()

    assert roles(model, 1)[-1] == ("user", "STEER\n\nmore")
    log = await session.get_events()
    steered = [e for e in log if isinstance(e, UserMessageEvent) and e.data.source == "immediate"]
    assert [(e.data.message_id, e.data.content, e.data.attachments) for e in steered] == [
        (steer, "STEER\n\nmore", [note])
    ]
    assert not await session.append_steering(steer, "late", expected_prompt="STEER\n\nmore")


async def test_k21_a_reworded_steering_message_is_what_the_run_reads(client: Client) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([tool_call("slow"), "steered"])
    session = await open_session(client, model, gated_tool(started, release))
    await session.send("go")
    await asyncio.wait_for(started.wait(), 10)
    steer = await session.send("STEER", mode="immediate")
    assert await session.update_pending(steer, "STEER, reworded")
    release.set()
    await session.wait_idle()
    assert roles(model, 1)[-1] == ("user", "STEER, reworded")
    assert user_messages(await session.get_events())[-1] == ("immediate", steer, "STEER, reworded")


class TurnEndHeld(MemoryStore):
    """Holds the append of the first turn's end until `go_on`, and yields to other tasks
    in every edit of the queue (as a database's round trip does)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding, self.go_on = asyncio.Event(), asyncio.Event()
        self.hold = False

    async def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        lease: Lease | None,
        durable: bool = True,
    ) -> int:
        if self.hold and any(e.type == "assistant.turn_end" for e in events):
            self.hold = False
            self.holding.set()
            await self.go_on.wait()
        return await super().append(session_id, events, lease=lease, durable=durable)

    async def rewrite_inputs(
        self, session_id: str, expected: Sequence[str], inputs: Sequence[tuple[str, str]]
    ) -> bool:
        for _ in range(20):
            await asyncio.sleep(0)
        return await super().rewrite_inputs(session_id, expected, inputs)


async def test_k21_an_append_racing_the_runs_next_call_is_in_what_it_logs_or_refused() -> None:
    """The append waits for the writer while the run stores its turn's end, and gets it
    first: the run's next call takes the lane only once the append is made (X6, K21)."""
    store = TurnEndHeld()
    started, release = asyncio.Event(), asyncio.Event()
    async with Client(store=store) as client:
        model = ScriptedModel([tool_call("slow"), "steered"])
        session = await open_session(client, model, gated_tool(started, release))
        await session.send("go")
        await asyncio.wait_for(started.wait(), 10)
        steer = await session.send("STEER", mode="immediate")
        store.hold = True
        release.set()
        await asyncio.wait_for(store.holding.wait(), 10)
        appending = asyncio.create_task(
            session.append_steering(steer, "more", expected_prompt="STEER")
        )
        await asyncio.sleep(0)  # it waits for the writer
        store.go_on.set()
        appended = await asyncio.wait_for(appending, 10)
        await session.wait_idle()
        logged = user_messages(await session.get_events())[-1]
    assert (appended, logged) == (True, ("immediate", steer, "STEER\n\nmore"))
    assert roles(model, 1)[-1] == ("user", "STEER\n\nmore")


# --- X7: recall --------------------------------------------------------------------------


async def test_x7_recall_finds_what_an_earlier_window_held(client: Client) -> None:
    model = ScriptedModel(
        [
            "noted",
            "FRESH_CONTEXT",
            tool_call("recall", {"query": "zebra CODE"}),
            tool_call("recall", {"query": "FRESH"}),
            "found it",
        ]
    )
    session = await open_session(client, model, recall={"enabled": True})
    await session.send_and_wait("Remember: the secret code is ZEBRA-42.")
    await (await session.history.clear_context(SEED))
    await session.wait_idle()
    assert "ZEBRA" not in " ".join(m.content for m in session.window())

    await session.send_and_wait("What was the code?")

    assert "recall" in [t.name for t in model.requests[2].tools]
    results = [m for m in model.requests[-1].messages if m.role == "tool"]
    log = await session.get_events()
    said = next(e for e in log if e.type == "user.message" and "ZEBRA" in e.data.content)
    assert f"[event {said.id}, user message, epoch 0]" in results[0].content
    assert "the secret code is ZEBRA-42." in results[0].content
    # What the current window holds is not searched: the seed's run is after the base.
    assert results[1].content.startswith("Nothing in the earlier conversation matches")


async def test_x7_recall_searches_what_compaction_took_and_is_off_by_default(
    client: Client,
) -> None:
    plain = ScriptedModel(["a"])
    await (await open_session(client, plain)).send_and_wait("hello")
    assert "recall" not in [t.name for t in plain.requests[0].tools]

    model = ScriptedModel(
        ["one", "two", "three", "SUMMARY", tool_call("recall", {"query": "first-fact"}), "ok"]
    )
    session = await open_session(client, model, recall={"max_results": 1, "max_chars": 60})
    for prompt in ("first-fact: the sky is green " * 5, "second", "third"):
        await session.send_and_wait(prompt)
    await session.history.compact()
    await session.send_and_wait("what was the first fact?")
    result = [m for m in model.requests[-1].messages if m.role == "tool"][0].content
    assert result.startswith("1 excerpt(s)") and "first-fact" in result
    excerpt = result.split("]\n", 1)[1]
    assert len(excerpt) <= 60 + 2  # the bound, and the marks of a cut


def test_x7_recall_bounds_and_orders_its_excerpts() -> None:
    from trimtab._recall import recall
    from trimtab.events import (
        CompactionCompleteData,
        SessionCompactionCompleteEvent,
        UserMessageData,
        UserMessageEvent,
    )

    said = [
        UserMessageEvent(data=UserMessageData(content=f"{n}: apple " + "x" * 500))
        for n in range(10)
    ]
    base = SessionCompactionCompleteEvent(data=CompactionCompleteData(success=True))
    later = UserMessageEvent(data=UserMessageData(content="apple in the window"))
    text = recall([*said, base, later], "APPLE", max_results=3, max_chars=50)
    assert text.count("[event ") == 3
    assert text.index(said[9].id) < text.index(said[8].id) < text.index(said[7].id)
    assert "in the window" not in text
    assert all(len(part.split("]\n", 1)[1]) <= 52 for part in text.split("\n\n")[1:])
    assert recall(said, "   ", 3, 50).startswith("Give a query")


# --- X8: retention -----------------------------------------------------------------------


async def long_history(client: Client) -> tuple[Any, ScriptedModel]:
    """A session with two epochs, a compaction in the second, and a turn after it."""
    model = ScriptedModel(["one", "two", "FRESH", "three", "four", "SUMMARY", "five"])
    session = await open_session(client, model, developer_messages=["DEV"])
    await session.send_and_wait("first")
    await session.send_and_wait("second")
    await (await session.history.clear_context(SEED))
    await session.wait_idle()
    await session.send_and_wait("third")
    await session.send_and_wait("fourth")
    await session.history.compact()
    await session.send_and_wait("fifth")
    await session.set_name("long one")
    return session, model


async def test_x8_prune_keeps_the_window_state_and_metrics_of_the_whole_log(
    client: Client,
) -> None:
    session, _ = await long_history(client)
    before = await session.get_events()
    window, usage, epoch = session.window(), session.usage, session.context_epoch
    metrics = await session.metrics()
    replayed = state_of(before)

    result = await session.history.prune()

    after = await session.get_events()
    base = next(i for i, e in enumerate(before) if e.type == "session.compaction_complete")
    assert result.events_removed == base - 1 and result.position == base
    assert [e.id for e in after] == [
        before[0].id,
        before[base - 1].id,
        *(e.id for e in before[base:]),
    ]
    marker = after[1]
    assert marker.type == "session.pruned" and marker.data.events_pruned == base - 1
    assert [b.type for b in marker.data.bases] == ["session.context_cleared"]
    pruned = state_of(after)
    assert pruned.window() == replayed.window() == window
    assert (pruned.epoch, pruned.usage, pruned.name, pruned.event_count) == (
        epoch,
        usage,
        "long one",
        replayed.event_count,
    )
    assert pruned.config == replayed.config and pruned.ratios == replayed.ratios
    assert await session.metrics() == metrics
    for at, event in enumerate(after):  # the chain is whole (E3)
        assert at == 0 or event.parent_id == after[at - 1].id
    # Nothing new before the base: a second prune removes nothing.
    assert (await session.history.prune()).events_removed == 0

    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=ScriptedModel(["six"]))
    assert resumed.window() == window and resumed.usage == usage and resumed.name == "long one"
    reply = await resumed.send_and_wait("sixth")
    assert reply is not None and reply.data.content == "six"


async def test_x8_a_pruned_log_truncates_forks_and_prunes_again(client: Client) -> None:
    session, _ = await long_history(client)
    await session.history.prune()
    log = await session.get_events()
    base = next(e for e in log if e.type == "session.compaction_complete")
    with pytest.raises(ValueError, match="pruned"):
        await session.history.truncate(base.id)
    fifth = next(e for e in log if e.type == "user.message" and e.data.content == "fifth")
    await session.history.truncate(fifth.id)
    assert session.window()[2].content.startswith("Summary of the conversation")
    assert session.window()[-1].content == "four"

    fork = await session.history.fork()
    assert fork.window() == session.window()
    copied = await fork.get_events()
    assert copied[1].type == "session.pruned" and copied[1].data.position == 2
    assert state_of(copied).event_count == len(copied)


async def test_x8_prune_is_refused_during_a_run_and_on_a_remote_session(client: Client) -> None:
    import asyncio

    from trimtab import PruneError

    session, model = await long_history(client)
    answering, answer = asyncio.Event(), asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        answering.set()
        await answer.wait()
        return "late"

    model.add(slow)
    await session.send("slowly")
    await asyncio.wait_for(answering.wait(), 10)
    with pytest.raises(PruneError) as refused:
        await session.history.prune()
    assert refused.value.code == "run_in_flight"
    answer.set()
    await session.wait_idle()

    # Another runtime's call without the lease: the session is open here.
    from trimtab._retention import prune_log

    store = session._log.store
    with pytest.raises(PruneError) as open_here:
        await prune_log(store, session.session_id)
    assert open_here.value.code == "session_open"
    assert (await session.history.prune()).events_removed > 0


def test_x8_positions_after_a_marker() -> None:
    from trimtab._retention import position_after
    from trimtab.events import PrunedData, SessionPrunedEvent, UserMessageData, UserMessageEvent

    said = UserMessageEvent(data=UserMessageData(content="x"))
    marker = SessionPrunedEvent(data=PrunedData(events_pruned=9, position=10, state={}))
    assert position_after(0, [said, marker, said, said]) == 12
    assert position_after(3, [marker, said]) == 11
    assert position_after(11, [said]) == 12
