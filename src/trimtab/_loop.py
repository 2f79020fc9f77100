"""One run: turns, batches, permissions, and the terminal and clear rules of the spec.

The loop never touches storage or subscribers: it hands every event to `LoopHost.emit_all`
(the session's log, its only writer) and reads what the log says back from its state. What
a turn works with (configuration, provider, tools, policy, hooks) is one `RunContext`, which
the host builds at the turn's start.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Protocol, TypeVar

from trimtab._budget import usage_info, usage_of
from trimtab._budget import verdict as budget_verdict
from trimtab._compaction import fit_window, raw_request_tokens, recover_overflow
from trimtab._errors import LeaseLostError, ProviderError, StoreUnavailableError, contained
from trimtab._handoff import hand_off
from trimtab._hooks import SUPPRESSED, Hooks
from trimtab._permissions import (
    APPROVED,
    CANCELLED,
    NO_HANDLER,
    Approval,
    ask_permission,
)
from trimtab._run_context import RunContext, Writer, emit
from trimtab._runs import RunEnd
from trimtab._tools import (
    MAX_TOOL_NAME,
    TOOL_NAME,
    CallOutcome,
    ExternalTool,
    Tool,
    ToolInvocation,
    failed_call,
    parse_arguments,
    valid_text,
)
from trimtab._tracing import RunTrace
from trimtab.events import (
    AbortEvent,
    AssistantMessageData,
    AssistantMessageDeltaData,
    AssistantMessageDeltaEvent,
    AssistantMessageEvent,
    AssistantTurnEndEvent,
    AssistantTurnStartEvent,
    AssistantUsageEvent,
    ContextClearedData,
    Event,
    ExternalToolCompletedData,
    ExternalToolCompletedEvent,
    ExternalToolRequestedData,
    ExternalToolRequestedEvent,
    PermissionCompletedData,
    PermissionCompletedEvent,
    PermissionRequestData,
    PermissionRequestedData,
    PermissionRequestedEvent,
    PermissionResultData,
    SessionContextClearedEvent,
    SessionErrorData,
    SessionErrorEvent,
    SessionIdleData,
    SessionIdleEvent,
    SessionUsageInfoEvent,
    SessionWarningEvent,
    ToolExecutionCompleteData,
    ToolExecutionCompleteEvent,
    ToolExecutionStartData,
    ToolExecutionStartEvent,
    ToolOutcome,
    ToolRequest,
    ToolResultContent,
    ToolResultError,
    TurnData,
    UserMessageData,
    UserMessageEvent,
    new_id,
    now,
)
from trimtab.providers import ModelRequest, ModelResponse, TextDelta, ToolCall

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from trimtab._state import SessionState, Wait

__all__ = [
    "INTERRUPTED",
    "MAX_CALLS_PER_TURN",
    "Interrupted",
    "LoopHost",
    "LoopState",
    "StagedClear",
    "at_rest",
    "cancelled",
    "cleared",
    "awaited_by",
    "current_tool_call",
    "end_of_failed_run",
    "end_of_interrupted_run",
    "run",
    "user_message",
]

log = logging.getLogger("trimtab")

_T = TypeVar("_T")

current_tool_call: ContextVar[tuple[str, str] | None] = ContextVar(
    "trimtab_current_tool_call", default=None
)
"""`(session id, call id)` of the tool call whose handler runs in this context: what a
`clear_context` call belongs to (spec C1). Call ids are the model's, unique only per session."""

awaited_by: ContextVar[str | None] = ContextVar("trimtab_awaited_by", default=None)
"""The session whose run awaits the host code running in this context (a tool handler, a
permission handler, a hook): a wait for that run's end from here could only wait for itself
(spec C11)."""

MAX_CALLS_PER_TURN = 256
"""The most tool calls one answer of the model may make (models make a few at a time)."""

INTERRUPTED = "The execution of this tool, or a previous tool was interrupted."
"""What the model reads for a `cancelled` call: the reference Copilot runtime's words, so that
conversations recorded against it replay unchanged (spec D7)."""


_NO_TOOLS: frozenset[str] = frozenset()
_NOT_IN_FLIGHT: Mapping[str, str] = MappingProxyType({})
_NO_WAITS: Mapping[str, Wait] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class StagedClear:
    prompt: str
    messages_cleared: int
    tool_call_id: str
    """The enclosing call: the clear commits if and only if this call succeeds (C6, C7)."""


@dataclass(slots=True)
class LoopState:
    """The loop's live state that the session's `clear_context` needs to see."""

    in_flight: Mapping[str, str] = field(default_factory=lambda: _NOT_IN_FLIGHT)
    """Tool calls whose handler is running: call id -> tool name, in start order; replaced
    on change, so that the empty one is shared."""
    staged: StagedClear | None = None
    discovered: frozenset[str] = _NO_TOOLS
    """Deferred tools found by `tool_search`, callable for the rest of the window's run.

    A frozen set, replaced on change, so that the empty one is shared."""
    steering: tuple[UserMessageEvent, ...] = ()
    """Messages sent with `mode="immediate"` while the run is in flight, for its next model
    call (spec X6): each is an input waiting in the store's inbox until it is logged."""


