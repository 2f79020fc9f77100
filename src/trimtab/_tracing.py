"""OpenTelemetry spans of runs, model calls and tool calls (spec OT1-OT7).

The only module that touches OpenTelemetry, and it never imports it on its own: a run is
traced once the application has loaded the API (`opentelemetry.trace` in `sys.modules`),
which configuring any SDK does, or passed a tracer provider. Until then, or when tracing is
switched off, every call here returns a shared no-op at the cost of a dictionary lookup, and
`import trimtab` stays as it was.

Spans follow the GenAI semantic conventions: `invoke_agent` per run (a seeded run after a
clear is a run of its own, C8), `chat` per model call, `execute_tool` per tool call. The run's
span is made current in the run's task, and a call's span in the call's task, so that the
spans of a tool handler (a sync one's thread included: it runs in its call's context) nest
under its `execute_tool`. Context operations (clear, compaction, truncation) become span
events on the trimtab span current where their event is emitted.

Every call into OpenTelemetry is made inside `_CONTAINED`, the one boundary between trimtab
and the application's tracing: an exception there (a span processor's, an exporter's, a
tracer provider's, a propagator's) is logged, the first at WARNING and the rest at DEBUG, and
goes no further, so that a broken tracer never changes what a session does (OT8).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any

from trimtab.events import (
    Event,
    PermissionCompletedEvent,
    SessionCompactionCompleteEvent,
    SessionContextClearedEvent,
    SessionTruncatedEvent,
    ToolExecutionCompleteEvent,
)

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from trimtab.providers import Message, ModelRequest, ModelResponse, ToolCall

__all__ = ["OFF", "ChatSpan", "RunTrace", "Tracing", "outgoing", "remote_parent"]

log = logging.getLogger("trimtab.tracing")

_PROVIDERS = {"openai-responses": "openai", "scripted": "trimtab.scripted"}
"""`Provider.name` -> `gen_ai.provider.name`, where the two differ."""

_ours: ContextVar[Span | None] = ContextVar("trimtab_span", default=None)
"""The trimtab span current in this context: where span events of context operations go
(never a host's span, which trimtab does not own)."""


class _Contained:
    """`with _CONTAINED:` around calls into OpenTelemetry: their exceptions stop here.

    (A class, not a generator: it is entered on every span's every call while tracing.)
    """

    __slots__ = ("reported",)

    def __init__(self) -> None:
        self.reported = False
        """Whether a failure was logged at WARNING already (once a process)."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _: TracebackType | None
    ) -> bool:
        if not isinstance(exc, Exception):
            return False  # none, or a cancellation or exit: never swallowed
        if self.reported:
            log.debug("OpenTelemetry failed again; trimtab goes on", exc_info=exc)
        else:
            self.reported = True
            log.warning(
                "OpenTelemetry failed inside trimtab (its spans may be incomplete; the "
                "sessions go on, and later failures are logged at DEBUG)",
                exc_info=exc,
            )
        return True


_CONTAINED = _Contained()


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trimtab")
    except PackageNotFoundError:  # (run from a source tree)
        return None


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


class Tracing:
    """How the sessions of one client trace (spec OT1).

    Args:
        enabled: trace at all; None reads `TRIMTAB_TRACING` (default on).
        content: record message contents and tool arguments and results; None reads
            `TRIMTAB_TRACING_CONTENT` (default off).
        provider: the `TracerProvider` to use; None uses the global one.
    """

    __slots__ = ("content", "enabled", "_provider", "_tracer")

    def __init__(
        self,
        enabled: bool | None = None,
        *,
        content: bool | None = None,
        provider: TracerProvider | None = None,
    ) -> None:
        self.enabled = _env_flag("TRIMTAB_TRACING", True) if enabled is None else enabled
        self.content = _env_flag("TRIMTAB_TRACING_CONTENT", False) if content is None else content
        self._provider = provider
        self._tracer: Tracer | None = None

    def tracer(self) -> Tracer | None:
        """The tracer, or None while nothing could record a span (OT1)."""
        if self._tracer is not None or not self.enabled:
            return self._tracer
        if self._provider is None and "opentelemetry.trace" not in sys.modules:
            return None  # the application has not loaded OpenTelemetry: no SDK, no parent
        from opentelemetry import trace

        with _CONTAINED:
            # (A tracer of the global provider proxies to whatever SDK is configured later.)
            provider = self._provider or trace.get_tracer_provider()
            self._tracer = provider.get_tracer("trimtab", _version())
        return self._tracer

    def parent(self) -> Context | None:
        """The caller's context, captured when it sends: its run executes in another task."""
        if self.tracer() is None:
            return None
        from opentelemetry import context

        with _CONTAINED:
            return context.get_current()
        return None

    def carrier(self) -> dict[str, str]:
        """The current trace context as W3C headers, for a tool call a client runs: its
        handler's spans nest under the call's span (OT5)."""
        return outgoing() if self.tracer() is not None else {}

    def run(self, session_id: str, provider: str, parent: Context | None) -> RunTrace:
        """The spans of one `send`'s runs, under `parent` (OT2)."""
        tracer = self.tracer()
        if tracer is None:
            return _OFF_RUN
        return RunTrace(tracer, session_id, _PROVIDERS.get(provider, provider), parent)

    def chat(
        self, request: ModelRequest, tokens: int, session_id: str, provider: str
    ) -> ChatSpan | _OffChat:
        """The `chat` span of one model call (OT3)."""
        tracer = self.tracer()
        if tracer is None:
            return _OFF_CHAT
        from opentelemetry.trace import SpanKind

        provider = _PROVIDERS.get(provider, provider)
        span: Span | None = None
        with _CONTAINED:
            span = tracer.start_span(
                f"chat {request.model}",
                kind=SpanKind.CLIENT,
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": provider,
                    "gen_ai.system": provider,
                    "gen_ai.request.model": request.model,
                    "gen_ai.conversation.id": session_id,
                },
                record_exception=False,
                set_status_on_exception=False,
            )
        if span is None:
            return _OFF_CHAT
        with _CONTAINED:
            if span.is_recording():
                span.set_attributes(
                    {
                        "trimtab.request.messages": len(request.messages),
                        "trimtab.request.tools": len(request.tools),
                        "trimtab.request.estimated_tokens": tokens,
                    }
                )
                if request.max_tokens is not None:
                    span.set_attribute("gen_ai.request.max_tokens", request.max_tokens)
                if self.content:
                    span.set_attribute("gen_ai.input.messages", _messages(request.messages))
        return ChatSpan(span, self.content)

    def tool(self, call: ToolCall, arguments: object, turn_id: str) -> AbstractContextManager[None]:
        """The `execute_tool` span of one call, current in the call's task, so that its
        handler's spans nest under it (OT4). Its outcome comes from the call's events."""
        tracer = self.tracer()
        if tracer is None:
            return _OFF_TOOL
        span: Span | None = None
        with _CONTAINED:
            span = tracer.start_span(
                f"execute_tool {call.name}",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": call.name,
                    "gen_ai.tool.call.id": call.id,
                    "gen_ai.tool.type": "function",
                    "trimtab.turn.id": turn_id,
                },
                record_exception=False,
                set_status_on_exception=False,
            )
        if span is None:
            return _OFF_TOOL
        if self.content:
            with _CONTAINED:
                if span.is_recording():
                    span.set_attribute("gen_ai.tool.call.arguments", _json(arguments))
        return _Current(span, ours=True)

    @staticmethod
    def found(names: Sequence[str]) -> None:
        """A span event for the tools a `tool_search` call made callable (OT6)."""
        span = _ours.get()
        if span is not None and names:
            with _CONTAINED:
                span.add_event("tool_search", {"trimtab.tools_found": list(names)})

    def note(self, events: Sequence[Event]) -> None:
        """What `events`, just stored, tell the trimtab span current where they were emitted:
        a call's permission decision and outcome (OT4), context operations (OT6)."""
        if self._tracer is None:
            return
        span = _ours.get()
        if span is None:
            return
        with _CONTAINED:
            _note(span, events, self.content)


