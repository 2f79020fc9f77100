"""Compaction: summarise the older part of the window with the session's own model.

A compaction is two appended events, `session.compaction_start` and
`session.compaction_complete`; the latter carries the new base of the window (the summary,
then the newest messages kept verbatim), so the log is never edited and every earlier window
stays readable. Units (a user message, or an assistant message with its tool results) are
never split, so no window holds an orphaned call (spec P3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from trimtab._budget import usage_info, usage_of
from trimtab._errors import ProviderError
from trimtab._results import CompactResult
from trimtab._run_context import RunContext, Writer, emit
from trimtab._state import SessionState
from trimtab._tools import valid_text
from trimtab._window import estimate_tokens, units
from trimtab.events import (
    AssistantUsageEvent,
    CompactionCompleteData,
    CompactionStartData,
    Message,
    SessionCompactionCompleteEvent,
    SessionCompactionStartEvent,
    SessionUsageInfoEvent,
    SessionWarningEvent,
    UsageInfoData,
    WarningData,
)
from trimtab.providers import ModelRequest, ModelResponse

__all__ = [
    "COMPACTION_PROMPT",
    "HANDOFF_PROMPT",
    "CompactResult",
    "compact",
    "fit_window",
    "handoff_due",
    "needs_fitting",
    "raw_request_tokens",
    "recover_overflow",
    "request_tokens",
    "summarize_for_handoff",
]

COMPACTION_PROMPT = """\
You are compacting the conversation of an AI agent so that it can go on working in a fresh \
context window with nothing but your summary and its newest messages. Write the summary the \
agent needs to continue as if it still had the whole conversation:
- the user's goal, and their latest request quoted verbatim;
- decisions made, constraints and preferences stated;
- tool calls that matter, with the exact values, names, ids and errors they returned;
- work completed, work still pending, and the next step.
Be specific and brief; use short markdown sections. Never invent anything, and do not \
address the user."""

HANDOFF_PROMPT = """\
Summarise this agent conversation as a markdown handoff note for another agent who will take \
the work over with no other context: the goal, the current state, what was done (with the \
exact values, names and ids that matter), open questions, and the next steps."""

SUMMARY_PREFIX = "Summary of the conversation so far (older messages were compacted):\n\n"
KEEP_MESSAGES = 4
KEEP_SHARE = 0.2
"""After a compaction the newest messages stay verbatim: at most `KEEP_MESSAGES` of them, in
at most this share of the context window, whole units only."""
SUMMARY_TOKENS = 2_000
"""The most a summary may take; also the headroom a compaction request keeps for it."""
_MESSAGE_CHARS = 4_000
"""Longer messages are shortened in the transcript a summary is made from."""

Trigger = Literal["manual", "threshold"]


def raw_request_tokens(ctx: RunContext, state: SessionState) -> int:
    """The next model request's size by the window's estimate: the window and the tool
    schemas, uncalibrated (what `assistant.usage` logs beside the reported tokens, X1)."""
    tools = sum(len(d.model_dump_json()) for d in ctx.shown) // 4
    return state.window_tokens() + tools


def request_tokens(ctx: RunContext, state: SessionState) -> int:
    """The next model request's estimated size in the model's tokens: calibrated by what the
    model reported so far (spec X1)."""
    return round(raw_request_tokens(ctx, state) * state.token_ratio(ctx.usage_model))


def needs_fitting(ctx: RunContext, state: SessionState, more: int = 0) -> bool:
    """The next model request, with `more` tokens (by the window's estimate) in the window,
    passes the threshold of automatic compaction, or of the handoff policy (spec X5)."""
    size = request_tokens(ctx, state) + round(more * state.token_ratio(ctx.usage_model))
    handoff = ctx.config.handoff
    return (ctx.config.infinite_sessions.enabled and size > _budget(ctx)) or (
        handoff is not None and size > _share(ctx, handoff.threshold)
    )


def handoff_due(ctx: RunContext, state: SessionState) -> bool:
    """The next request passes the handoff policy's threshold (spec X5)."""
    handoff = ctx.config.handoff
    return handoff is not None and request_tokens(ctx, state) > _share(ctx, handoff.threshold)


async def fit_window(ctx: RunContext, log: Writer) -> None:
    """Before a model call: compact if the request would pass the threshold (auto compaction),
    then, if it still does not fit, drop the oldest whole units and say so."""
    state = log.state
    if not (ctx.config.infinite_sessions.enabled and request_tokens(ctx, state) > _budget(ctx)):
        return
    await compact(ctx, log, trigger="threshold")
    await _drop_to(ctx, log, _budget(ctx), "the window was still too large after compaction")


async def recover_overflow(ctx: RunContext, log: Writer) -> bool:
    """After the model refused the request as longer than its context (spec X2): say so in a
    `context_length` warning, which calibrates the estimate (X1), then make the window fit as
    the session's policy says. Whether to retry the call (not with `"fail"`)."""
    policy = ctx.config.context_overflow
    if policy == "fail":
        return False
    state, limit, model = log.state, ctx.limits.context_window, ctx.usage_model
    raw = raw_request_tokens(ctx, state)
    remedy = "compacted" if policy == "compact" else "trimmed"
    warning = WarningData(
        warning_type="context_length",
        message=(
            f"the model refused a request of about {raw} tokens (by the window's estimate) as"
            f" longer than its context of {limit}: the window is {remedy} and the call retried"
        ),
        model=model,
        estimated_tokens=raw,
        token_limit=limit,
    )
    await emit(log, SessionWarningEvent(data=warning))
    refused = round(raw * state.token_ratio(model))  # as the warning calibrated it
    # A refusal the calibration explains: fit the compaction budget. One it cannot (the
    # ratio is at its bound: the model's context is smaller than its limits say): halve.
    target = _budget(ctx) if refused > limit else refused // 2
    if policy == "compact":
        await compact(ctx, log, trigger="threshold")
    await _drop_to(ctx, log, target, "the model refused the window as too long")
    return True


async def _drop_to(ctx: RunContext, log: Writer, target: int, reason: str) -> None:
    overflow = request_tokens(ctx, log.state) - target
    if overflow > 0:
        ratio = log.state.token_ratio(ctx.usage_model)
        await _drop_oldest(log, math.ceil(overflow / ratio), reason)


def _budget(ctx: RunContext) -> int:
    """The request size automatic compaction keeps under."""
    return _share(ctx, ctx.config.infinite_sessions.threshold)


def _share(ctx: RunContext, threshold: float) -> int:
    return int(ctx.limits.context_window * threshold)


async def compact(
    ctx: RunContext, log: Writer, *, trigger: Trigger, custom_instructions: str | None = None
) -> CompactResult:
    """Summarise all but the newest units of the conversation into a new window base."""
    groups = units(log.state.conversation())
    ratio = log.state.token_ratio(ctx.usage_model)
    keep = _newest(groups, int(ctx.limits.context_window * KEEP_SHARE / ratio))
    older = groups[: len(groups) - len(keep)]
    if not older:
        return CompactResult(success=False)
    await emit(log, SessionCompactionStartEvent(data=CompactionStartData(trigger=trigger)))
    prompt = COMPACTION_PROMPT + (f"\n\nAlso: {custom_instructions}" if custom_instructions else "")
    summary = await _summarize_fitting(ctx, log, older, prompt)
    if summary is None and not keep:
        # Nothing else would be left to answer from: the newest unit stays, whatever its
        # size (spec H1), and if it does not fit, the request says so at the provider.
        keep, older = older[-1:], older[:-1]
    before = estimate_tokens(m for unit in groups for m in unit)
    base = [Message(role="user", content=SUMMARY_PREFIX + summary)] if summary else []
    base += [m for unit in keep for m in unit]
    result = CompactResult(
        success=True,
        summary=summary,
        messages_removed=sum(len(unit) for unit in older),
        tokens_removed=max(0, before - estimate_tokens(base)),
    )
    await _rebase(log, trigger, base, result)
    return result


async def summarize_for_handoff(ctx: RunContext, log: Writer) -> str:
    """A markdown handoff note about the conversation; the window is not changed."""
    groups = units(log.state.conversation())
    return await _summarize_fitting(ctx, log, groups, HANDOFF_PROMPT) or ""


async def _summarize_fitting(
    ctx: RunContext, log: Writer, groups: list[list[Message]], prompt: str
) -> str | None:
    """Ask the model for a summary of `groups`, leaving out the oldest units that do not fit
    (with a warning); None if the model failed."""
    # (In the window's estimate: the model's tokens are that times the ratio, X1.)
    ratio = log.state.token_ratio(ctx.usage_model)
    budget = (ctx.limits.context_window - _summary_tokens(ctx)) / ratio
    budget -= estimate_tokens([_system(prompt)])
    groups = list(groups)
    dropped = 0
    while groups and estimate_tokens([_transcript(groups)]) > budget:
        groups.pop(0)
        dropped += 1
    if dropped:
        await _warn(log, f"{dropped} oldest turn(s) were too large to summarise and were dropped.")
    if not groups:
        return None
    request = ModelRequest(
        model=ctx.config.model or "default",
        messages=(_system(prompt), _transcript(groups)),
        max_tokens=_summary_tokens(ctx),
    )
    estimated = estimate_tokens(request.messages)
    info = UsageInfoData(
        token_limit=ctx.limits.context_window,
        current_tokens=round(estimated * ratio),
        messages_length=len(request.messages),
    )
    try:
        response = await _ask(ctx, request, estimated)
    except ProviderError as exc:
        text = f"summarising failed ({exc.error_type}: {exc.message}); turns dropped instead"
        failed = WarningData(warning_type="compaction", message=valid_text(text))
        if exc.error_type == "context_length":  # what calibrates the estimate, too (X1)
            failed = failed.model_copy(
                update={
                    "warning_type": "context_length",
                    "model": ctx.usage_model,
                    "estimated_tokens": estimated,
                    "token_limit": ctx.limits.context_window,
                }
            )
        await emit(log, SessionWarningEvent(data=failed))
        return None
    usage = usage_of(
        ctx.config,
        ctx.usage_model,
        response.usage,
        finish_reason=response.finish_reason,
        estimated_tokens=estimated,
    )
    # Every model call reports its request's size, and what was spent, summaries too (§6).
    info = usage_info(
        log.state,
        usage,
        limit=info.token_limit,
        tokens=info.current_tokens,
        length=info.messages_length,
    )
    await emit(log, AssistantUsageEvent(data=usage))
    await emit(log, SessionUsageInfoEvent(data=info))
    return valid_text(response.content.strip()) or None


async def _drop_oldest(log: Writer, overflow: int, reason: str) -> None:
    """Drop the oldest whole units until `overflow` tokens (by the window's estimate) are gone;
    the newest unit is never dropped, but its longest messages are cut when it alone is too
    large (spec X3). Announced in a warning."""
    groups = units(log.state.conversation())
    dropped: list[list[Message]] = []
    while len(groups) > 1 and overflow > 0:
        unit = groups.pop(0)
        overflow -= estimate_tokens(unit)
        dropped.append(unit)
    cut = 0
    if overflow > 0 and groups:
        groups[-1], cut = _shortened(groups[-1], overflow)
    if not dropped and not cut:
        return
    said = [f"the {len(dropped)} oldest turn(s) were dropped from the window"] if dropped else []
    said += [f"{cut} characters of its newest turn were cut"] if cut else []
    await _warn(log, f"{reason}: {' and '.join(said)}.")
    await emit(log, SessionCompactionStartEvent(data=CompactionStartData(trigger="threshold")))
    base = [m for unit in groups for m in unit]
    removed = [m for unit in dropped for m in unit]
    result = CompactResult(
        success=True,
        messages_removed=len(removed),
        tokens_removed=estimate_tokens(removed) + (cut + 3) // 4,
    )
    await _rebase(log, "threshold", base, result)


KEPT_CHARS = 2_000
"""What a text cut to fit the window keeps of itself at least (its beginning)."""

CUT_NOTE = "\n[... {n} characters cut: the context window could not hold them]"

CUT_ARGUMENTS = '{{"cut": "{n} characters of arguments: the context window could not hold them"}}'
"""What a call's arguments become when they are cut: JSON still (providers parse them)."""


def _shortened(unit: list[Message], overflow: int) -> tuple[list[Message], int]:
    """`unit` with its longest texts (contents, or a call's arguments) cut until `overflow`
    tokens (by the window's estimate) are gone or every text is down to `KEPT_CHARS`; and how
    many characters went. Its messages and calls all stay, so a call keeps its result (P3)."""
    messages = list(unit)
    total = 0
    while overflow > 0:
        index, call, text = max(_texts(messages), key=lambda found: len(found[2]))
        if call is None:
            keep = max(KEPT_CHARS, len(text) - 4 * overflow - _NOTE_CHARS)
            shortened = text[:keep] + CUT_NOTE.format(n=len(text) - keep)
        else:
            shortened = CUT_ARGUMENTS.format(n=len(text))
        if len(text) - len(shortened) <= _NOTE_CHARS:
            break  # (what is left is the least a message keeps)
        messages[index] = _replaced(messages[index], call, shortened)
        total += len(text) - len(shortened)
        overflow -= (len(text) - len(shortened)) // 4
    return messages, total


def _texts(messages: Sequence[Message]) -> list[tuple[int, int | None, str]]:
    """Every text of `messages` that counts in the window's size: (message, call, text)."""
    found: list[tuple[int, int | None, str]] = []
    for index, message in enumerate(messages):
        found.append((index, None, message.content))
        found += [(index, n, c.arguments) for n, c in enumerate(message.tool_calls)]
    return found


def _replaced(message: Message, call: int | None, text: str) -> Message:
    if call is None:
        return message.model_copy(update={"content": text})
    calls = list(message.tool_calls)
    calls[call] = calls[call].model_copy(update={"arguments": text})
    return message.model_copy(update={"tool_calls": tuple(calls)})


_NOTE_CHARS = len(CUT_NOTE) + 8
"""The note's length, with room for the count it says."""


async def _rebase(
    log: Writer, trigger: Trigger, base: list[Message], result: CompactResult
) -> None:
    data = CompactionCompleteData(
        success=True,
        trigger=trigger,
        messages_removed=result.messages_removed,
        tokens_removed=result.tokens_removed,
        summary_content=result.summary,
        base=base,
    )
    await emit(log, SessionCompactionCompleteEvent(data=data))


def _newest(groups: Sequence[list[Message]], budget: int) -> list[list[Message]]:
    """The newest units that fit the keep limits (`budget`: by the window's estimate); never
    all of them (something must go), but always a newest user message, whatever its size
    (spec H1)."""
    kept: list[list[Message]] = []
    count = 0
    if groups and groups[-1][0].role == "user":
        # The prompt the model is about to answer: summarised, it could not be answered (a
        # summary quotes no long text verbatim), and with the summary failed it would be gone.
        kept, groups = [groups[-1]], groups[:-1]
        budget -= estimate_tokens(kept[0])
        count += len(kept[0])
    for unit in reversed(groups[1:]):
        budget -= estimate_tokens(unit)
        count += len(unit)
        if budget < 0 or count > KEEP_MESSAGES:
            break
        kept.insert(0, unit)
    return kept


def _summary_tokens(ctx: RunContext) -> int:
    return min(SUMMARY_TOKENS, ctx.limits.max_output_tokens, ctx.limits.context_window // 4)


def _system(prompt: str) -> Message:
    return Message(role="system", content=prompt)


def _transcript(groups: Sequence[list[Message]]) -> Message:
    """The conversation as one user message: robust for every provider (no tool pairing)."""
    lines: list[str] = []
    for message in (m for unit in groups for m in unit):
        text = message.content
        if len(text) > _MESSAGE_CHARS:
            text = text[:_MESSAGE_CHARS] + " …(shortened)"
        calls = "".join(f"\n  -> calls {c.name}({c.arguments})" for c in message.tool_calls)
        label = "tool result" if message.role == "tool" else message.role
        lines.append(f"[{label}] {text}{calls}")
    return Message(role="user", content="Conversation to summarise:\n\n" + "\n".join(lines))


async def _ask(ctx: RunContext, request: ModelRequest, tokens: int) -> ModelResponse:
    """The summary's model call, a `chat` span of its own (spec OT3)."""
    response: ModelResponse | None = None
    provider = ctx.provider
    with ctx.tracing.chat(request, tokens, ctx.session_id, provider.name) as span:
        async for event in provider.stream(request):
            if isinstance(event, ModelResponse):
                response = event
        if response is None:
            raise ProviderError("bad_response", "the provider's stream ended without a response")
        span.response(response)
    return response


async def _warn(log: Writer, message: str) -> None:
    await emit(
        log, SessionWarningEvent(data=WarningData(warning_type="compaction", message=message))
    )