class LoopHost(Writer, Protocol):
    """What the loop needs from the session it runs for: its log (`Writer`), the loop's own
    live state, a fresh `RunContext` at each turn's start, and the tools' refresh."""

    @property
    def live(self) -> LoopState:
        """What the session's `clear_context` needs to see of the run (calls in flight)."""
        ...

    def context(self) -> RunContext:
        """What the next turn works with, as things stand now."""
        ...

    async def refresh_tools(self) -> None:
        """Take in changes of the session's tool source (its MCP servers) between turns."""
        ...

    async def steer(self) -> None:
        """Log the steering messages waiting in `live.steering` (spec X6), each claiming its
        input in the inbox. The lane is taken with the writer held, so that an edit of a
        steering message (made with the writer held too) is either in what is logged or
        refused, never lost between the lane and the log."""
        ...


@dataclass(frozen=True, slots=True)
class Interrupted:
    """What a crash left of a run, for the run to go on from (spec P3, C10)."""

    turn_id: str | None
    """The turn left open, which is closed first."""
    calls: tuple[ToolCall, ...] = ()
    """Calls started and never completed that run again."""
    waiting: Mapping[str, Wait] = field(default_factory=lambda: _NO_WAITS)
    """Calls of `calls` that go on from the question they had announced (a permission
    request, an external tool's request), by call id, waiting for its answer rather than
    asking it again: a run an engine parked (spec EN5)."""


async def run(
    host: LoopHost,
    message_id: str,
    *,
    interrupted: Interrupted | None = None,
    aborted: bool = False,
    started: str | None = None,
    parent: Context | None = None,
) -> RunEnd:
    """Run one `send`, whose `user.message` the host has logged, to its end, including any
    seeded run (C8). The host emits the run's one `session.idle` once this returns (spec E1),
    outside the run's task, so that no abort can take it away.

    With `interrupted`, the run continues a crashed one instead: its unfinished calls run
    again, its open turn is closed, and the loop goes on from there. With `aborted` (an
    `abort()` that came before the run started) it ends at once, as an abort. `started` is
    the id of the run's first turn when the host logged its `assistant.turn_start` with the
    `user.message` (nothing had to come between them). `parent` is the trace context of
    whoever sent (spec OT2).
    """
    result = RunEnd(message_id)
    live = host.live
    live.staged, live.discovered = None, _NO_TOOLS
    trace, hooks = _traced(host.context(), host.state.epoch, parent)
    failure: str | None = None
    try:
        if aborted:
            await _stop_unstarted(host, started)
        step: _Step = await _finish_turn(host, interrupted) if interrupted else "continue"
        turns, stopped, request = 0, False, host.context().prompt
        while step != "end":
            if isinstance(step, _Seed):
                turns = 0  # the seeded run is a run of its own (C8)
                trace.start(host.state.epoch, host.state.config.model, seeded=True)
                request = step.request or step.prompt
                if not step.recorded:
                    await emit(host, user_message(step.prompt, new_id(), "context_cleared"))
            if (refusal := await _limit(host, turns, message_id, started)) is not None:
                result.error = refusal
                break
            step = await _turn(host, message_id, result, started, request)
            turns, started = turns + 1, None
            if step == "end" and result.error is None and hooks:
                # An `agentStop` hook may keep the run going, as a user message of the same
                # run (the turns still count against max_turns).
                reason = await _awaited(host.context(), hooks.agent_stop(stopped))
                if reason is not None:
                    await emit(host, user_message(valid_text(reason), message_id, "agent_stop"))
                    step, stopped = "continue", True
        if result.error is not None:
            stored = await emit(host, result.error)
            assert isinstance(stored, SessionErrorEvent)
            result.error = stored
    except asyncio.CancelledError:
        # Abort: the run ends here, but the session lives on and still gets its one idle.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        if host.state.run_id is not None:  # (an abort after its last turn changes nothing)
            result.aborted = True
            await _abort(host)
    except Exception as exc:
        failure = type(exc).__qualname__  # the log cannot be written: the runner reports it
        raise
    finally:
        live.staged = None
        if result.error is not None:
            failure = result.error.data.error_type
        trace.end(error=failure, aborted=result.aborted)
    return result


async def _limit(
    host: LoopHost, turns: int, message_id: str, started: str | None
) -> SessionErrorEvent | None:
    """The error that ends the run before its next model call, if a limit says so: its
    model calls (`max_turns`, E5), its invalid results (OUT3), its budget or the session's
    (U3), as the log tells them; the budgets' warnings are logged first (U4). The one place
    a run's limits are checked, once per model call. A turn logged with the run's message
    (`started`, E7) is closed before the error."""
    state = host.state
    error: SessionErrorEvent | None = None
    run = state.run
    if turns >= state.config.max_turns:
        text = f"the run made {turns} model calls, its limit (max_turns); send again to go on"
        error = _error_event("max_turns", text, None, True, message_id)
    elif (
        run is not None and run.output is not None and run.invalid_outputs >= run.output.max_invalid
    ):
        why = run.output_error or "a reply without the result"
        text = _invalid_output(run.invalid_outputs, why)
        error = _error_event("invalid_output", text, None, False, message_id)
    elif (verdict := budget_verdict(state, now())).exceeded is not None:
        error = _error_event("budget_exceeded", verdict.exceeded, None, False, message_id)
    elif verdict.warnings:
        await host.emit_all([SessionWarningEvent(data=warning) for warning in verdict.warnings])
    if error is not None and started is not None:
        await emit(host, _turn_end(started, state.config.model))
    return error


