"""Issue 19, the session inspector: its pages, requested through httpx's ASGI transport, over
sessions the real runtime wrote to a real store."""

from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import quote

import httpx2 as httpx
import pytest
from markupsafe import escape
from pydantic import BaseModel

from tests.conftest import clear_tool, echo_tool, open_session
from tests.inspect.conftest import ASK, SEED, require_extra, seed_scenario, visible
from trimtab import Client, ProviderError, Session, SessionError, define_tool
from trimtab.events import SessionStartData, SessionStartEvent, UserMessageData, UserMessageEvent
from trimtab.providers import ModelRequest, ProviderConfig
from trimtab.store import Store
from trimtab.testing import ScriptedModel, ScriptStep, tool_call

require_extra()

from trimtab.inspect.app import ENTRIES_PER_PAGE, SESSIONS_PER_PAGE, session_segment  # noqa: E402
from trimtab.inspect.windows import window_view  # noqa: E402


def url(session_id: str, rest: str = "") -> str:
    return f"/sessions/{session_segment(session_id)}{rest}"


async def page(inspector: httpx.AsyncClient, path: str, status: int = 200) -> str:
    response = await inspector.get(path)
    assert response.status_code == status, response.text[:500]
    return response.text


async def unfinished(store: Store, session_id: str) -> None:
    """A log whose run never ended: the process running it died after the user's message."""
    start = SessionStartEvent(data=SessionStartData(session_id=session_id))
    await store.create(session_id, [start])
    message = UserMessageEvent(data=UserMessageData(content="never answered", source="user"))
    await store.append(session_id, [message], lease=None)


def row(html: str, session_id: str) -> str:
    """The sessions table's row of one session."""
    [match] = re.findall(rf"<tr>\s*<td><a[^>]*>{re.escape(session_id)}</a>.*?</tr>", html, re.S)
    return visible(match)


async def test_issue19_index_lists_sessions_with_status_model_tokens_and_activity(
    client: Client, store: Store, inspector: httpx.AsyncClient
) -> None:
    seeded, _ = await seed_scenario(client)
    failing = await open_session(client, ScriptedModel([ProviderError("rate_limit", "slow")]))
    with pytest.raises(SessionError):
        await failing.send_and_wait("Hi")
    await unfinished(store, "crashed")
    await unfinished(store, "busy")
    assert await store.acquire_lease("busy", "another-process", 60) is not None

    html = await page(inspector, "/")

    for session_id in (seeded.session_id, failing.session_id, "crashed", "busy"):
        assert f'href="{url(session_id)}"' in html
    record = await store.get(seeded.session_id)
    assert row(html, seeded.session_id) == (
        f"{seeded.session_id} {escape(ASK)} idle scripted 241 5 0.0000 2 16"
        f" {record.updated_at:%Y-%m-%d %H:%M:%S}"
    )
    assert " Hi failed - 0 0 0.0000 1 5 " in row(html, failing.session_id)
    assert " interrupted " in row(html, "crashed")
    assert " running " in row(html, "busy")