def _note(span: Span, events: Sequence[Event], content: bool) -> None:
    """`Tracing.note` on `span`."""
    for event in events:
        match event:
            case PermissionCompletedEvent(data=data):
                span.set_attribute("trimtab.permission.decision", data.result.kind)
            case ToolExecutionCompleteEvent(data=data):
                span.set_attribute("trimtab.tool.outcome", data.outcome)
                if not data.success:
                    _fail(span, data.outcome)
                if content:
                    result = data.result.content if data.result else ""
                    text = data.error.message if data.error else result
                    span.set_attribute("gen_ai.tool.call.result", text)
            case SessionContextClearedEvent(data=data):
                span.add_event(
                    "session.context_cleared",
                    {"trimtab.messages_cleared": data.messages_cleared},
                )
            case SessionCompactionCompleteEvent(data=data):
                span.add_event(
                    "session.compaction",
                    {
                        "trimtab.compaction.success": data.success,
                        "trimtab.compaction.trigger": data.trigger,
                        "trimtab.messages_removed": data.messages_removed,
                        "trimtab.tokens_removed": data.tokens_removed,
                    },
                )
            case SessionTruncatedEvent(data=data):
                span.add_event(
                    "session.truncated",
                    {
                        "trimtab.truncated.event_id": data.event_id,
                        "trimtab.events_removed": data.events_removed,
                    },
                )
            case _:
                pass


