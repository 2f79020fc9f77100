"""Context operations beyond clearing: compaction, truncation, fork, handoff, token accounting,
deferred tools and tool search."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Recorder, clear_tool, echo_tool, open_session, roles
from trimtab import (
    Client,
    PermissionHandler,
    Session,
    Tool,
    ToolInvocation,
    TrimtabError,
    define_tool,
)
from trimtab._compaction import COMPACTION_PROMPT, HANDOFF_PROMPT, SUMMARY_PREFIX
from trimtab._state import state_of
from trimtab._window import estimate_tokens
from trimtab.events import ModelLimits
from trimtab.providers import ModelRequest
from trimtab.providers._limits import limits_for
from trimtab.testing import ScriptedModel, tool_call

SEED = "Reply with exactly FRESH_CONTEXT."


def is_compaction(request: ModelRequest) -> bool:
    return request.messages[0].content.startswith(COMPACTION_PROMPT[:40])


async def chat(session: Any, *prompts: str) -> None:
    for prompt in prompts:
        await session.send_and_wait(prompt)


async def reopen(client: Client, session: Session, model: ScriptedModel, *tools: Tool) -> Session:
    """Disconnect `session` and resume it, with the same model and tools, approving all."""
    await session.disconnect()
    return await client.resume_session(
        session.session_id,
        provider=model,
        tools=list(tools),
        on_permission_request=PermissionHandler.approve_all,
    )


async def test_compact_summarises_older_messages_and_keeps_the_newest(client: Client) -> None:
    long = "a long answer, " * 40
    model = ScriptedModel([long, long, "three", "THE SUMMARY", "four"])
    session = await open_session(client, model, developer_messages=["DEV"])
    rec = Recorder(session)
    await chat(session, "first", "second", "third")
    before_log = await session.get_events()

    result = await session.history.compact("mention the numbers")

    assert result.success and result.summary == "THE SUMMARY"
    assert result.messages_removed > 0 and result.tokens_removed > 0
    request = model.requests[3]
    assert request.tools == () and "Also: mention the numbers" in request.messages[0].content
    assert "[user] first" in request.messages[1].content
    assert rec.types[-4:] == [
        "session.compaction_start",
        "assistant.usage",
        "session.usage_info",
        "session.compaction_complete",
    ]
    complete = rec.of("session.compaction_complete")[0].data
    assert (complete.messages_removed, complete.summary_content) == (
        result.messages_removed,
        "THE SUMMARY",
    )
    window = session.window()
    assert [m.role for m in window[:3]] == ["system", "developer", "user"]
    assert window[2].content == SUMMARY_PREFIX + "THE SUMMARY"
    assert window[-1].content == "three"
    await session.send_and_wait("fourth")
    assert roles(model, 4)[2][1].startswith(SUMMARY_PREFIX)
    assert (await session.get_events())[: len(before_log)] == before_log


async def test_compaction_survives_resume_and_a_later_clear(client: Client) -> None:
    model = ScriptedModel(
        ["a", "b", "SUMMARY", tool_call("clear_context", {"prompt": SEED}), "FRESH"]
    )
    session = await open_session(client, model, clear_tool())
    await chat(session, "first", "second")
    await session.history.compact()
    compacted = session.window()
    resumed = await reopen(client, session, model, clear_tool())
    assert resumed.window() == compacted
    reply = await resumed.send_and_wait("clear now")
    assert reply is not None and reply.data.content == "FRESH"
    assert roles(model, 4) == [("system", "SYSTEM"), ("user", SEED)]
    types = [e.type for e in await resumed.get_events()]
    assert types.index("session.compaction_complete") < types.index("session.context_cleared")


async def test_compact_with_nothing_to_compact_reports_it(client: Client) -> None:
    session = await open_session(client, ScriptedModel())
    result = await session.history.compact()
    assert not result.success and result.messages_removed == 0


async def test_compact_refuses_instructions_that_are_not_text(client: Client) -> None:
    session = await open_session(client, ScriptedModel())
    before = await session.get_events()
    with pytest.raises(ValueError, match="custom_instructions"):
        await session.history.compact(custom_instructions=5)  # type: ignore[arg-type]
    assert await session.get_events() == before


async def test_truncate_forgets_the_event_and_after_but_the_log_keeps_them(client: Client) -> None:
    model = ScriptedModel(["one", "two", "three", "two again"])
    session = await open_session(client, model)
    await chat(session, "first", "second", "third")
    events = await session.get_events()
    second = next(e for e in events if e.type == "user.message" and e.data.content == "second")

    result = await session.history.truncate(second.id)

    assert result.events_removed == len(events) - events.index(second)
    assert [m.content for m in session.window()] == ["SYSTEM", "first", "one"]
    assert (await session.get_events())[: len(events)] == events
    await session.send_and_wait("second, differently")
    assert roles(model, 3)[1:] == [
        ("user", "first"),
        ("assistant", "one"),
        ("user", "second, differently"),
    ]
    await session.disconnect()
    resumed = await client.resume_session(session.session_id, provider=ScriptedModel())
    assert [m.content for m in resumed.window()][-1] == "two again"


async def test_truncate_across_a_clear_restores_the_earlier_window(client: Client) -> None:
    model = ScriptedModel(["one", tool_call("clear_context", {"prompt": SEED}), "FRESH"])
    session = await open_session(client, model, clear_tool())
    await chat(session, "first", "please clear")
    assert [m.content for m in session.window()] == ["SYSTEM", SEED, "FRESH"]
    events = await session.get_events()
    clear_request = next(
        e for e in events if e.type == "user.message" and e.data.content == "please clear"
    )
    await session.history.truncate(clear_request.id)
    assert [m.content for m in session.window()] == ["SYSTEM", "first", "one"]


async def test_truncate_rejects_unknown_ids_and_calls_from_a_tool(client: Client) -> None:
    errors: list[str] = []

    async def handler(params: Any, invocation: ToolInvocation) -> str:
        try:
            await invocation.session.history.truncate("whatever")
        except TrimtabError as exc:
            errors.append(str(exc))
        return "ok"

    model = ScriptedModel([tool_call("t"), "done"])
    session = await open_session(client, model, define_tool("t", handler=handler))
    await session.send_and_wait("go")
    assert errors and "inside a handler or hook" in errors[0]
    with pytest.raises(ValueError, match="no event"):
        await session.history.truncate("no-such-event")
    with pytest.raises(ValueError, match="no event"):
        await session.history.truncate((await session.get_events())[0].id)


async def test_fork_copies_the_log_under_a_new_id(client: Client) -> None:
    model = ScriptedModel(["one", "two", "fork reply", "original reply"])
    session = await open_session(client, model, echo_tool())
    await chat(session, "first", "second")
    events = await session.get_events()
    second = next(e for e in events if e.type == "user.message" and e.data.content == "second")

    fork = await session.history.fork(second.id)

    assert fork.session_id != session.session_id
    fork_events = await fork.get_events()
    assert (
        fork_events[0].type == "session.start"
        and fork_events[0].data.forked_from == session.session_id
    )
    copied = events[1 : events.index(second)]
    # Copies, not the same events: new ids (unique in the store), the same contents.
    assert [e.type for e in fork_events[1:]] == [e.type for e in copied]
    assert [e.data for e in fork_events[1:]] == [e.data for e in copied]
    assert not {e.id for e in fork_events} & {e.id for e in events}
    assert all(b.parent_id == a.id for a, b in zip(fork_events, fork_events[1:], strict=False))
    assert [m.content for m in fork.window()] == ["SYSTEM", "first", "one"]
    await fork.send_and_wait("in the fork")
    await session.send_and_wait("in the original")
    assert roles(model, 3)[-2:] == [("assistant", "two"), ("user", "in the original")]
    whole = await session.history.fork()
    assert whole.window() == session.window()


async def test_summarize_for_handoff_leaves_the_window_alone(client: Client) -> None:
    model = ScriptedModel(["one", "# Handoff\nAll done."])
    session = await open_session(client, model)
    await session.send_and_wait("first")
    window = session.window()
    note = await session.history.summarize_for_handoff()
    assert note == "# Handoff\nAll done."
    assert model.requests[1].messages[0].content == HANDOFF_PROMPT
    assert session.window() == window


async def test_get_context_usage_info_and_usage_totals(client: Client) -> None:
    model = ScriptedModel(["a reply", "another"])
    session = await open_session(client, model, echo_tool(), model_limits={"context_window": 5000})
    rec = Recorder(session)
    await chat(session, "hello there", "again")
    context = session.get_context()
    assert context.token_limit == 5000
    assert [m.message.role for m in context.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert context.total_tokens == context.tools_tokens + sum(m.tokens for m in context.messages)
    assert context.tools_tokens > 0
    info = rec.of("session.usage_info")
    assert len(info) == 2 and info[0].ephemeral and info[0].data.token_limit == 5000
    usage = [e.data for e in await session.get_events() if e.type == "assistant.usage"]
    assert session.usage.input_tokens == sum(u.input_tokens or 0 for u in usage) > 0


async def test_usage_info_sizes_the_window_each_call_sends(client: Client) -> None:
    """Each call's `assistant.usage` logs the estimate of the very request the model got
    (spec §6, token accounting; X1), across tool turns, a compaction (a new base), a
    truncation and a resume (the window is kept as a running total, not summed over the
    conversation at every call); `session.usage_info` is that estimate, calibrated by what the
    model reported before the call."""
    model = ScriptedModel(
        [tool_call("echo", {"text": "x" * 50}), "after the tool", "b", "SUMMARY", "c", "d", "e"]
    )
    session = await open_session(client, model, echo_tool(), developer_messages=["DEV"])
    rec = Recorder(session)
    await chat(session, "first " * 30, "second")
    await session.history.compact()
    await chat(session, "third")
    third = [e for e in await session.get_events() if e.type == "user.message"][-1]
    await session.history.truncate(third.id)
    await chat(session, "fourth")
    resumed = await reopen(client, session, model, echo_tool())
    rec_resumed = Recorder(resumed)
    await chat(resumed, "fifth")

    sent = [
        estimate_tokens(r.messages) + sum(len(t.model_dump_json()) for t in r.tools) // 4
        for r in model.requests
    ]
    infos = [*rec.of("session.usage_info"), *rec_resumed.of("session.usage_info")]
    assert len(model.requests) == 7
    log = await resumed.get_events()
    assert [e.data.estimated_tokens for e in log if e.type == "assistant.usage"] == sent
    ratios = [
        state_of(log[:index]).token_ratio(event.data.model)
        for index, event in enumerate(log)
        if event.type == "assistant.usage"
    ]
    assert [e.data.current_tokens for e in infos] == [
        round(size * ratio) for size, ratio in zip(sent, ratios, strict=True)
    ]


def test_model_limits_table_and_override() -> None:
    assert limits_for("gpt-4.1-mini").context_window == 1_047_576
    assert limits_for("openai/gpt-4o-2024-08-06").max_output_tokens == 16_384
    assert limits_for("claude-sonnet-4-5").context_window == 200_000
    assert limits_for("something-new") == ModelLimits()
    assert limits_for("gpt-4o", ModelLimits(context_window=10)).context_window == 10


LIMIT = 1_200


def responder(replies: list[str]) -> Any:
    """A scripted model step that summarises compaction requests and answers the others."""

    def answer(request: ModelRequest) -> str:
        if is_compaction(request):
            return "SUMMARY: the user sent numbered paragraphs."
        replies.append("ok")
        return f"ok {len(replies)}"

    return answer


async def test_a_long_session_never_overflows_and_loses_nothing(client: Client) -> None:
    replies: list[str] = []
    model = ScriptedModel(then=responder(replies))
    session = await open_session(
        client, model, model_limits={"context_window": LIMIT, "max_output_tokens": 200}
    )
    paragraph = "lorem ipsum dolor sit amet " * 12
    for i in range(25):
        await session.send_and_wait(f"paragraph {i}: {paragraph}")
    sizes = [estimate_tokens(r.messages) for r in model.requests]
    assert max(sizes) <= LIMIT
    assert any(is_compaction(r) for r in model.requests)
    log = await session.get_events()
    sent = [e.data.content for e in log if e.type == "user.message"]
    assert sent == [f"paragraph {i}: {paragraph}" for i in range(25)]
    assert sum(e.type == "assistant.message" for e in log) == 25


async def test_e7_auto_compaction_comes_between_a_message_and_its_turn(client: Client) -> None:
    """A run's first turn starts in the append of its message only when the window needs no
    fitting; otherwise the compaction is logged between them."""
    model = ScriptedModel(then=responder([]))
    session = await open_session(
        client, model, model_limits={"context_window": LIMIT, "max_output_tokens": 200}
    )
    for i in range(12):
        await session.send_and_wait(f"paragraph {i}: " + "lorem ipsum " * 40)
    log = [e.type for e in await session.get_events()]
    compactions = [i for i, kind in enumerate(log) if kind == "session.compaction_start"]
    assert compactions
    for at in compactions:
        assert log[at - 1] == "user.message"
        done = log.index("session.compaction_complete", at)
        assert "assistant.turn_start" not in log[at:done]
        assert log[done + 1] == "assistant.turn_start"


class Answers:
    """A scripted model step: compaction requests get a summary (or fail, `failing`), the
    others `ok N`; and the check of what every answered request held (spec H1)."""

    def __init__(self, *, failing: bool = False) -> None:
        self.failing = failing
        self.replies: list[str] = []

    def __call__(self, request: ModelRequest) -> str:
        from trimtab import ProviderError

        if is_compaction(request):
            if self.failing:
                raise ProviderError("provider_unavailable", "down")
            return "SUMMARY: the user sent numbered paragraphs."
        self.replies.append(f"ok {len(self.replies) + 1}")
        return self.replies[-1]

    def assert_newest_kept(self, model: ScriptedModel, prompts: list[str]) -> None:
        """Each run's request ends with its prompt, and holds the newest of the conversation
        in order (after a summary): what compaction took away is the oldest."""
        answered = [r for r in model.requests if not is_compaction(r)]
        assert len(answered) == len(prompts)
        for run, request in enumerate(answered):
            sent = [(m.role, m.content) for m in request.messages if m.role != "system"]
            if sent and sent[0][1].startswith(SUMMARY_PREFIX):
                sent = sent[1:]
            whole = [
                message
                for prompt, reply in zip(
                    prompts[: run + 1], [*self.replies[:run], None], strict=True
                )
                for message in (("user", prompt), ("assistant", reply))
                if message[1] is not None
            ]
            assert sent and sent[-1] == ("user", prompts[run]), f"run {run} was not asked"
            assert sent == whole[len(whole) - len(sent) :], f"run {run}: not the newest"


async def test_h1_a_failed_summary_drops_the_oldest_turns_with_a_warning(client: Client) -> None:
    answers = Answers(failing=True)
    model = ScriptedModel(then=answers)
    session = await open_session(
        client, model, model_limits={"context_window": LIMIT, "max_output_tokens": 200}
    )
    rec = Recorder(session)
    prompts = [f"paragraph {i}: " + "word " * 120 for i in range(12)]
    for prompt in prompts:
        await session.send_and_wait(prompt)
    warnings = rec.of("session.warning")
    assert warnings and "dropped" in warnings[0].data.message
    assert max(estimate_tokens(r.messages) for r in model.requests if not is_compaction(r)) <= LIMIT
    answers.assert_newest_kept(model, prompts)


@pytest.mark.parametrize("failing", [False, True], ids=["summarised", "summary-failed"])
async def test_h1_a_window_still_too_large_drops_its_oldest_turns(
    client: Client, failing: bool
) -> None:
    # A system message that leaves little room: what compaction keeps does not fit, and
    # whole turns go, the oldest first (the summary with them).
    answers = Answers(failing=failing)
    model = ScriptedModel(then=answers)
    session = await open_session(
        client,
        model,
        system_message="S" * 3_300,
        model_limits={"context_window": LIMIT, "max_output_tokens": 200},
    )
    rec = Recorder(session)
    prompts = [f"question {i}: " + "word " * 45 for i in range(8)]
    for prompt in prompts:
        await session.send_and_wait(prompt)
    assert any("still too large" in w.data.message for w in rec.of("session.warning"))
    answers.assert_newest_kept(model, prompts)


@pytest.mark.parametrize("failing", [False, True], ids=["summarised", "summary-failed"])
async def test_h1_a_prompt_over_the_keep_share_is_never_summarised(
    client: Client, failing: bool
) -> None:
    answers = Answers(failing=failing)
    model = ScriptedModel(then=answers)
    session = await open_session(
        client, model, model_limits={"context_window": LIMIT, "max_output_tokens": 200}
    )
    prompts = [f"long question {i}: " + "word " * 250 for i in range(5)]  # each > 20%
    for prompt in prompts:
        await session.send_and_wait(prompt)
    assert any(is_compaction(r) for r in model.requests)
    answers.assert_newest_kept(model, prompts)


@pytest.mark.parametrize("failing", [False, True], ids=["nothing-fits", "summary-failed"])
async def test_h1_compaction_never_leaves_the_model_no_conversation(
    client: Client, failing: bool
) -> None:
    # A tool result too large for the keep share, and for the summary's own request: with no
    # summary, the newest turn stays (the model used to be asked with no conversation).
    result = "result " * 500
    model = ScriptedModel([tool_call("big", id="c1")], then=Answers(failing=failing))
    session = await open_session(
        client,
        model,
        define_tool("big", handler=lambda params: result),
        model_limits={"context_window": LIMIT, "max_output_tokens": 200},
    )
    await session.send_and_wait("go " + "word " * 150)
    after = [r for r in model.requests if not is_compaction(r)][1]
    assert [(m.role, m.content) for m in after.messages[-2:]] == [
        ("assistant", ""),
        ("tool", result),
    ]
    assert "session.compaction_complete" in [e.type for e in await session.get_events()]


async def test_auto_compaction_can_be_disabled(client: Client) -> None:
    model = ScriptedModel(["ok"] * 6)
    session = await open_session(
        client, model, model_limits={"context_window": 300}, infinite_sessions={"enabled": False}
    )
    for i in range(6):
        await session.send_and_wait(f"{i} " + "word " * 60)
    assert not any(is_compaction(r) for r in model.requests)


def many_tools(count: int) -> list[Any]:
    return [
        define_tool(
            f"tool_{i}", description=f"Does thing number {i}", handler=lambda p, i=i: f"result {i}"
        )
        for i in range(count)
    ] + [
        define_tool(
            "weather_forecast",
            description="Get the weather forecast for a city",
            handler=lambda p: "sunny",
        )
    ]


async def test_deferred_tools_are_found_with_tool_search(client: Client) -> None:
    model = ScriptedModel(
        [
            tool_call("weather_forecast"),
            tool_call("tool_search", {"query": "weather forecast"}),
            tool_call("weather_forecast"),
            "It is sunny.",
        ]
    )
    tools = [*many_tools(31), clear_tool()]
    session = await open_session(client, model, *tools)
    rec = Recorder(session)
    reply = await session.send_and_wait("What is the weather?")
    assert reply is not None and reply.data.content == "It is sunny."
    first = {t.name for t in model.requests[0].tools}
    assert first == {"clear_context", "tool_search"}
    assert [e.data.outcome for e in rec.of("tool.execution_complete")] == [
        "failure",
        "success",
        "success",
    ]
    assert "not loaded" in rec.of("tool.execution_complete")[0].data.error.message
    assert "weather_forecast" in {t.name for t in model.requests[2].tools}
    assert "weather_forecast" not in {t.name for t in model.requests[1].tools}
    model.add("again")
    await session.send_and_wait("next run")
    assert "weather_forecast" not in {t.name for t in model.requests[4].tools}


async def test_few_tools_or_search_disabled_means_nothing_is_deferred(client: Client) -> None:
    model = ScriptedModel(["a", "b"])
    few = await open_session(client, model, *many_tools(5))
    await few.send_and_wait("hi")
    assert len(model.requests[0].tools) == 6
    off = await open_session(client, model, *many_tools(40), tool_search={"enabled": False})
    await off.send_and_wait("hi")
    assert len(model.requests[1].tools) == 41 and "tool_search" not in {
        t.name for t in model.requests[1].tools
    }


async def test_tool_search_can_be_overridden_and_clashes_are_refused(client: Client) -> None:
    def my_search(params: Any) -> Any:
        from trimtab import ToolResult

        return ToolResult(text_result_for_llm="found tool_3", tool_references=["tool_3"])

    custom = define_tool(
        "tool_search", handler=my_search, overrides_built_in_tool=True, skip_permission=True
    )
    model = ScriptedModel([tool_call("tool_search", {"q": "x"}), tool_call("tool_3"), "done"])
    session = await open_session(client, model, *many_tools(31), custom)
    rec = Recorder(session)
    await session.send_and_wait("go")
    assert [e.data.outcome for e in rec.of("tool.execution_complete")] == ["success", "success"]
    with pytest.raises(ValueError, match="overrides_built_in_tool"):
        await open_session(client, ScriptedModel(), define_tool("tool_search", handler=my_search))


async def test_seed_scenario_is_unaffected_by_deferred_tools(client: Client) -> None:
    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH_CONTEXT"])
    session = await open_session(client, model, *many_tools(40), clear_tool())
    reply = await session.send_and_wait("clear please")
    assert reply is not None and reply.data.content == "FRESH_CONTEXT"
    assert roles(model, 1) == [("system", "SYSTEM"), ("user", SEED)]
    assert {t.name for t in model.requests[1].tools} == {"clear_context", "tool_search"}
