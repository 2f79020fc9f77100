"""Spec sections 1 and 2: tool outcomes (O1, O2) and terminal tools (T1-T5), permissions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from tests.conftest import EchoArgs, Recorder, clear_tool, echo_tool, open_session, roles
from trimtab import (
    Client,
    PermissionDecision,
    PermissionHandler,
    ToolError,
    ToolInvocation,
    ToolResult,
    define_tool,
)
from trimtab.events import PermissionRequestData
from trimtab.testing import ScriptedModel, tool_call


def done_tool(**options: Any) -> Any:
    return define_tool(
        "done", description="Finish", is_terminal=True, handler=lambda p: "finished", **options
    )


async def test_t1_terminal_success_ends_the_run_without_another_model_call(client: Client) -> None:
    model = ScriptedModel([tool_call("done")])
    session = await open_session(client, model, done_tool())
    rec = Recorder(session)
    reply = await session.send_and_wait("finish")
    assert len(model.requests) == 1
    assert reply is not None and reply.data.content == "" and reply.data.tool_requests
    assert rec.types[-3:] == ["tool.execution_complete", "assistant.turn_end", "session.idle"]


@pytest.mark.parametrize(
    ("handler", "arguments", "outcome"),
    [
        (lambda p: (_ for _ in ()).throw(ToolError("nope")), {}, "failure"),
        (lambda p: ToolResult(text_result_for_llm="bad", result_type="failure"), {}, "failure"),
        (lambda p: "ok", "{not json", "invalid_arguments"),
        (lambda p: ToolResult(text_result_for_llm="no", result_type="denied"), {}, "denied"),
    ],
)
async def test_t2_terminal_tool_that_does_not_succeed_goes_back_to_the_model(
    client: Client, handler: Any, arguments: Any, outcome: str
) -> None:
    tool = define_tool("done", is_terminal=True, handler=handler)
    model = ScriptedModel([tool_call("done", arguments), "recovered"])
    session = await open_session(client, model, tool)
    rec = Recorder(session)
    reply = await session.send_and_wait("finish")
    assert [e.data.outcome for e in rec.of("tool.execution_complete")] == [outcome]
    assert reply is not None and reply.data.content == "recovered"
    assert roles(model, 1)[-1][0] == "tool"


async def test_t2_terminal_tool_denied_by_permission_goes_back_to_the_model(client: Client) -> None:
    model = ScriptedModel([tool_call("done"), "ok, not done"])
    session = await open_session(
        client, model, done_tool(), on_permission_request=PermissionHandler.deny_all
    )
    reply = await session.send_and_wait("finish")
    assert reply is not None and reply.data.content == "ok, not done"
    assert roles(model, 1)[-1] == (
        "tool",
        "Permission denied and could not request permission from user",
    )


async def test_t2_terminal_tool_timeout_goes_back_to_the_model(client: Client) -> None:
    async def slow(params: Any) -> str:
        await asyncio.sleep(10)
        return "late"

    model = ScriptedModel([tool_call("done"), "it timed out"])
    session = await open_session(
        client, model, define_tool("done", is_terminal=True, timeout=0.05, handler=slow)
    )
    reply = await session.send_and_wait("finish")
    assert reply is not None and reply.data.content == "it timed out"
    assert "timed out" in roles(model, 1)[-1][1]


async def test_t3_batch_runs_concurrently_and_results_keep_request_order(client: Client) -> None:
    order: list[str] = []

    async def slow(params: EchoArgs) -> str:
        await asyncio.sleep(0.05)
        order.append("slow")
        return "slow result"

    def fast(params: Any) -> str:
        order.append("done")
        return "finished"

    tools = [
        define_tool("slow", params_type=EchoArgs, handler=slow),
        define_tool("done", is_terminal=True, handler=fast),
    ]
    model = ScriptedModel([[tool_call("slow", {"text": "a"}), tool_call("done")], "next run"])
    session = await open_session(client, model, *tools)
    rec = Recorder(session)
    await session.send_and_wait("go")
    assert order == ["done", "slow"]
    assert [e.data.tool_name for e in rec.of("tool.execution_complete")] == ["done", "slow"]
    assert len(model.requests) == 1
    await session.send_and_wait("more")
    window = roles(model, 1)
    assert window[2:] == [
        ("assistant", ""),
        ("tool", "slow result"),
        ("tool", "finished"),
        ("user", "more"),
    ]


async def test_t4_window_after_terminal_end_holds_the_whole_batch(client: Client) -> None:
    model = ScriptedModel([[tool_call("echo", {"text": "x"}), tool_call("done")], "answer"])
    session = await open_session(client, model, echo_tool(), done_tool())
    await session.send_and_wait("go")
    await session.send_and_wait("next")
    request = model.requests[1].messages
    assistant = request[2]
    assert [c.name for c in assistant.tool_calls] == ["echo", "done"]
    assert [m.tool_call_id for m in request[3:5]] == [c.id for c in assistant.tool_calls]


async def test_t5_is_terminal_is_persisted_and_survives_resume(client: Client) -> None:
    model = ScriptedModel([tool_call("done")])
    session = await open_session(client, model, done_tool())
    await session.send_and_wait("finish")
    start = (await session.get_events())[0]
    wire = start.model_dump(by_alias=True, mode="json")
    assert wire["data"]["config"]["tools"][0]["isTerminal"] is True
    await session.disconnect()
    again = ScriptedModel([tool_call("done")])
    resumed = await client.resume_session(
        session.session_id,
        provider=again,
        tools=[done_tool()],
        on_permission_request=PermissionHandler.approve_all,
    )
    assert resumed.config.tools[0].is_terminal
    await resumed.send_and_wait("finish again")
    assert len(again.requests) == 1


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (
            lambda p: (_ for _ in ()).throw(RuntimeError("secret /etc/passwd")),
            "Failed to execute 'probe': tool execution failed.",
        ),
        (lambda p: (_ for _ in ()).throw(ToolError("shown to the model")), "shown to the model"),
        (lambda p: {"n": 1}, '{"n":1}'),
        (lambda p: None, ""),
    ],
)
async def test_outcome_texts_the_model_sees(client: Client, handler: Any, expected: str) -> None:
    model = ScriptedModel([tool_call("probe"), "ok"])
    session = await open_session(client, model, define_tool("probe", handler=handler))
    await session.send_and_wait("go")
    assert roles(model, 1)[-1] == ("tool", expected)


async def test_invalid_arguments_are_reported_field_by_field_and_handler_never_runs(
    client: Client,
) -> None:
    ran: list[bool] = []

    class Args(BaseModel):
        count: int
        name: str

    tool = define_tool("probe", params_type=Args, handler=lambda p: ran.append(True))
    model = ScriptedModel([tool_call("probe", {"count": "many"}), "ok"])
    session = await open_session(client, model, tool)
    await session.send_and_wait("go")
    text = roles(model, 1)[-1][1]
    assert text.startswith("Invalid tool arguments:")
    assert "count:" in text and "name: Field required" in text
    assert ran == []


async def test_unknown_tool_is_a_failure_the_model_sees(client: Client) -> None:
    model = ScriptedModel([tool_call("missing"), "ok"])
    session = await open_session(client, model)
    rec = Recorder(session)
    await session.send_and_wait("go")
    assert rec.of("tool.execution_complete")[0].data.outcome == "failure"
    assert roles(model, 1)[-1] == ("tool", "Tool 'missing' does not exist.")


async def test_o1_every_start_has_exactly_one_complete(client: Client) -> None:
    async def hang(params: Any) -> str:
        await asyncio.Event().wait()
        return "never"

    tools = [
        define_tool("hang", handler=hang, timeout=0.05),
        echo_tool(),
        define_tool("boom", handler=lambda p: 1 / 0),
    ]
    model = ScriptedModel(
        [
            [
                tool_call("hang"),
                tool_call("echo", {"text": "x"}),
                tool_call("boom"),
                tool_call("echo", "{"),
            ],
            "end",
        ]
    )
    session = await open_session(client, model, *tools)
    await session.send_and_wait("go")
    events = await session.get_events()
    starts = [e.data.tool_call_id for e in events if e.type == "tool.execution_start"]
    completes = [e.data.tool_call_id for e in events if e.type == "tool.execution_complete"]
    assert len(starts) == 4 and sorted(starts) == sorted(completes)


async def test_o2_rejection_ends_the_run_and_stays_in_the_window(client: Client) -> None:
    model = ScriptedModel([tool_call("echo", {"text": "x"}), "understood"])
    session = await open_session(
        client,
        model,
        echo_tool(),
        on_permission_request=lambda r, i: {"kind": "reject", "feedback": "not now"},
    )
    rec = Recorder(session)
    await session.send_and_wait("go")
    assert len(model.requests) == 1
    assert rec.of("tool.execution_complete")[0].data.outcome == "rejected"
    await session.send_and_wait("and now?")
    assert roles(model, 1)[-2] == ("tool", "The user rejected this tool call. Feedback: not now")


async def test_rejected_result_from_a_handler_also_halts(client: Client) -> None:
    tool = define_tool(
        "probe", handler=lambda p: ToolResult(text_result_for_llm="stop", result_type="rejected")
    )
    model = ScriptedModel([tool_call("probe")])
    session = await open_session(client, model, tool)
    await session.send_and_wait("go")
    assert len(model.requests) == 1


async def test_permission_events_follow_tool_start_and_precede_complete(client: Client) -> None:
    requests: list[PermissionRequestData] = []

    def handler(request: PermissionRequestData, invocation: ToolInvocation) -> PermissionDecision:
        requests.append(request)
        return PermissionDecision(kind="approve-once")

    model = ScriptedModel([tool_call("echo", {"text": "x"}), "done"])
    session = await open_session(client, model, echo_tool(), on_permission_request=handler)
    rec = Recorder(session)
    await session.send_and_wait("go")
    tool_events = [t for t in rec.types if t.startswith(("tool.", "permission."))]
    assert tool_events == [
        "tool.execution_start",
        "permission.requested",
        "permission.completed",
        "tool.execution_complete",
    ]
    assert requests[0].tool_name == "echo" and requests[0].args == {"text": "x"}
    assert rec.of("permission.completed")[0].data.result.kind == "approved"


async def test_approve_for_session_asks_once(client: Client) -> None:
    asked: list[str] = []

    async def handler(request: PermissionRequestData, invocation: ToolInvocation) -> dict[str, str]:
        asked.append(request.tool_name)
        return {"kind": "approve-for-session"}

    model = ScriptedModel(
        [tool_call("echo", {"text": "1"}), tool_call("echo", {"text": "2"}), "done"]
    )
    session = await open_session(client, model, echo_tool(), on_permission_request=handler)
    await session.send_and_wait("go")
    assert asked == ["echo"]


@pytest.mark.parametrize(
    "handler",
    [None, lambda r, i: (_ for _ in ()).throw(RuntimeError("x")), lambda r, i: {"kind": "bogus"}],
    ids=["no-handler", "raises", "invalid-answer"],
)
async def test_without_a_usable_permission_answer_calls_are_denied(
    client: Client, handler: Any
) -> None:
    ran: list[bool] = []
    tool = define_tool("probe", handler=lambda p: ran.append(True))
    model = ScriptedModel([tool_call("probe"), "ok"])
    session = await open_session(client, model, tool, on_permission_request=handler)
    rec = Recorder(session)
    await session.send_and_wait("go")
    assert rec.of("tool.execution_complete")[0].data.outcome == "denied"
    assert ran == []


async def test_skip_permission_tools_run_without_asking(client: Client) -> None:
    model = ScriptedModel([tool_call("echo", {"text": "x"}), "ok"])
    session = await open_session(
        client, model, echo_tool(skip_permission=True), on_permission_request=None
    )
    rec = Recorder(session)
    await session.send_and_wait("go")
    assert rec.of("permission.requested") == []
    assert rec.of("tool.execution_complete")[0].data.outcome == "success"


async def test_terminal_clear_in_a_batch_with_a_rejection_still_seeds(client: Client) -> None:
    # The clear committed (C8 is unconditional); the rejected sibling's result was wiped with it.
    def decide(request: PermissionRequestData, invocation: ToolInvocation) -> dict[str, str]:
        return {"kind": "reject" if request.tool_name == "echo" else "approve-once"}

    model = ScriptedModel(
        [
            [tool_call("echo", {"text": "x"}), tool_call("clear_context", {"prompt": "seed"})],
            "fresh",
        ]
    )
    session = await open_session(
        client, model, echo_tool(), clear_tool(), on_permission_request=decide
    )
    reply = await session.send_and_wait("go")
    assert reply is not None and reply.data.content == "fresh"


# --- section 1's table: what each outcome records, read back from the store ----------------


class _Point(BaseModel):
    x: int


def _raise(exc: BaseException) -> Any:
    def handler(params: Any) -> Any:
        raise exc

    return handler


async def _too_slow(params: Any) -> str:
    await asyncio.sleep(10)
    return "late"


def _answer(kind: str, feedback: str | None = None) -> Any:
    return lambda request, invocation: {"kind": kind, "feedback": feedback}


Case = tuple[str, Any, dict[str, Any], str, str]
"""(the call's arguments, the tool's handler, session options, outcome, the model's text)."""

OUTCOMES: dict[str, Case] = {
    "success-str": ("{}", lambda p: "done", {}, "success", "done"),
    "success-json": ("{}", lambda p: {"n": 1}, {}, "success", '{"n":1}'),
    "success-model": ("{}", lambda p: _Point(x=2), {}, "success", '{"x":2}'),
    "success-none": ("{}", lambda p: None, {}, "success", ""),
    "success-result": (
        "{}",
        lambda p: ToolResult(text_result_for_llm="typed ok"),
        {},
        "success",
        "typed ok",
    ),
    "failure-tool-error": ("{}", _raise(ToolError("shown")), {}, "failure", "shown"),
    "failure-exception": (
        "{}",
        _raise(RuntimeError("secret")),
        {},
        "failure",
        "Failed to execute 'probe': tool execution failed.",
    ),
    "failure-own-timeout-error": (
        "{}",
        _raise(TimeoutError("its own")),
        {},
        "failure",
        "Failed to execute 'probe': tool execution failed.",
    ),
    "failure-result": (
        "{}",
        lambda p: ToolResult(text_result_for_llm="typed bad", result_type="failure"),
        {},
        "failure",
        "typed bad",
    ),
    "failure-unserialisable": (
        "{}",
        lambda p: object(),
        {},
        "failure",
        "Failed to execute 'probe': its result could not be serialised.",
    ),
    "failure-unknown-tool": ("{}", None, {}, "failure", "Tool 'missing' does not exist."),
    "invalid-json": (
        "{not json",
        lambda p: "ran",
        {},
        "invalid_arguments",
        "Invalid tool arguments:",
    ),
    "invalid-schema": (
        '{"x": "many"}',
        lambda p: "ran",
        {"params_type": _Point},
        "invalid_arguments",
        "Invalid tool arguments:",
    ),
    "denied-unavailable": (
        "{}",
        lambda p: "ran",
        {"on_permission_request": _answer("user-not-available")},
        "denied",
        "Permission denied and could not request permission from user",
    ),
    "denied-no-handler": (
        "{}",
        lambda p: "ran",
        {"on_permission_request": None},
        "denied",
        "Permission denied: no permission handler is configured for this session.",
    ),
    "denied-handler-raises": (
        "{}",
        lambda p: "ran",
        {"on_permission_request": lambda r, i: 1 / 0},
        "denied",
        "Permission denied",
    ),
    "denied-result": (
        "{}",
        lambda p: ToolResult(text_result_for_llm="typed no", result_type="denied"),
        {},
        "denied",
        "typed no",
    ),
    "rejected-permission": (
        "{}",
        lambda p: "ran",
        {"on_permission_request": _answer("reject", "not now")},
        "rejected",
        "The user rejected this tool call. Feedback: not now",
    ),
    "rejected-result": (
        "{}",
        lambda p: ToolResult(text_result_for_llm="typed stop", result_type="rejected"),
        {},
        "rejected",
        "typed stop",
    ),
    "timeout": (
        "{}",
        _too_slow,
        {"timeout": 0.05},
        "timeout",
        "Tool 'probe' timed out after 0.05 s.",
    ),
    "cancelled": (
        "{}",
        "runs until aborted",
        {},
        "cancelled",
        "The execution of this tool, or a previous tool was interrupted.",
    ),
}


@pytest.mark.parametrize("case", list(OUTCOMES))
async def test_every_outcome_is_recorded_as_section_1_says(client: Client, case: str) -> None:
    """Each outcome of spec section 1, made by a real session and read back from its store:
    `success` only for a success, `outcome`, the result text the model gets (`result` for a
    success, `error.message` with `error.code` the outcome for any other), and the model's
    next request (O2: after a rejection or an abort, the next run's)."""
    arguments, handler, options, outcome, text = OUTCOMES[case]
    tool_options = {k: v for k, v in options.items() if k in ("params_type", "timeout")}
    session_options = {k: v for k, v in options.items() if k not in tool_options}
    running = asyncio.Event()

    async def until_aborted(params: Any) -> str:
        running.set()
        await asyncio.Event().wait()
        return "never"

    if outcome == "cancelled":
        handler = until_aborted
    tools = [] if handler is None else [define_tool("probe", handler=handler, **tool_options)]
    name = "probe" if handler is not None else "missing"
    model = ScriptedModel([tool_call(name, arguments, id="c1"), "after"])
    session = await open_session(client, model, *tools, **session_options)
    if outcome == "cancelled":
        await session.send("go")
        await asyncio.wait_for(running.wait(), 10)  # the call is in flight
        await session.abort()
    else:
        await asyncio.wait_for(session.send_and_wait("go"), 10)
    run_ended_at_batch = outcome in ("rejected", "cancelled")
    assert len(model.requests) == (1 if run_ended_at_batch else 2)
    if run_ended_at_batch:
        await asyncio.wait_for(session.send_and_wait("next"), 10)
    model.assert_done()

    stored = [e for e in await session.get_events() if e.type == "tool.execution_complete"]
    assert len(stored) == 1
    data = stored[0].data
    assert (data.tool_call_id, data.tool_name, data.outcome) == ("c1", name, outcome)
    assert data.success is (outcome == "success")
    if outcome == "success":
        assert data.error is None
        assert data.result is not None and data.result.content == text
    else:
        assert data.result is None
        assert data.error is not None and data.error.code == outcome
        assert data.error.message.startswith(text)
    assert data.model_dump(by_alias=True)["success"] is data.success  # the wire's spelling
    sent = [m for m in model.requests[1].messages if m.role == "tool"]
    assert [(m.tool_call_id, m.content.startswith(text)) for m in sent] == [("c1", True)]
    if data.error is not None:
        assert sent[0].content == data.error.message