def outgoing() -> dict[str, str]:
    """The current trace context as W3C headers (`traceparent`, `tracestate`) for the wire;
    none while the application has not loaded OpenTelemetry (OT5)."""
    if "opentelemetry.trace" not in sys.modules:
        return {}
    from opentelemetry import propagate

    headers: dict[str, str] = {}
    with _CONTAINED:
        propagate.inject(headers)
    return {k: v for k, v in headers.items() if k in ("traceparent", "tracestate")}


@contextmanager
def remote_parent(traceparent: str | None, tracestate: str | None) -> Iterator[None]:
    """Make a W3C trace context received over the wire current, so that a `send` made inside
    captures it as its run's parent (spec OT5)."""
    if not traceparent or "opentelemetry.trace" not in sys.modules:
        yield
        return
    from opentelemetry import context, propagate

    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    token: Token[Context] | None = None
    with _CONTAINED:
        token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        if token is not None:
            with _CONTAINED:
                context.detach(token)


OFF = Tracing(False)
"""Tracing switched off: what a session made without a client uses."""


class _Current:
    """A span current in this task from `__enter__` (trimtab's own too, for the span events
    of OT6, when `ours`) until `close`, which ends it."""

    __slots__ = ("_ours", "_span", "_tokens")

    def __init__(self, span: Span, *, ours: bool) -> None:
        self._span = span
        self._ours = ours
        self._tokens: tuple[Token[Context] | None, Token[Span | None] | None] = (None, None)

    def __enter__(self) -> Any:
        from opentelemetry import context, trace

        attached = None
        with _CONTAINED:
            attached = context.attach(trace.set_span_in_context(self._span))
        self._tokens = (attached, _ours.set(self._span) if self._ours else None)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        self.close()

    def close(self) -> None:
        from opentelemetry import context

        (attached, ours), self._tokens = self._tokens, (None, None)
        if ours is not None:
            _ours.reset(ours)
        if attached is not None:
            with _CONTAINED:
                context.detach(attached)
        with _CONTAINED:
            self._span.end()


