"""Spec section "Tracing" (OT1-OT7), issue 19: OpenTelemetry spans of runs, model calls and
tool calls, read back from the SDK's in-memory exporter.

Each test passes its own `TracerProvider` (`Client(tracer_provider=...)`): the global provider
can be set only once per process, so the global case runs in a subprocess of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import EchoArgs, clear_tool, echo_tool, open_session
from tests.requirements import require_import
from tests.test_context_ops import LIMIT, many_tools, responder
from trimtab import Client, ProviderError, SessionError, define_tool
from trimtab.testing import ScriptedModel, tool_call

require_import("opentelemetry.sdk", "needs the OpenTelemetry SDK (in the dev extra)")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import (  # noqa: E402
    Event,
    ReadableSpan,
    SpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402

SEED = "Reply with exactly FRESH_CONTEXT."


class Traced:
    """A tracer provider whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("host")

    @property
    def spans(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name.startswith(prefix)]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        """The spans whose parent is `parent`, in start order."""
        assert parent.context is not None
        found = [
            s
            for s in self.spans
            if s.parent is not None and s.parent.span_id == parent.context.span_id
        ]
        return sorted(found, key=lambda s: s.start_time or 0)

    def tree(self, root: ReadableSpan) -> list[Any]:
        """`[name, [children...]]`, children in start order (a batch's calls by name)."""
        kids = sorted(
            self.children(root), key=lambda s: (s.name.startswith("execute_tool"), s.start_time)
        )
        return [root.name, [self.tree(k) for k in kids]]


@pytest.fixture
def traced() -> Iterator[Traced]:
    traces = Traced()
    yield traces
    traces.provider.shutdown()


@pytest.fixture
async def client(traced: Traced) -> AsyncIterator[Client]:
    async with Client(store="memory", tracer_provider=traced.provider) as runtime:
        yield runtime


def attrs(item: ReadableSpan | Event) -> dict[str, Any]:
    """A span's or a span event's attributes."""
    return dict(item.attributes or {})


def names(spans: Sequence[ReadableSpan]) -> list[str]:
    return [s.name for s in spans]


async def test_ot2_ot3_plain_turn_nests_under_the_callers_span(
    client: Client, traced: Traced
) -> None:
    session = await open_session(client, ScriptedModel(["hello"]), model="gpt-test")
    with traced.tracer.start_as_current_span("host request") as host:
        reply = await session.send_and_wait("hi")
    assert reply is not None and reply.data.content == "hello"

    (root,) = traced.named("host request")
    assert traced.tree(root) == [
        "host request",
        [["invoke_agent trimtab", [["chat gpt-test", []]]]],
    ]
    (run,) = traced.named("invoke_agent")
    assert run.context is not None and run.context.trace_id == host.get_span_context().trace_id
    assert attrs(run) | {"gen_ai.conversation.id": "x"} == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "trimtab",
        "gen_ai.provider.name": "trimtab.scripted",
        "gen_ai.conversation.id": "x",
        "gen_ai.request.model": "gpt-test",
        "trimtab.context.epoch": 0,
        "trimtab.run.seeded": False,
    }
    assert attrs(run)["gen_ai.conversation.id"] == session.session_id
    (chat,) = traced.named("chat")
    chat_attrs = attrs(chat)
    assert chat.kind == trace.SpanKind.CLIENT
    assert chat_attrs["gen_ai.operation.name"] == "chat"
    assert chat_attrs["gen_ai.request.model"] == "gpt-test"
    assert chat_attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert chat_attrs["gen_ai.usage.input_tokens"] > 0
    assert chat_attrs["gen_ai.usage.output_tokens"] > 0
    assert chat_attrs["trimtab.request.messages"] == 2  # system and user
    assert chat_attrs["trimtab.response.chars"] == len("hello")
    assert "gen_ai.input.messages" not in chat_attrs  # contents are opt-in (OT3)
    assert run.status.status_code == StatusCode.UNSET