def _invalid_output(count: int, why: str) -> str:
    return f"the model gave {count} invalid results (max_invalid_outputs); the last one: {why}"


async def _abort(host: LoopHost) -> None:
    """End the run in progress as aborted."""
    state = host.state
    if state.unfinished_calls:
        # Calls a crash or a park left, aborted before the run took them up again: they
        # end too, and their turn (O1).
        await host.emit_all(_left_at_rest(state))
    if state.pending_seed is not None and not state.seed_recorded:
        # A committed clear stays committed: its seed is kept in the fresh window (not
        # answered: the user stopped the run), never silently lost (C12).
        await emit(host, user_message(state.pending_seed, new_id(), "context_cleared"))
    await emit(host, AbortEvent())


def _traced(ctx: RunContext, epoch: int, parent: Context | None) -> tuple[RunTrace, Hooks]:
    """The run's trace, started, and its hooks (what the run needs of its first context)."""
    trace = ctx.tracing.run(ctx.session_id, ctx.provider.name, parent)
    trace.start(epoch, ctx.config.model)
    return trace, ctx.hooks


async def _stop_unstarted(host: LoopHost, started: str | None) -> NoReturn:
    """End a run an `abort()` stopped before it started: its turn, when it was logged with
    its message, ends first."""
    if started is not None:
        await emit(host, _turn_end(started, host.state.config.model))
    raise asyncio.CancelledError


async def _finish_turn(host: LoopHost, interrupted: Interrupted) -> _Step:
    """Re-run the calls a crash interrupted (their start events are logged already), close
    the turn it left open, and go on as the log says (the seed of a clear committed before
    the crash comes next, C10)."""
    try:
        await host.refresh_tools()
        if interrupted.calls:
            ctx = host.context()
            turn_id = interrupted.turn_id or ""
            calls, waiting = interrupted.calls, interrupted.waiting
            await _run_batch(ctx, host, calls, turn_id, started=True, waiting=waiting)
    finally:
        if interrupted.turn_id is not None:
            end = AssistantTurnEndEvent(data=TurnData(turn_id=interrupted.turn_id))
            await emit(host, end)
    return _next_step(host.state)


def user_message(content: str, message_id: str | None, source: str) -> UserMessageEvent:
    return UserMessageEvent(
        data=UserMessageData(content=content, message_id=message_id, source=source)
    )


@dataclass(frozen=True, slots=True)
class _Seed:
    prompt: str
    recorded: bool
    """Its `user.message` is logged already (a crash came after it, C10)."""
    request: str | None = None
    """What the seeded run works on, for a handoff of its own to carry over (X5): the seed
    itself, unless the seed is a handoff's, which carries the run's request."""


_Step = Literal["end", "continue"] | _Seed
"""What follows a turn: the run ends, another turn, or the seeded run of a committed clear."""


async def _turn(
    host: LoopHost,
    message_id: str,
    result: RunEnd,
    started: str | None = None,
    request: str | None = None,
) -> _Step:
    """One model call and its batch, bracketed by turn_start / turn_end (`started`: the
    turn's start is logged already, with the run's user message). Before it the window is
    handed off (X5, which makes this the seeded run's turn instead: `request` is what it
    carries over) or fitted."""
    await host.refresh_tools()  # (started: no tool source, so nothing it could log)
    ctx = host.context()
    if started is None:
        await _steer(host)
        handed = await hand_off(ctx, host, request)
        if handed is not None:
            host.live.discovered = _NO_TOOLS  # a fresh window, as a new session's (C8)
            return _Seed(handed[0], recorded=True, request=handed[1])
        await fit_window(ctx, host)
    model = ctx.config.model
    turn_id = started or str(host.state.turns)
    writable = True
    try:
        if started is None:
            # (An emit is never half done: aborted during it, the turn is started, and ends.)
            await emit(host, turn_start(turn_id, model))
        calls = await _reply(ctx, host, result, message_id, turn_id)
        if calls:
            await _run_batch(ctx, host, calls, turn_id)
    except BaseException as exc:
        # An abort or a failure still closes the turn; a store that failed is not asked
        # again (each try would wait out its timeout): the next input closes it (W2).
        writable = not _cannot_write(exc)
        raise
    finally:
        # Closed here unless the log has it closed (a reply that calls nothing closes it in
        # its own append, which an abort cannot cut in two).
        if writable and host.state.open_turn == turn_id:
            await emit(host, _turn_end(turn_id, model))
    return "end" if calls is None else _next_step(host.state)