class RunTrace:
    """The `invoke_agent` spans of one `send` (OT2): its run, and a seeded run after a clear."""

    __slots__ = ("_current", "_parent", "_previous", "_provider", "_session", "_span", "_tracer")

    def __init__(
        self, tracer: Tracer | None, session_id: str, provider: str, parent: Context | None
    ) -> None:
        self._tracer = tracer
        self._session = session_id
        self._provider = provider
        self._parent = parent
        self._span: Span | None = None
        self._current: _Current | None = None
        self._previous: Span | None = None

    def start(self, epoch: int, model: str | None, *, seeded: bool = False) -> None:
        """Open a run's span (ending the one before: a seeded run follows its clear's) and make
        it current in the run's task."""
        if self._tracer is None:
            return
        from opentelemetry import context, trace

        self._close()
        # No sender's context (an input from the store's inbox, a crash's continuation): a
        # trace of its own, not whatever context the session's worker task inherited.
        parent = self._parent if self._parent is not None else context.Context()
        with _CONTAINED:
            links = [trace.Link(self._previous.get_span_context())] if self._previous else None
            self._span = self._tracer.start_span(
                "invoke_agent trimtab",
                context=parent,
                kind=trace.SpanKind.INTERNAL,
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": "trimtab",
                    "gen_ai.provider.name": self._provider,
                    "gen_ai.conversation.id": self._session,
                    "gen_ai.request.model": model or "default",
                    "trimtab.context.epoch": epoch,
                    "trimtab.run.seeded": seeded,
                },
                links=links,
                record_exception=False,
                set_status_on_exception=False,
            )
        if self._span is not None:
            self._current = _Current(self._span, ours=True).__enter__()

    def end(self, *, error: str | None = None, aborted: bool = False) -> None:
        """Close the last run's span: an error sets its status, an abort is marked (OT2)."""
        span = self._span
        if span is None:
            return
        with _CONTAINED:
            if aborted:
                span.set_attribute("trimtab.run.aborted", True)
            if error is not None:
                _fail(span, error)
        self._close()

    def _close(self) -> None:
        if self._current is not None:
            self._current.close()
        if self._span is not None:
            self._previous = self._span
        self._span, self._current = None, None


_OFF_RUN = RunTrace(None, "", "", None)
_OFF_TOOL: AbstractContextManager[None] = nullcontext()


class ChatSpan(_Current):
    """An open `chat` span, current while the provider answers (an instrumented HTTP client's
    spans nest under it): the response, or the failure, completes it."""

    __slots__ = ("_content",)

    def __init__(self, span: Span, content: bool) -> None:
        super().__init__(span, ours=False)
        self._content = content

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        with _CONTAINED:
            if isinstance(exc, asyncio.CancelledError):
                self._span.set_attribute("trimtab.run.aborted", True)  # not the model's error
            elif exc is not None:
                _fail(self._span, getattr(exc, "error_type", None) or type(exc).__qualname__, exc)
        self.close()

    def response(self, response: ModelResponse) -> None:
        with _CONTAINED:
            self._describe(response)

    def _describe(self, response: ModelResponse) -> None:
        span = self._span
        if not span.is_recording():
            return
        usage = response.usage
        attributes: dict[str, Any] = {
            "trimtab.response.chars": len(response.content),
            "trimtab.response.tool_calls": len(response.tool_calls),
        }
        if response.finish_reason is not None:
            attributes["gen_ai.response.finish_reasons"] = [response.finish_reason]
        if usage.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
        if usage.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        if self._content:
            attributes["gen_ai.output.messages"] = _output(response)
        span.set_attributes(attributes)


class _OffChat:
    """`ChatSpan` while nothing records: no span, nothing to do."""

    __slots__ = ()

    def __enter__(self) -> _OffChat:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def response(self, response: ModelResponse) -> None:
        return None


_OFF_CHAT = _OffChat()


def _fail(span: Span, error_type: str, exc: BaseException | None = None) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, str(exc) if exc is not None else error_type))


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _messages(messages: Sequence[Message]) -> str:
    """The window in the conventions' message shape: a role and its parts."""
    return _json([_message(m) for m in messages])


def _message(message: Message) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if message.role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": message.tool_call_id, "response": message.content}
        )
    elif message.content:
        parts.append({"type": "text", "content": message.content})
    return {"role": message.role, "parts": parts + _calls(message.tool_calls)}


def _output(response: ModelResponse) -> str:
    parts = [{"type": "text", "content": response.content}] if response.content else []
    message = {
        "role": "assistant",
        "parts": parts + _calls(response.tool_calls),
        "finish_reason": response.finish_reason,
    }
    return _json([message])


def _calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments} for c in calls
    ]