async def test_ot4_parallel_batch_and_handler_spans_nest_under_execute_tool(
    client: Client, traced: Traced
) -> None:
    def sync_echo(params: EchoArgs) -> str:
        # Runs in a worker thread: the context still reaches it.
        with traced.tracer.start_as_current_span("sync handler work"):
            return params.text

    async def async_echo(params: EchoArgs) -> str:
        with traced.tracer.start_as_current_span("async handler work"):
            await asyncio.sleep(0)
            return params.text

    tools = [
        define_tool("sync_echo", params_type=EchoArgs, handler=sync_echo),
        define_tool("async_echo", params_type=EchoArgs, handler=async_echo),
    ]
    batch = [
        tool_call("sync_echo", {"text": "a"}, id="c1"),
        tool_call("async_echo", {"text": "b"}, id="c2"),
    ]
    session = await open_session(client, ScriptedModel([batch, "done"]), *tools)
    await session.send_and_wait("go")

    (run,) = traced.named("invoke_agent")
    assert traced.tree(run) == [
        "invoke_agent trimtab",
        [
            ["chat default", []],
            ["chat default", []],
            ["execute_tool sync_echo", [["sync handler work", []]]],
            ["execute_tool async_echo", [["async handler work", []]]],
        ],
    ]
    calls = {attrs(s)["gen_ai.tool.call.id"]: s for s in traced.named("execute_tool")}
    assert set(calls) == {"c1", "c2"}
    for call_id, name in (("c1", "sync_echo"), ("c2", "async_echo")):
        call = attrs(calls[call_id])
        assert call["gen_ai.tool.name"] == name
        assert call["trimtab.tool.outcome"] == "success"
        assert call["trimtab.permission.decision"] == "approved"
        assert "gen_ai.tool.call.arguments" not in call
    first_chat = traced.named("chat")[0]
    assert attrs(first_chat)["trimtab.response.tool_calls"] == 2
    assert attrs(first_chat)["gen_ai.response.finish_reasons"] == ("tool_calls",)


async def test_ot4_denied_call_is_an_error_with_its_decision(traced: Traced) -> None:
    def deny(request: Any, invocation: Any) -> dict[str, str]:
        return {"kind": "denied-interactively-by-user"}

    async with Client(store="memory", tracer_provider=traced.provider) as client:
        model = ScriptedModel([tool_call("echo", {"text": "x"})])  # a denial ends the run
        session = await open_session(client, model, echo_tool(), on_permission_request=deny)
        await session.send_and_wait("go")

    (call,) = traced.named("execute_tool")
    assert attrs(call)["trimtab.permission.decision"] == "denied-interactively-by-user"
    assert attrs(call)["trimtab.tool.outcome"] == "rejected"
    assert attrs(call)["error.type"] == "rejected"
    assert call.status.status_code == StatusCode.ERROR


async def test_ot2_ot6_seed_scenario_the_seeded_run_is_its_own_invoke_agent(
    client: Client, traced: Traced
) -> None:
    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH_CONTEXT"])
    session = await open_session(client, model, clear_tool())
    with traced.tracer.start_as_current_span("host request"):
        reply = await session.send_and_wait("clear, then answer the seed")
    assert reply is not None and reply.data.content == "FRESH_CONTEXT"

    (root,) = traced.named("host request")
    assert traced.tree(root) == [
        "host request",
        [
            ["invoke_agent trimtab", [["chat default", []], ["execute_tool clear_context", []]]],
            ["invoke_agent trimtab", [["chat default", []]]],
        ],
    ]
    first, seeded = traced.children(root)
    assert (attrs(first)["trimtab.context.epoch"], attrs(first)["trimtab.run.seeded"]) == (0, False)
    assert (attrs(seeded)["trimtab.context.epoch"], attrs(seeded)["trimtab.run.seeded"]) == (
        1,
        True,
    )
    assert first.context is not None
    assert [link.context.span_id for link in seeded.links] == [first.context.span_id]
    (clear,) = traced.named("execute_tool clear_context")
    (event,) = clear.events
    assert event.name == "session.context_cleared"
    (cleared,) = [e for e in await session.get_events() if e.type == "session.context_cleared"]
    assert attrs(event) == {"trimtab.messages_cleared": cleared.data.messages_cleared}