async def _steer(host: LoopHost) -> None:
    """Log the steering messages sent since the last model call, so that the next one reads
    them after the batch's results (spec X6)."""
    if host.live.steering:
        await host.steer()


async def _reply(
    ctx: RunContext, log: Writer, result: RunEnd, message_id: str, turn_id: str
) -> tuple[ToolCall, ...] | None:
    """Call the model and record its answer: the reply, its usage and the request's size in
    one append, with the turn's end when it calls nothing (an emit is never half done: an
    abort during it still stores the end, not to be stored again). The calls it makes, or
    None when the model failed (`result.error` says how)."""
    answer = await _answer(ctx, log, message_id, turn_id)
    if _too_long(answer) and await recover_overflow(ctx, log):
        answer = await _answer(ctx, log, message_id, turn_id)  # once (spec X2)
    if isinstance(answer, SessionErrorEvent):
        result.error = answer
        return None
    events, calls = answer
    checked: _Checked | None = None
    if not calls:
        checked = _checked(ctx, log.state, events[0], message_id)
        if checked is not None:
            events = (checked.reply, *events[1:])
        events += (_turn_end(turn_id, ctx.config.model),)
        if checked is not None and checked.retry is not None:
            events += (checked.retry,)
    message = (await log.emit_all(events))[0]
    assert isinstance(message, AssistantMessageEvent)
    result.last_message = message
    if checked is not None and checked.failed is not None:
        result.error = _error_event("invalid_output", checked.failed, None, False, message_id)
        return None
    return calls


@dataclass(frozen=True, slots=True)
class _Checked:
    """A reply without calls in a run that must give a typed result (OUT3, OUT6)."""

    reply: AssistantMessageEvent
    """The reply, with the result when it is one (native structured output)."""
    retry: UserMessageEvent | None = None
    """What the model is told, to try again."""
    failed: str | None = None
    """Why the run ends: it was the last invalid result the run may see."""


def _checked(
    ctx: RunContext, state: SessionState, reply: Event, message_id: str
) -> _Checked | None:
    """How a reply that calls nothing stands to the run's typed result; None when the run
    must give none."""
    output, run = ctx.output, state.run
    if output is None or run is None:
        return None
    assert isinstance(reply, AssistantMessageEvent)
    spec = output.spec
    if spec.native:
        result = output.reply(reply.data.content)
        if not isinstance(result, str):
            data = reply.data.model_copy(update={"output": result})
            return _Checked(reply.model_copy(update={"data": data}))
        why, again = result, f"Your reply is not a valid result:\n{result}\n{_NATIVE_AGAIN}"
    else:
        why = f"a reply in text, not a call of {spec.tool_name}"
        again = f"Give the result by calling the {spec.tool_name} tool: a reply in text is none."
    count = run.invalid_outputs + 1
    if count >= spec.max_invalid:
        return _Checked(reply, failed=_invalid_output(count, why))
    return _Checked(reply, retry=user_message(again, message_id, "output"))


_NATIVE_AGAIN = "Reply with the result alone, as JSON that follows the schema."


async def _answer(
    ctx: RunContext, log: Writer, message_id: str, turn_id: str
) -> tuple[tuple[Event, ...], tuple[ToolCall, ...]] | SessionErrorEvent:
    """The model's answer as the events that record it (the reply, its usage and the
    request's size, stored in one append) and the calls it makes; or the error that ends
    the run."""
    # The window as the request has it; `session.usage_info` is made of it once answered,
    # in the model's tokens as calibrated so far (X1).
    state = log.state
    limit, estimated = ctx.limits.context_window, raw_request_tokens(ctx, state)
    tokens = round(estimated * state.token_ratio(ctx.usage_model))
    length = len(state.window())
    reply_id = new_id()
    try:
        response, duration = await _call_model(ctx, log, reply_id, estimated)
    except ProviderError as exc:
        text = valid_text(exc.message)
        return _error_event(exc.error_type, text, exc.status_code, exc.retryable, message_id)
    except BaseException as exc:  # a provider bug must not take the runtime down
        if not contained(exc):
            raise
        text = valid_text(f"{type(exc).__name__}: {exc}")
        return _error_event("internal", text, None, False, message_id)
    if len(response.tool_calls) > MAX_CALLS_PER_TURN:
        # Its calls would all start at once, and their events cost the loop time as the
        # square of their number: refused, as a malformed answer is (M2).
        text = (
            f"the model called {len(response.tool_calls)} tools in one answer;"
            f" at most {MAX_CALLS_PER_TURN} are run"
        )
        return _error_event("bad_response", text, None, True, message_id)
    calls = _distinct(response.tool_calls)
    model = ctx.config.model
    reply = AssistantMessageData(
        message_id=reply_id,
        content=valid_text(response.content),
        tool_requests=[_request(c) for c in calls] or None,
        originating_message_id=message_id,
        turn_id=turn_id,
        model=model,
        reasoning_text=valid_text(response.reasoning) if response.reasoning else None,
    )
    usage = usage_of(
        ctx.config,
        ctx.usage_model,
        response.usage,
        duration=duration,
        finish_reason=response.finish_reason,
        reasoning_effort=ctx.config.reasoning_effort,
        estimated_tokens=estimated,
    )
    info = usage_info(log.state, usage, limit=limit, tokens=tokens, length=length)
    events = (
        AssistantMessageEvent(data=reply),
        AssistantUsageEvent(data=usage),
        SessionUsageInfoEvent(data=info),
    )
    return events, calls


