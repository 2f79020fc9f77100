"""Spec OT5, issue 19: the trace context crosses `trimtab serve` both ways. The client's span
around `send_and_wait` is the parent of the server's run, and a client's tool handler runs in
the context of the server's `execute_tool` span (the Copilot wire's `traceparent` fields).

The server is a real subprocess whose OpenTelemetry SDK a `sitecustomize` configures (as
`opentelemetry-instrument` does), writing its finished spans as JSON lines to a file.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.requirements import require_import
from tests.server.conftest import (
    MakeDriver,
    StartServer,
    assistant,
    call,
    conversation,
    provider,
    tool,
    user,
)
from tests.server.drivers import Ctx, ToolSpec
from trimtab.testing import ReplayServer

require_import("opentelemetry.sdk", "needs the OpenTelemetry SDK (in the dev extra)")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402

SITECUSTOMIZE = textwrap.dedent(
    """
    import os

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    _out = open(os.environ["TRIMTAB_TEST_SPANS"], "a", encoding="utf-8")
    _provider = TracerProvider()
    _provider.add_span_processor(
        SimpleSpanProcessor(
            ConsoleSpanExporter(out=_out, formatter=lambda span: span.to_json(indent=None) + "\\n")
        )
    )
    trace.set_tracer_provider(_provider)
    """
)


class TextArgs(BaseModel):
    text: str


@pytest.fixture(params=["official-tcp", "trimtab-remote"])
def transport(request: pytest.FixtureRequest) -> str:
    """The clients that connect to a server the test starts (stdio spawns its own)."""
    param: str = request.param
    return param


def read_spans(path: Path, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    """The server's finished spans, once `count` of them are written."""
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return [json.loads(line) for line in lines]
        time.sleep(0.05)


async def test_ot5_trace_context_crosses_the_server_both_ways(
    make_driver: MakeDriver, start_server: StartServer, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    spans_file = tmp_path / "spans.jsonl"
    env = {
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "TRIMTAB_TEST_SPANS": str(spans_file),
    }
    server = start_server(None, env=env)

    handler_contexts: list[trace.SpanContext] = []

    async def where(params: TextArgs, ctx: Ctx) -> str:
        handler_contexts.append(trace.get_current_span().get_span_context())
        return params.text

    host_tracer = TracerProvider().get_tracer("host")
    chat = conversation(
        user("Use echo on hi"),
        assistant(None, call("call_1", "echo", text="hi")),
        tool("call_1", "hi"),
        assistant("Done."),
    )
    async with ReplayServer([chat]) as model:
        driver = await make_driver(server)
        session = await driver.open(provider(model), tools=[ToolSpec("echo", TextArgs, where)])
        with host_tracer.start_as_current_span("host request") as host:
            assert await session.send_and_wait("Use echo on hi") == "Done."

    spans = {s["name"]: s for s in read_spans(spans_file, 4)}
    assert {"invoke_agent trimtab", "chat test-model", "execute_tool echo"} <= set(spans)
    host_context = host.get_span_context()
    run = spans["invoke_agent trimtab"]
    assert run["context"]["trace_id"] == f"0x{host_context.trace_id:032x}"
    assert run["parent_id"] == f"0x{host_context.span_id:016x}"
    call_span = spans["execute_tool echo"]
    assert call_span["parent_id"] == run["context"]["span_id"]
    (handler,) = handler_contexts
    assert f"0x{handler.span_id:016x}" == call_span["context"]["span_id"]
    assert f"0x{handler.trace_id:032x}" == run["context"]["trace_id"]
    requested = session.of("external_tool.requested")[0]["data"]
    assert requested["traceparent"].split("-")[2] == f"{handler.span_id:016x}"