async def test_ot2_aborted_run_is_marked(client: Client, traced: Traced) -> None:
    started = asyncio.Event()

    async def long(params: Any) -> str:
        started.set()
        await asyncio.sleep(30)
        return "never"

    model = ScriptedModel([tool_call("long")])
    session = await open_session(client, model, define_tool("long", handler=long))
    run = asyncio.create_task(session.send_and_wait("go"))
    await asyncio.wait_for(started.wait(), 10)
    await session.abort()
    await run

    (agent,) = traced.named("invoke_agent")
    assert attrs(agent)["trimtab.run.aborted"] is True
    assert agent.status.status_code == StatusCode.UNSET  # an abort is the user's, not an error
    (call,) = traced.named("execute_tool")
    assert attrs(call)["trimtab.tool.outcome"] == "cancelled"
    assert traced.children(agent)[-1] is call and call.end_time is not None


async def test_ot7_provider_error_sets_error_status(client: Client, traced: Traced) -> None:
    failure = ProviderError("rate_limit", "slow down", status_code=429, retryable=True)
    session = await open_session(client, ScriptedModel([failure]))
    with pytest.raises(SessionError):
        await session.send_and_wait("hi")

    (chat,) = traced.named("chat")
    assert chat.status.status_code == StatusCode.ERROR
    assert attrs(chat)["error.type"] == "rate_limit"
    (agent,) = traced.named("invoke_agent")
    assert agent.status.status_code == StatusCode.ERROR
    assert attrs(agent)["error.type"] == "rate_limit"


async def test_ot3_contents_only_when_opted_in(traced: Traced) -> None:
    async with Client(
        store="memory", tracer_provider=traced.provider, trace_content=True
    ) as client:
        model = ScriptedModel([tool_call("echo", {"text": "secret"}), "done"])
        session = await open_session(client, model, echo_tool())
        await session.send_and_wait("tell me")

    chat = traced.named("chat")[0]
    sent = json.loads(attrs(chat)["gen_ai.input.messages"])
    assert sent[-1] == {"role": "user", "parts": [{"type": "text", "content": "tell me"}]}
    answer = json.loads(attrs(chat)["gen_ai.output.messages"])
    assert answer[0]["parts"][0]["name"] == "echo"
    (call,) = traced.named("execute_tool")
    assert json.loads(attrs(call)["gen_ai.tool.call.arguments"]) == {"text": "secret"}
    assert attrs(call)["gen_ai.tool.call.result"] == "secret"


async def test_ot1_client_option_turns_tracing_off(traced: Traced) -> None:
    async with Client(store="memory", tracer_provider=traced.provider, tracing=False) as client:
        session = await open_session(client, ScriptedModel(["hello"]))
        await session.send_and_wait("hi")
    assert traced.spans == ()


async def test_ot6_compaction_in_a_run_is_a_span_event(client: Client, traced: Traced) -> None:
    replies: list[str] = []
    session = await open_session(
        client,
        ScriptedModel(then=responder(replies)),
        model_limits={"context_window": LIMIT, "max_output_tokens": 200},
    )
    for i in range(25):
        await session.send_and_wait(f"paragraph {i}: " + "lorem ipsum dolor sit amet " * 12)

    summaries = [s for s in traced.named("chat") if s.parent and s.parent.span_id]
    assert len(summaries) == len(traced.named("chat"))  # the summary's call too: all in runs
    assert len(traced.named("chat")) == 25 + len(
        [e for e in await session.get_events() if e.type == "session.compaction_complete"]
    )
    events = [e for s in traced.named("invoke_agent") for e in s.events]
    assert events and {e.name for e in events} == {"session.compaction"}
    first = attrs(events[0])
    assert first["trimtab.compaction.trigger"] == "threshold"  # the protocol's name (D9)
    assert first["trimtab.compaction.success"] is True
    assert first["trimtab.messages_removed"] > 0