def _too_long(answer: object) -> bool:
    """The model refused the request as longer than its context (spec X2)."""
    return isinstance(answer, SessionErrorEvent) and answer.data.error_type == "context_length"


def turn_start(turn_id: str, model: str | None) -> AssistantTurnStartEvent:
    return AssistantTurnStartEvent(data=TurnData(turn_id=turn_id, model=model))


def _turn_end(turn_id: str, model: str | None) -> AssistantTurnEndEvent:
    return AssistantTurnEndEvent(data=TurnData(turn_id=turn_id, model=model))


def _cannot_write(exc: BaseException) -> bool:
    """`exc` (or one of a batch's exceptions) says the session's log cannot be written."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_cannot_write(inner) for inner in exc.exceptions)
    return isinstance(exc, (StoreUnavailableError, LeaseLostError))


def _next_step(state: SessionState) -> _Step:
    """After a turn, as the log tells it: the seeded run of a clear (C8), another turn, or the
    end (no calls, T1, O2)."""
    if state.pending_seed is not None:
        return _Seed(state.pending_seed, state.seed_recorded)
    return "continue" if state.run_id is not None else "end"


def _distinct(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """The model's calls with storable text and distinct, non-empty ids: a repeated or missing
    id would pair a result with the wrong call, or with none (spec O1)."""
    seen: set[str] = set()
    distinct: list[ToolCall] = []
    for index, call in enumerate(calls):
        call_id = valid_text(call.id) or f"call_{index}"
        while call_id in seen:
            call_id = f"{call_id}_{index}"
        seen.add(call_id)
        name = _callable_name(valid_text(call.name))
        if call_id != call.id or name != call.name:
            call = call.model_copy(update={"id": call_id, "name": name})
        distinct.append(call)
    return tuple(distinct)


def _callable_name(name: str) -> str:
    """`name` if a provider takes it back in the history (T6), else a name that does (and no
    tool has): a call named otherwise fails as an unknown tool, and the session goes on,
    where the name sent back in every later request would have been refused."""
    if _NAME.fullmatch(name):
        return name
    return ("invalid_" + re.sub(r"[^A-Za-z0-9_-]", "_", name))[:MAX_TOOL_NAME]


_NAME = re.compile(TOOL_NAME)


_REQUEST_FIELDS = set(ModelRequest.model_fields)


async def _call_model(
    ctx: RunContext, log: Writer, reply_id: str, tokens: int
) -> tuple[ModelResponse, float]:
    """The model's response and how long it took (ms); streams deltas when configured, under
    the id the final `assistant.message` will carry (clients join them on it). `tokens` is the
    request's estimate, for its span."""
    config, output = ctx.config, ctx.output
    # Built from parts validated already (the window's messages, the tools' definitions).
    request = ModelRequest.model_construct(
        _REQUEST_FIELDS,
        model=config.model or "default",
        messages=tuple(log.state.window()),
        tools=ctx.shown,
        stream=config.streaming,
        # Only a session's own override bounds the output: the table's figure is a ceiling.
        max_tokens=config.model_limits.max_output_tokens if config.model_limits else None,
        headers=ctx.request_headers,
        reasoning_effort=config.reasoning_effort,
        # A run that must give a typed result: by a tool call, or by its reply (OUT2, OUT6).
        tool_choice="required" if output is not None and not output.spec.native else None,
        output_schema=output.spec.json_schema
        if output is not None and output.spec.native
        else None,
    )
    response: ModelResponse | None = None
    started = time.perf_counter()
    provider = ctx.provider
    with ctx.tracing.chat(request, tokens, ctx.session_id, provider.name) as span:
        async for event in provider.stream(request):
            if isinstance(event, TextDelta) and config.streaming:
                delta = AssistantMessageDeltaData(message_id=reply_id, delta_content=event.text)
                await emit(log, AssistantMessageDeltaEvent(data=delta))
            elif isinstance(event, ModelResponse):
                response = event
        if response is None:
            raise ProviderError("bad_response", "the provider's stream ended without a response")
        span.response(response)
    return response, (time.perf_counter() - started) * 1000


def _request(call: ToolCall) -> ToolRequest:
    arguments = parse_arguments(call.arguments)
    return ToolRequest(tool_call_id=call.id, name=call.name, arguments=arguments)


def _error_event(
    error_type: str, message: str, status_code: int | None, retryable: bool, message_id: str
) -> SessionErrorEvent:
    return SessionErrorEvent(
        data=SessionErrorData(
            error_type=error_type,
            message=message,
            status_code=status_code,
            retryable=retryable,
            originating_message_id=message_id,
        )
    )