async def test_issue19_index_search_matches_ids_and_first_messages(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    apples = await open_session(client, ScriptedModel(["ok"]), session_id="fruit-apples")
    await apples.send_and_wait("Tell me about apples")
    pears = await open_session(client, ScriptedModel(["ok"]), session_id="fruit-pears")
    await pears.send_and_wait("Tell me about PEARS")

    by_message = await page(inspector, "/?q=pears")
    by_id = await page(inspector, "/?q=FRUIT-")
    nothing = await page(inspector, "/?q=%3Cb%3Ekiwi")

    assert "fruit-pears" in by_message and "fruit-apples" not in by_message
    assert "fruit-pears" in by_id and "fruit-apples" in by_id
    assert "No session matches <strong>&lt;b&gt;kiwi</strong>" in nothing


async def test_issue19_index_paginates(client: Client, inspector: httpx.AsyncClient) -> None:
    for number in range(SESSIONS_PER_PAGE + 3):
        await open_session(client, ScriptedModel(), session_id=f"s{number:03d}")

    first, second = await page(inspector, "/"), await page(inspector, "/?page=2")

    # Most recently active first: the last three created are on page 1, the first three on 2.
    assert first.count('href="/sessions/') == SESSIONS_PER_PAGE
    assert second.count('href="/sessions/') == 3
    assert {"s000", "s001", "s002"} == set(re.findall(r'href="/sessions/(s\d+)"', second))
    assert 'href="/?page=2" rel="next"' in first


async def test_issue19_timeline_shows_tool_calls_with_arguments_outcome_duration_permission(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    class SlowArgs(BaseModel):
        text: str

    async def slow(params: SlowArgs) -> str:
        return params.text.upper()

    def decide(request: object, invocation: object) -> dict[str, str]:
        name = getattr(request, "tool_name", "")
        return {"kind": "approved" if name == "shout" else "denied-interactively-by-user"}

    # A call the user rejects ends the run (spec O2): no second model call.
    model = ScriptedModel(
        [[tool_call("shout", {"text": "quiet please"}), tool_call("echo", {"text": "no"})]]
    )
    shout = define_tool("shout", description="Shout", params_type=SlowArgs, handler=slow)
    session = await open_session(client, model, shout, echo_tool(), on_permission_request=decide)
    await session.send_and_wait("Shout something")

    html = await page(inspector, url(session.session_id))
    text = visible(html)

    calls = re.findall(
        r'<div class="call" data-call="(\w+)">(.*?)</div>\s*(?=<div class="call"|</article>)',
        html,
        re.S,
    )
    assert [name for name, _ in calls] == ["shout", "echo"]
    shouted, denied = (visible(body) for _, body in calls)
    assert "success permission: approved" in shouted and " ms " in shouted
    assert escape(json.dumps({"text": "quiet please"}, indent=2)) in calls[0][1]
    assert "result QUIET PLEASE" in shouted
    assert "rejected permission: denied-interactively-by-user" in denied
    assert "error The user rejected this tool call." in denied
    assert "model call 1 epoch 0" in text and "model call 2" not in text
    assert "run 1 · epoch 0" in text and "Shout something" in text


async def test_issue19_session_page_shows_each_context_operation(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    model = ScriptedModel(["one " * 50, "two " * 50, "three", "THE SUMMARY", "four", "five"])
    session = await open_session(client, model)
    for prompt in ("first", "second", "third"):
        await session.send_and_wait(prompt)
    await session.history.compact()
    await session.send_and_wait("fourth")
    events = await session.get_events()
    fourth = next(e for e in events if getattr(e.data, "content", None) == "fourth")
    await session.history.truncate(fourth.id)
    await session.send_and_wait("fifth")
    fork = await session.history.fork()

    html = await page(inspector, url(session.session_id))
    forked = await page(inspector, url(fork.session_id))

    ops = re.findall(r'<div class="op op-(\w+)" data-op="\w+">\s*<header><strong>([^<]*)', html)
    assert [name for name, _ in ops] == ["start", "compaction", "truncation"]
    assert ops[1][1].startswith("compacted (manual): ") and "messages removed" in ops[1][1]
    assert ops[2][1] == f"truncated at event {fourth.id}: 5 events removed"
    assert "THE SUMMARY" in html
    assert "0 clears, 1 compaction, 1 truncation" in visible(html)
    assert f"forked from session {session.session_id}" in forked
    assert f'<a class="mono" href="{url(session.session_id)}">' in forked


async def test_issue19_seed_scenario_page_shows_two_epochs_the_clear_and_the_seeded_run(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    session, _ = await seed_scenario(client)

    text = visible(await page(inspector, url(session.session_id)))

    assert "epoch 0 opened by session start" in text
    assert "epoch 1 opened by clear (event #10)" in text
    assert "context cleared: 2 messages epoch 1" in text
    assert f"seed {escape(SEED)}" in text
    assert "seeded run after the clear · epoch 1" in text
    assert "clear_context success permission: approved" in text


async def test_issue19_window_of_each_model_call_is_the_request_the_model_got(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    long = "a long answer, " * 40
    model = ScriptedModel(
        [
            long,
            tool_call("echo", {"text": "x"}),
            "echoed",
            "SUMMARY",
            tool_call("clear_context", {"prompt": SEED}),
            "FRESH",
            "after",
        ]
    )
    session = await open_session(client, model, clear_tool(), echo_tool())
    await session.send_and_wait("first")
    await session.send_and_wait("second")
    await session.history.compact()
    await session.send_and_wait(ASK)
    events = await session.get_events()
    await session.history.truncate(events[-1].id)  # forgets FRESH's last turn end only
    await session.send_and_wait("third")

    # The compaction's own model call has no turn: it is not one of the session's calls.
    requests = [r for r in model.requests if r.tools]
    events = await session.get_events()
    for number, request in enumerate(requests, 1):
        view = window_view(events, number)
        assert view is not None and view.window == list(request.messages), number
        html = await page(inspector, url(session.session_id, f"/calls/{number}"))
        current = html[html.index('class="column current"') :]
        for message in request.messages:
            assert str(escape(message.content)[:200]) in current
    compacted, truncated = window_view(events, 4), window_view(events, 6)
    assert compacted is not None and truncated is not None
    assert [c.title for c in compacted.columns] == ["epoch 0", "epoch 0 · after compaction"]
    assert [s.mark for s in compacted.columns[0].messages][:3] == ["", "removed", "removed"]
    assert [s.mark for s in compacted.columns[1].messages] == [
        "", "summary", "kept", "kept", "kept", "kept", "",
    ]  # fmt: skip
    assert [c.closed_by for c in truncated.columns] == [
        "compaction removed 2 messages",
        "cleared 7 messages",
        "truncated: 1 events forgotten",
        None,
    ]
    assert window_view(events, len(requests) + 1) is None
    await page(inspector, url(session.session_id, f"/calls/{len(requests) + 1}"), 404)


async def test_issue19_window_page_puts_epochs_side_by_side_with_what_the_clear_removed(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    session, _ = await seed_scenario(client)

    view = window_view(await session.get_events(), 2)
    html = await page(inspector, url(session.session_id, "/calls/2"))

    assert view is not None
    before, after = view.columns
    assert (before.title, after.title) == ("epoch 0", "epoch 1 · after clear")
    assert [(s.message.role, s.mark) for s in before.messages] == [
        ("system", ""),
        ("developer", ""),
        ("user", "removed"),
        ("assistant", "removed"),
        ("tool", "removed"),
    ]
    assert before.closed_by == "cleared 2 messages"
    assert [(s.message.role, s.message.content, s.mark) for s in after.messages] == [
        ("system", "SYSTEM", ""),
        ("developer", "DEV", ""),
        ("user", SEED, "seed"),
    ]
    columns = re.findall(r'<section class="column[^"]*" data-epoch="(\d)">', html)
    assert columns == ["0", "1"]
    assert html.count('class="msg msg-user removed"') == 1
    assert '<div class="msg msg-user seed">' in html and str(escape(ASK)) in html


async def test_issue19_window_page_shows_the_last_columns_of_many(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    steps: list[ScriptStep] = []
    for number in range(6):
        steps += [tool_call("clear_context", {"prompt": f"seed {number}"}), f"fresh {number}"]
    model = ScriptedModel(steps)
    session = await open_session(client, model, clear_tool())
    for number in range(6):
        await session.send_and_wait(f"clear {number}")

    view = window_view(await session.get_events(), 12, columns=4)
    html = await page(inspector, url(session.session_id, "/calls/12"))

    assert view is not None and view.hidden == 3
    assert [c.epoch for c in view.columns] == [3, 4, 5, 6]
    assert "(3 earlier columns not shown)" in visible(html)


async def test_issue19_token_usage_chart_has_a_point_per_call_and_marks_the_clear(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    session, _ = await seed_scenario(client)

    html = await page(inspector, url(session.session_id))

    [svg] = re.findall(r"<svg class=\"chart\".*?</svg>", html, re.S)
    lines = re.findall(r'<polyline [^>]*points="([^"]*)"', svg)
    assert [len(points.split()) for points in lines] == [2, 2]
    assert re.findall(r'<line class="marker" data-op="(\w+)"', svg) == ["clear"]
    assert "input tokens (241 in all)" in visible(html)


async def test_issue19_long_timelines_are_paginated(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    calls = 0

    def then(request: ModelRequest) -> ScriptStep:
        nonlocal calls
        calls += 1
        return "done" if calls % 60 == 0 else tool_call("echo", {"text": str(calls)})

    session = await open_session(client, ScriptedModel(then=then), echo_tool())
    await session.send_and_wait("one")
    await session.send_and_wait("two")  # 2 runs + 120 calls + the start: 123 entries

    first = await page(inspector, url(session.session_id))
    second = await page(inspector, url(session.session_id, "?page=2"))
    beyond = await page(inspector, url(session.session_id, "?page=99"))

    assert first.count('<article class="turn"') == ENTRIES_PER_PAGE - 3  # start, run 1, run 2
    assert 'id="call-97"' in first and 'id="call-98"' not in first
    assert second.count('<article class="turn"') == 23 and 'id="call-120"' in second
    assert "run 2, continued from the previous page" in second
    assert "page 2 of 2" in visible(beyond) and 'id="call-120"' in beyond  # past the end
    window = await page(inspector, url(session.session_id, "/calls/120"))
    assert f'href="{url(session.session_id)}?page=2#call-120"' in window


async def test_issue19_hostile_log_text_is_escaped_everywhere(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'&"
    model = ScriptedModel([tool_call("echo", {"text": hostile}), hostile])
    session_id = f'x"><svg onload=alert(3)>{hostile}'
    session = await open_session(client, model, echo_tool(), session_id=session_id)
    await session.send_and_wait(hostile)

    for path in ("/", url(session_id), url(session_id, "/calls/1"), url(session_id, "/calls/2"),
                 url(session_id, "?live=1"), "/?q=" + quote(hostile)):  # fmt: skip
        response = await inspector.get(path)
        html = response.text
        assert response.status_code == 200, path
        assert "<img" not in html and "<svg onload" not in html, path
        assert html.count("<script") == (1 if "live=1" in path else 0), path
        assert str(escape(hostile)) in html, path
        policy = response.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'nonce-" in policy
        assert 'nonce="' in html and response.headers["x-content-type-options"] == "nosniff"
    data = (await inspector.get(url(session_id, "/events/2"))).json()
    assert data["data"]["content"] == hostile


async def test_issue19_event_json_and_unknown_sessions(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    session, _ = await seed_scenario(client)

    cleared = (await inspector.get(url(session.session_id, "/events/10"))).json()
    missing = await inspector.get(url("no-such-session"))
    past = await inspector.get(url(session.session_id, "/events/17"))

    assert cleared["type"] == "session.context_cleared"
    assert cleared["data"] == {"messagesCleared": 2, "initialMessage": SEED}
    assert missing.status_code == 404 and "there is no session" in missing.text
    assert past.status_code == 404


async def test_issue19_the_session_page_follows_new_events_of_a_cached_log(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    model = ScriptedModel(["one", "two"])
    session = await open_session(client, model)
    await session.send_and_wait("first")
    before = visible(await page(inspector, url(session.session_id)))
    await session.send_and_wait("second")
    after = visible(await page(inspector, url(session.session_id)))

    assert "model call 1" in before and "model call 2" not in before
    assert "model call 2" in after and "second" in after


async def test_issue19_live_mode_page_carries_the_stream_of_events_after_it(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    session, _ = await seed_scenario(client)

    html = await page(inspector, url(session.session_id, "?live=1"))

    assert f'data-stream="{url(session.session_id)}/live?after=16"' in html
    assert "stop following" in html
    response = await inspector.get(url(session.session_id, "?live=1"))
    [nonce] = re.findall(r'<script nonce="([^"]+)">', response.text)
    assert f"script-src 'nonce-{nonce}'" in response.headers["content-security-policy"]


async def test_issue19_a_tool_call_left_unfinished_shows_as_such(
    store: Store, inspector: httpx.AsyncClient
) -> None:
    from trimtab.events import (
        AssistantMessageData,
        AssistantMessageEvent,
        AssistantTurnStartEvent,
        ToolExecutionStartData,
        ToolExecutionStartEvent,
        ToolRequest,
        TurnData,
    )

    await unfinished(store, "cut")
    await store.append(
        "cut",
        [
            AssistantTurnStartEvent(data=TurnData(turn_id="0")),
            AssistantMessageEvent(
                data=AssistantMessageData(
                    message_id="m",
                    tool_requests=[ToolRequest(tool_call_id="c1", name="slow", arguments={})],
                )
            ),
            ToolExecutionStartEvent(
                data=ToolExecutionStartData(tool_call_id="c1", tool_name="slow", arguments={})
            ),
        ],
        lease=None,
    )

    text = visible(await page(inspector, url("cut")))

    assert "slow unfinished permission: not asked" in text
    assert " interrupted " in visible(await page(inspector, "/"))


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/?page=%C2%B2", 200),  # "²": a digit to `isdigit`, not to `int`
        ("/sessions/numbers?page=%D9%A3", 200),
        ("/sessions/numbers/live?after=%C2%B2", 400),
        (f"/sessions/numbers/events/{'9' * 5000}", 404),  # more digits than `int` takes
        (f"/sessions/numbers/calls/{'9' * 5000}", 404),
    ],
    ids=["index-page", "session-page", "live-after", "event-number", "call-number"],
)
async def test_a_number_the_pages_cannot_read_is_no_server_error(
    client: Client, inspector: httpx.AsyncClient, path: str, status: int
) -> None:
    session = await open_session(client, ScriptedModel(["ok"]), session_id="numbers")
    await session.send_and_wait("hi")
    response = await inspector.get(path)
    assert response.status_code == status, response.text[:300]


async def _withdrawn_run(client: Client) -> Session:
    """Chat's Ctrl-C (spec L6): a run aborted while its model call waits, then withdrawn from
    the window by a truncation at its `user.message`; then one more run."""
    waiting = asyncio.Event()

    async def never_answers(request: ModelRequest) -> ScriptStep:
        waiting.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    session = await open_session(client, ScriptedModel(["one", never_answers, "three"]))
    await session.send_and_wait("first")
    interrupted = asyncio.create_task(session.send_and_wait("second"))
    await asyncio.wait_for(waiting.wait(), 10)
    await session.abort()
    await asyncio.gather(interrupted, return_exceptions=True)
    events = await session.get_events()
    [second] = [e for e in events if getattr(e.data, "content", None) == "second"]
    await session.history.truncate(second.id)
    await session.send_and_wait("third")
    return session


async def test_l7_a_ctrl_c_abort_is_shown_as_an_aborted_run_withdrawn_not_a_truncation(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    session = await _withdrawn_run(client)

    html = await page(inspector, url(session.session_id))
    window = visible(await page(inspector, url(session.session_id, "/calls/3")))

    ops = re.findall(r'<div class="op op-(\w+)" data-op="\w+">\s*<header><strong>([^<]*)', html)
    assert [name for name, _ in ops] == ["start", "abort", "withdrawal"]
    assert ops[2][1] == "aborted run withdrawn from the window: 4 events"
    text = visible(html)
    assert "0 clears, 0 compactions, 0 truncations, 1 aborted run withdrawn" in text
    assert "truncated" not in text
    assert "aborted run withdrawn: 4 events" in window and "truncated" not in window


async def test_l7_the_list_and_the_session_page_count_model_calls_alike(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    session = await _withdrawn_run(client)  # 3 model calls, the second aborted unanswered

    listed = row(await page(inspector, "/"), session.session_id)
    html = await page(inspector, url(session.session_id))
    window = visible(await page(inspector, url(session.session_id, "/calls/1")))

    assert " idle scripted " in listed and listed.split()[-4] == "3"  # the Calls column
    facts = re.findall(r"<dt>model calls</dt><dd>(\d+)</dd>", html)
    chart = re.findall(r"<span>(\d+) model calls", html)  # the chart's legend
    assert facts == chart == ["3"]
    assert "a point for each of the 2 answers" in visible(html)
    assert "The window of model call 1 of 3" in window


async def test_x8_a_pruned_session_shows_what_was_pruned_and_counts_as_before(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    session, model = await seed_scenario(client)
    model.add("again")
    await session.send_and_wait("and again")
    result = await session.history.prune()
    facts = ["3"]  # the clearing call, the seeded run's and the last run's

    html = await page(inspector, url(session.session_id))
    ops = re.findall(r'<div class="op op-(\w+)" data-op="\w+">\s*<header><strong>([^<]*)', html)
    assert ("pruned", f"{result.events_removed} events pruned before here") in ops
    assert "session.context_cleared (epoch 0," not in html  # (the clear itself is kept)
    assert re.findall(r"<dt>model calls</dt><dd>(\d+)</dd>", html) == facts
    assert "1 clear, 0 compactions, 0 truncations" in visible(html)
    last = int(facts[0])
    window = visible(await page(inspector, url(session.session_id, f"/calls/{last}")))
    assert f"The window of model call {last} of {last}" in window
    listed = row(await page(inspector, "/"), session.session_id)
    assert listed.split()[-4] == facts[0]


class PricedModel(ScriptedModel):
    """A scripted model whose config names prices, as a built provider's does (spec U1)."""

    def __init__(self, steps: list[ScriptStep]) -> None:
        super().__init__(steps)
        prices = {"priced": {"input": 1000.0, "output": 3000.0}}
        self.config = ProviderConfig(type="openai", prices=prices)


async def test_u2_the_session_page_sums_the_cost_per_run_per_segment_and_per_session(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    model = PricedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH_CONTEXT", "again"])
    session = await open_session(client, model, clear_tool(), model="priced")
    await session.send_and_wait(ASK)
    await session.send_and_wait("Once more")
    costs = [e.data.cost or 0.0 for e in await session.get_events() if e.type == "assistant.usage"]
    assert len(costs) == 3 and all(costs)

    html = await page(inspector, url(session.session_id))

    text = visible(html)
    assert re.search(r'<dd id="cost">\s*' + re.escape(f"{sum(costs):,.4f}"), html)
    # Runs: the clearing run, its seeded run, the last run; each with what it spent.
    runs = re.findall(r'class="run-spent">[\d,]+ tokens, cost ([\d.,]+)', html)
    assert runs == [f"{cost:,.4f}" for cost in costs]
    # Segments: the epoch before the clear, and the one after it (what the clear saved shows
    # in their sums: the second epoch's calls read a fresh window).
    segments = re.findall(r"spent: ([\d,]+) tokens in, [\d,]+ out, cost ([\d.,]+)", text)
    assert [cost for _, cost in segments] == [f"{costs[0]:,.4f}", f"{costs[1] + costs[2]:,.4f}"]