async def test_ot6_tool_search_is_a_span_event(client: Client, traced: Traced) -> None:
    model = ScriptedModel(
        [
            tool_call("tool_search", {"query": "weather forecast"}),
            tool_call("weather_forecast"),
            "It is sunny.",
        ]
    )
    session = await open_session(client, model, *many_tools(31))
    await session.send_and_wait("What is the weather?")

    (search,) = traced.named("execute_tool tool_search")
    (event,) = search.events
    assert event.name == "tool_search"
    assert "weather_forecast" in attrs(event)["trimtab.tools_found"]


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""Fresh ids differ between any two runs."""


async def test_ot7_the_log_is_the_same_with_tracing_on_or_off(traced: Traced) -> None:
    logs = []
    for tracing in (True, False):
        async with Client(
            store="memory", tracer_provider=traced.provider, tracing=tracing
        ) as client:
            model = ScriptedModel([tool_call("echo", {"text": "x"}, id="c1"), "done"])
            session = await open_session(client, model, echo_tool())
            await session.send_and_wait("go")
            logs.append(
                [
                    (e.type, UUID.sub("ID", e.data.model_dump_json(exclude={"duration"})))
                    for e in await session.get_events()
                    if e.type not in ("session.start",)
                ]
            )
    assert traced.named("invoke_agent")  # the first was traced
    assert logs[0] == logs[1]


_SUBPROCESS = textwrap.dedent(
    """
    import asyncio, json, sys

    def main(mode):
        if mode == "global":
            from opentelemetry import trace
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
        import trimtab
        from trimtab.testing import ScriptedModel
        loaded_on_import = "opentelemetry" in sys.modules

        async def turn():
            async with trimtab.Client(store="memory") as client:
                session = await client.create_session(provider=ScriptedModel(["hi"]))
                await session.send_and_wait("hello")

        asyncio.run(turn())
        spans = [s.name for s in exporter.get_finished_spans()] if mode == "global" else []
        print(json.dumps({
            "loaded_on_import": loaded_on_import,
            "loaded": sorted(m for m in sys.modules if m.startswith("opentelemetry")) != [],
            "spans": spans,
        }))

    main(sys.argv[1])
    """
)


def _run_subprocess(mode: str, **env: str) -> dict[str, Any]:
    environment = {**os.environ, **env}
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "src"), environment.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_tracing_example_prints_the_seed_scenarios_tree() -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "04_tracing.py"
    done = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "request",
        "  invoke_agent trimtab  (epoch=0, seeded=False)",
        "    chat demo-model",
        "    execute_tool clear_context  (outcome=success)  [session.context_cleared]",
        "      handler: clear",
        "  invoke_agent trimtab  (epoch=1, seeded=True)",
        "    chat demo-model",
    ]


def test_ot1_no_opentelemetry_loaded_when_the_application_does_not_use_it() -> None:
    result = _run_subprocess("plain", TRIMTAB_TRACING="")
    assert result == {"loaded_on_import": False, "loaded": False, "spans": []}


def test_ot1_no_opentelemetry_loaded_when_switched_off() -> None:
    result = _run_subprocess("plain", TRIMTAB_TRACING="0")
    assert result["loaded"] is False


def test_ot1_the_global_provider_gets_spans_with_no_trimtab_call() -> None:
    result = _run_subprocess("global", TRIMTAB_TRACING="")
    assert result["spans"] == ["chat default", "invoke_agent trimtab"]


def test_ot1_environment_switch_turns_the_global_provider_off() -> None:
    result = _run_subprocess("global", TRIMTAB_TRACING="0")
    assert result["spans"] == []


# --- OT8: a broken tracer, span processor, span or propagator changes nothing (issue 34) ---


class RaisingProcessor(SpanProcessor):
    """An application's span processor with a bug in `on_start` or `on_end`."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "on_start":
            raise RuntimeError("processor bug in on_start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "on_end":
            raise RuntimeError("processor bug in on_end")


class RaisingProvider(TracerProvider):
    """A tracer provider that cannot make a tracer."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        raise RuntimeError("provider bug in get_tracer")


class BrokenSpan(trace.NonRecordingSpan):
    """A span every method of which, but for its context, raises."""

    def is_recording(self) -> bool:
        return True

    def set_attribute(self, key: str, value: Any) -> None:
        raise RuntimeError("span bug in set_attribute")

    def set_attributes(self, attributes: Any) -> None:
        raise RuntimeError("span bug in set_attributes")

    def add_event(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("span bug in add_event")

    def set_status(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("span bug in set_status")

    def end(self, end_time: int | None = None) -> None:
        raise RuntimeError("span bug in end")


class BrokenTracer(trace.NoOpTracer):
    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return BrokenSpan(trace.INVALID_SPAN_CONTEXT)


class BrokenSpans(TracerProvider):
    """A tracer provider whose spans all raise."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return BrokenTracer()


def broken_provider(kind: str) -> TracerProvider:
    if kind == "get_tracer":
        return RaisingProvider()
    if kind == "span methods":
        return BrokenSpans()
    provider = TracerProvider()
    if kind in ("on_start", "on_end"):
        provider.add_span_processor(RaisingProcessor(kind))
    return provider


async def seed_scenario_log(**options: Any) -> tuple[str | None, list[str], list[tuple[str, str]]]:
    """A run with a tool call and a clear (then its seeded run): the reply, the events
    delivered live, and the log."""
    model = ScriptedModel(
        [
            tool_call("echo", {"text": "x"}, id="c1"),
            tool_call("clear_context", {"prompt": SEED}, id="c2"),
            "FRESH_CONTEXT",
        ]
    )
    async with Client(store="memory", **options) as client:
        session = await open_session(client, model, echo_tool(), clear_tool())
        live: list[str] = []
        session.on(lambda event: live.append(event.type))
        reply = await session.send_and_wait("echo, clear, then answer the seed")
        log = [
            (str(e.type), UUID.sub("ID", e.data.model_dump_json(exclude={"duration"})))
            for e in await session.get_events()
            if e.type != "session.start"
        ]
    return (reply.data.content if reply is not None else None), live, log


def tracing_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "trimtab.tracing" and r.levelno >= logging.WARNING
    ]


