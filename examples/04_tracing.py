"""The seed scenario, traced: trimtab's OpenTelemetry spans, printed as a tree.

The application configures the OpenTelemetry SDK as usual (here an in-memory exporter, to
print the spans at the end; any exporter works: OTLP, console). trimtab needs no call of its
own: it traces as soon as OpenTelemetry is loaded. The model is scripted, so this runs offline.

Run it: `pip install '.[otel]' opentelemetry-sdk && python examples/04_tracing.py`
"""

from __future__ import annotations

import asyncio

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from trimtab import Client, PermissionHandler, ToolInvocation, define_tool
from trimtab.testing import ScriptedModel, tool_call

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("example")

SHOWN = ("trimtab.context.epoch", "trimtab.run.seeded", "trimtab.tool.outcome")


class ClearArgs(BaseModel):
    prompt: str


async def clear_context(params: ClearArgs, invocation: ToolInvocation) -> str:
    with tracer.start_as_current_span("handler: clear"):  # nests under execute_tool
        result = await invocation.session.history.clear_context(params.prompt)
    return f"Cleared {result.messages_cleared} messages."


def show(span: ReadableSpan, spans: list[ReadableSpan], depth: int = 0) -> None:
    """Print `span`, its attributes of interest and its events, then its children."""
    attributes = span.attributes or {}
    line = "  " * depth + span.name
    details = [f"{key.split('.')[-1]}={attributes[key]!s}" for key in SHOWN if key in attributes]
    if details:
        line += f"  ({', '.join(details)})"
    if span.events:
        line += f"  [{', '.join(event.name for event in span.events)}]"
    print(line)
    assert span.context is not None
    for child in spans:
        if child.parent is not None and child.parent.span_id == span.context.span_id:
            show(child, spans, depth + 1)


async def main() -> None:
    model = ScriptedModel(
        [
            tool_call("clear_context", {"prompt": "Reply with exactly FRESH_CONTEXT."}),
            "FRESH_CONTEXT",
        ]
    )
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=model,
            model="demo-model",
            on_permission_request=PermissionHandler.approve_all,
            tools=[define_tool("clear_context", handler=clear_context, is_terminal=True)],
        )
        with tracer.start_as_current_span("request"):
            await session.send_and_wait("Clear the context, then answer the seed.")
    spans = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
    for root in (s for s in spans if s.parent is None):
        show(root, spans)


if __name__ == "__main__":
    asyncio.run(main())