async def _run_batch(
    ctx: RunContext,
    host: LoopHost,
    calls: Sequence[ToolCall],
    turn_id: str,
    *,
    started: bool = False,
    waiting: Mapping[str, Wait] = _NO_WAITS,
) -> list[CallOutcome]:
    """Run every call of one response concurrently and wait for all of them (spec T3)."""
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(_execute(ctx, host, c, turn_id, started, waiting.get(c.id)))
            for c in calls
        ]
        try:
            await asyncio.wait(tasks)
        except asyncio.CancelledError:
            # An abort ends the calls in the order the model asked for them (E4), and their
            # `cancelled` completions are logged so: the group would cancel them in the
            # order of its set of tasks (their addresses), which differs from one process to
            # the next. Those the group cancelled already (a call failed) are left to it.
            for task in tasks:
                if not task.cancelling():
                    task.cancel()
            await asyncio.wait(tasks)
            raise
    return [task.result() for task in tasks]


async def _execute(
    ctx: RunContext,
    host: LoopHost,
    call: ToolCall,
    turn_id: str,
    started: bool,
    wait: Wait | None = None,
) -> CallOutcome:
    """One call from `tool.execution_start` to its single `tool.execution_complete` (O1), in
    its span (OT4); with `wait`, from the question it announced before (EN5)."""
    arguments = parse_arguments(call.arguments)
    with ctx.tracing.tool(call, arguments, turn_id):
        try:
            if not started:
                # (An emit is never half done: cancelled during it, the start is stored.)
                await emit(host, _execution_start(ctx, call, arguments, turn_id))
            notes: list[str] = []
            outcome = await _decide(ctx, host, call, arguments, notes, wait)
            if notes:
                # Before the result: a clear this call commits wipes them with the window.
                note = user_message(valid_text("\n\n".join(notes)), None, "hook")
                await emit(host, note)
        except asyncio.CancelledError:
            await _complete(host, call, CallOutcome("cancelled", INTERRUPTED), turn_id)
            raise
        except (StoreUnavailableError, LeaseLostError):
            raise  # the log cannot be written: the run ends (the session reports it)
        except Exception:
            # A bug below the loop: the call still ends, and the model only learns it failed.
            log.exception("tool call %s of session %s failed", call.id, ctx.session_id)
            outcome = failed_call(call.name)
        await _complete(host, call, outcome, turn_id)
    return outcome


def _execution_start(
    ctx: RunContext, call: ToolCall, arguments: object, turn_id: str
) -> ToolExecutionStartEvent:
    tool = ctx.tools.get(call.name)
    start = ToolExecutionStartData(
        tool_call_id=call.id,
        tool_name=call.name,
        arguments=arguments,
        turn_id=turn_id,
        is_terminal=(tool is not None and tool.definition.is_terminal) or None,
    )
    return ToolExecutionStartEvent(data=start)


async def _decide(
    ctx: RunContext,
    host: LoopHost,
    call: ToolCall,
    arguments: object,
    notes: list[str],
    wait: Wait | None = None,
) -> CallOutcome:
    """How the call ends; what its hooks add to the conversation goes to `notes` (D13).

    With `wait`, the call goes on from the question it announced before: its permission
    request is answered, or, past its permission, its external request (EN5)."""
    usable = _usable(ctx, host.live, call, arguments)
    if isinstance(usable, CallOutcome):
        return await _failed(ctx, call, arguments, usable, notes)
    tool, params = usable
    external = isinstance(tool, ExternalTool)
    hooks, approved, suppressed = ctx.hooks, False, False
    if hooks:
        pre = await _awaited(ctx, hooks.pre_tool_use(call.name, arguments))
        notes += [pre.note] if pre.note else []
        if pre.denied is not None:
            return CallOutcome("denied", valid_text(pre.denied))
        if pre.arguments is not arguments:
            arguments, params = pre.arguments, tool.validate(pre.arguments)
            if isinstance(params, CallOutcome):
                return await _failed(ctx, call, arguments, params, notes)
        approved, suppressed = pre.approved, pre.suppressed
    requested = wait.request_id if isinstance(wait, ExternalToolRequestedData) else None
    invocation = ctx.invocation(call, arguments, requested or (new_id() if external else None))
    if not approved and requested is None:
        asked = wait.permission_request if isinstance(wait, PermissionRequestedData) else None
        approval = await _permission(ctx, host, tool, call, invocation, asked)
        if approval.refusal is not None:
            return approval.refusal
    live = host.live
    live.in_flight = {**live.in_flight, call.id: call.name}
    token = current_tool_call.set((ctx.session_id, call.id))
    try:
        if external:
            announced = requested is not None
            outcome = await _run_external(ctx, host, tool, params, invocation, announced)
        else:
            outcome = await _awaited(ctx, tool.run(params, invocation))
    finally:
        current_tool_call.reset(token)
        in_flight = {k: v for k, v in live.in_flight.items() if k != call.id}
        live.in_flight = in_flight or _NOT_IN_FLIGHT
    if outcome.outcome != "success":
        return await _failed(ctx, call, arguments, outcome, notes)
    _discover(ctx, live, outcome.references)
    if hooks:
        post = await _awaited(ctx, hooks.post_tool_use(call.name, arguments, outcome.text))
        notes += [post.note] if post.note else []
        suppressed = suppressed or post.suppressed
        outcome = outcome._replace(text=SUPPRESSED if suppressed else valid_text(post.text))
    return outcome