@pytest.fixture(autouse=True)
def _not_reported_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees tracing's first failure as the first (it is logged once a process)."""
    import trimtab._tracing

    monkeypatch.setattr(trimtab._tracing._CONTAINED, "reported", False)


@pytest.mark.parametrize("broken", ["on_start", "on_end", "get_tracer", "span methods", "context"])
async def test_ot8_a_broken_tracer_changes_nothing_a_session_does(
    broken: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    expected = await seed_scenario_log(tracing=False)
    assert expected[0] == "FRESH_CONTEXT"
    if broken == "context":  # the context API itself fails (a broken runtime context)
        from opentelemetry import context

        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("context bug")

        monkeypatch.setattr(context, "attach", fail)
        monkeypatch.setattr(context, "get_current", fail)
    got = await seed_scenario_log(tracer_provider=broken_provider(broken))
    assert got == expected  # the reply, every event live and stored, the user message
    assert got[1].count("session.idle") == 1
    assert len(tracing_warnings(caplog)) == 1  # the first failure, not one per span


async def test_ot8_a_tracing_failure_is_logged_once_not_per_span(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="trimtab.tracing")
    traced = Traced()
    traced.provider.add_span_processor(RaisingProcessor("on_end"))
    reply, _, _ = await seed_scenario_log(tracer_provider=traced.provider)
    assert reply == "FRESH_CONTEXT"
    assert len(traced.named("execute_tool")) == 2  # the spans went on being made and exported
    assert len(tracing_warnings(caplog)) == 1
    assert "processor bug in on_end" in caplog.text
    later = [r for r in caplog.records if r.name == "trimtab.tracing" and r.levelno < logging.INFO]
    assert len(later) >= 4  # each later failure at DEBUG only


def test_ot8_a_raising_propagator_carries_nothing_and_breaks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opentelemetry import propagate
    from opentelemetry.propagators.textmap import TextMapPropagator

    import trimtab._tracing

    class Raising(TextMapPropagator):
        def extract(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("propagator bug in extract")

        def inject(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("propagator bug in inject")

        @property
        def fields(self) -> set[str]:
            return {"traceparent"}

    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", Raising())
    tracing = trimtab._tracing.Tracing(provider=TracerProvider())
    assert tracing.carrier() == {}
    assert trimtab._tracing.outgoing() == {}
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trimtab._tracing.remote_parent(parent, "k=v"):
        ran = True
    assert ran