def _usable(
    ctx: RunContext, live: LoopState, call: ToolCall, arguments: object
) -> tuple[Tool, Any] | CallOutcome:
    """The tool and its validated parameters, or why the call cannot be made."""
    tool = ctx.tools.get(call.name)
    if tool is None:
        return CallOutcome("failure", f"Tool '{call.name}' does not exist.")
    if isinstance(tool, ExternalTool) and not tool.provided():
        # Its client left: nobody would ever answer.
        return CallOutcome("failure", f"No connected client provides the tool '{call.name}'.")
    if call.name in ctx.deferred and call.name not in live.discovered:
        return CallOutcome(
            "failure", f"Tool '{call.name}' is not loaded: find it with tool_search first."
        )
    params = tool.validate(arguments)
    return params if isinstance(params, CallOutcome) else (tool, params)


async def _failed(
    ctx: RunContext, call: ToolCall, arguments: object, outcome: CallOutcome, notes: list[str]
) -> CallOutcome:
    """A call that did not succeed, also one that could not be made (an unknown tool, bad
    arguments): its `postToolUseFailure` hooks may add guidance (D13), as in the reference
    runtime. A denial is the user's answer, not a failure: they are not asked."""
    if ctx.hooks and outcome.outcome != "denied":
        failure = ctx.hooks.post_tool_use_failure(call.name, arguments, outcome.text)
        note = await _awaited(ctx, failure)
        notes += [note] if note else []
    return outcome


async def _awaited(ctx: RunContext, work: Awaitable[_T]) -> _T:
    """`work`, host code the run waits for, run as such (`awaited_by`)."""
    token = awaited_by.set(ctx.session_id)
    try:
        return await work
    finally:
        awaited_by.reset(token)


def _discover(ctx: RunContext, live: LoopState, references: Sequence[str]) -> None:
    """Deferred tools a successful call (`tool_search`) found become callable."""
    found = [r for r in references if r in ctx.tools]
    if found:
        live.discovered |= set(found)
        ctx.tracing.found(found)


async def _run_external(
    ctx: RunContext,
    log: Writer,
    tool: Tool,
    params: Any,
    invocation: ToolInvocation,
    announced: bool = False,
) -> CallOutcome:
    """A call a client runs: announced (unless `announced` before, EN5), answered (the
    handler waits for the client), then settled, also when aborted: the last event tells
    clients to stop and not answer."""
    assert invocation.request_id is not None
    if not announced:
        request = ExternalToolRequestedData(
            request_id=invocation.request_id,
            session_id=ctx.session_id,
            tool_call_id=invocation.tool_call_id,
            tool_name=invocation.tool_name,
            arguments=invocation.arguments,
            **ctx.tracing.carrier(),
        )
        await emit(log, ExternalToolRequestedEvent(data=request))
    try:
        return await tool.run(params, invocation)
    finally:
        settled = ExternalToolCompletedData(request_id=invocation.request_id)
        await emit(log, ExternalToolCompletedEvent(data=settled))


async def _permission(
    ctx: RunContext,
    log: Writer,
    tool: Tool,
    call: ToolCall,
    invocation: ToolInvocation,
    asked: PermissionRequestData | None = None,
) -> Approval:
    """Whether the call may run: `asked` is the request announced before (EN5), whose
    answer is awaited without asking again."""
    # Approvals for the session are read from the log as it is now: a sibling call of the
    # batch may have just given one.
    approved_for_session = tool.name in log.state.approved_tools
    if asked is None and (
        tool.definition.skip_permission or ctx.approve_all or approved_for_session
    ):
        return APPROVED
    handler = ctx.permission_handler
    if handler is None:
        if asked is None:
            return NO_HANDLER
        # Announced already: its request is closed, as every answered one is.
        await emit(log, _permission_completed(asked.request_id or "", call.id, NO_HANDLER.kind))
        return NO_HANDLER
    request = asked or tool.permission_request(invocation.arguments, call.id, new_id())
    request_id = request.request_id or ""
    try:
        if asked is None:
            announce = PermissionRequestedData(request_id=request_id, permission_request=request)
            await emit(log, PermissionRequestedEvent(data=announce))
        approval = await _awaited(ctx, ask_permission(handler, request, invocation))
    except asyncio.CancelledError:
        # Aborted while asking: the request is closed too, so that clients stop showing it.
        await emit(log, _permission_completed(request_id, call.id, CANCELLED))
        raise
    await emit(log, _permission_completed(request_id, call.id, approval.kind))
    return approval


def _permission_completed(request_id: str, call_id: str, kind: str) -> PermissionCompletedEvent:
    return PermissionCompletedEvent(
        data=PermissionCompletedData(
            request_id=request_id, result=PermissionResultData(kind=kind), tool_call_id=call_id
        )
    )


async def _complete(host: LoopHost, call: ToolCall, outcome: CallOutcome, turn_id: str) -> None:
    """Record the outcome and, in the same append, commit a clear staged by this call (C6) or
    drop it (C7): a clear is committed exactly when its call's success is stored."""
    success = outcome.outcome == "success"
    events: list[Event] = [
        ToolExecutionCompleteEvent(
            data=ToolExecutionCompleteData(
                tool_call_id=call.id,
                success=success,
                outcome=outcome.outcome,
                result=ToolResultContent(content=outcome.text) if success else None,
                error=None
                if success
                else ToolResultError(message=outcome.text, code=outcome.outcome),
                tool_name=call.name,
                turn_id=turn_id,
                output=outcome.output if success else None,
            )
        )
    ]
    live = host.live
    staged = live.staged
    ours = staged is not None and staged.tool_call_id == call.id
    if ours and success:
        assert staged is not None
        events.append(cleared(staged.prompt, staged.messages_cleared))
    await host.emit_all(events)
    if ours:
        # Staged until stored: a sibling's clear meanwhile is refused (C4); once stored, the
        # log's pending seed refuses it.
        live.staged = None
        if success:
            # The fresh window starts like a new session's: tools found by search are gone.
            live.discovered = _NO_TOOLS


def cleared(prompt: str, messages_cleared: int) -> SessionContextClearedEvent:
    """A committed clear seeded with `prompt` (C6, X4, X5)."""
    data = ContextClearedData(messages_cleared=messages_cleared, initial_message=prompt)
    return SessionContextClearedEvent(data=data)


def cancelled(call_id: str, tool_name: str) -> ToolExecutionCompleteEvent:
    """The end of a call that will never finish (a crash, or a copied log at rest)."""
    return ToolExecutionCompleteEvent(
        data=ToolExecutionCompleteData(
            tool_call_id=call_id,
            success=False,
            outcome="cancelled",
            error=ToolResultError(message=INTERRUPTED, code="cancelled"),
            tool_name=tool_name,
        )
    )


def at_rest(state: SessionState) -> list[Event]:
    """The events that bring a log to rest without running anything (a fork is inert; a
    run the store failed under is ended before the next starts): calls left unfinished end
    `cancelled`, an open turn is closed, a committed clear's seed is kept in the window, and
    a run left in progress ends as aborted, unless closing its turn ends it (the model had
    answered for good; only the turn's end was not stored)."""
    events: list[Event] = [
        cancelled(call_id, start.tool_name) for call_id, start in state.unfinished_calls.items()
    ]
    if state.open_turn is not None:
        events.append(AssistantTurnEndEvent(data=TurnData(turn_id=state.open_turn)))
    if state.pending_seed is not None and not state.seed_recorded:
        events.append(user_message(state.pending_seed, new_id(), "context_cleared"))
    if state.run_id is not None and not _closing_ends_run(state):
        events.append(AbortEvent())
    return events


def _left_at_rest(state: SessionState) -> list[Event]:
    """The end of the calls left unfinished and of their turn: each question one of them
    still waits on is closed first, so that clients stop showing it."""
    events: list[Event] = []
    for call_id, wait in state.waiting.items():
        if isinstance(wait, PermissionRequestedData):
            events.append(_permission_completed(wait.request_id, call_id, CANCELLED))
        else:
            events.append(
                ExternalToolCompletedEvent(
                    data=ExternalToolCompletedData(request_id=wait.request_id)
                )
            )
    events += [cancelled(call_id, s.tool_name) for call_id, s in state.unfinished_calls.items()]
    if state.open_turn is not None:
        events.append(AssistantTurnEndEvent(data=TurnData(turn_id=state.open_turn)))
    return events


def _closing_ends_run(state: SessionState) -> bool:
    """Whether closing the open turn, its unfinished calls `cancelled`, ends its run."""
    batch = state.batch
    if state.open_turn is None or batch is None:
        return False
    outcomes: dict[str, ToolOutcome] = dict.fromkeys(state.unfinished_calls, "cancelled")
    closed = batch.model_copy(update={"outcomes": {**batch.outcomes, **outcomes}})
    return closed.ends_run() is True


def end_of_failed_run(state: SessionState) -> list[Event]:
    """Before a new input's message: a run the store failed under here is still open in the
    log (its end could not be stored; its error and idle were delivered then, W2), so it is
    brought to rest first, ended as aborted."""
    return at_rest(state) if state.run_id is not None else []


def end_of_interrupted_run(state: SessionState) -> list[Event]:
    """Before a new input's message: a run a crash interrupted, which the session was resumed
    without continuing (P3), is brought to rest first, ended as aborted, with its one idle
    (E1)."""
    if state.run_id is None:
        return []
    events = at_rest(state)
    aborted = isinstance(events[-1], AbortEvent) or None
    return [*events, SessionIdleEvent(data=SessionIdleData(aborted=aborted))]
