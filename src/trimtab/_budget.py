"""Cost and budgets: what a model call costs by its provider's price table, and whether a run
may make its next model call (spec U1-U6).

Everything here is a function of the log: a call's cost is logged with its usage, and what a
budget bounds is summed by the session's state (`SessionState.spent`, `.run`), so a budget
holds across processes, resumes and takeovers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from trimtab._state import RUN_BUDGET, SESSION_BUDGET, SessionState
from trimtab.events import (
    AssistantUsageData,
    Budget,
    SessionConfigData,
    Spending,
    UsageInfoData,
    WarningData,
)
from trimtab.providers import Usage
from trimtab.providers._config import ModelPrice

__all__ = ["Verdict", "exhausted", "price_of", "usage_info", "usage_of", "verdict"]

Scope = Literal["run", "session"]

_LIMITS = ("input_tokens", "output_tokens", "total_tokens", "cost", "model_calls", "wall_seconds")
"""A budget's limits, in the order a verdict names the one reached."""


def price_of(provider: Mapping[str, Any] | None, model: str) -> ModelPrice | None:
    """The price of `model` in the logged provider config's table (spec U1), if it has one."""
    prices = (provider or {}).get("prices")
    entry = prices.get(model) if isinstance(prices, Mapping) else None
    if entry is None:
        return None
    try:
        return ModelPrice.model_validate(entry)
    except ValidationError:  # (checked when the config was given: not from this version)
        return None


def usage_of(
    config: SessionConfigData,
    model: str,
    usage: Usage,
    *,
    duration: float | None = None,
    finish_reason: str | None = None,
    reasoning_effort: str | None = None,
    estimated_tokens: int | None = None,
) -> AssistantUsageData:
    """The `assistant.usage` of one model call, with its cost (U1) and the request's size as
    estimated, which calibrates the estimate (X1)."""
    price = price_of(config.provider, model)
    reported = usage.input_tokens is not None or usage.output_tokens is not None
    cost = (
        price.cost(usage.input_tokens or 0, usage.cache_read_tokens or 0, usage.output_tokens or 0)
        if price is not None and reported
        else None
    )
    return AssistantUsageData(
        model=model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cost=cost,
        duration=duration,
        finish_reason=finish_reason,
        reasoning_effort=reasoning_effort,
        estimated_tokens=estimated_tokens,
    )


def usage_info(
    state: SessionState, usage: AssistantUsageData, *, limit: int, tokens: int, length: int
) -> UsageInfoData:
    """The `session.usage_info` of a model call whose usage is `usage`: the request's size,
    and what the run, the epoch and the session have spent with it (U2)."""
    run = state.run.spent.plus(usage) if state.run is not None else None
    return UsageInfoData(
        token_limit=limit,
        current_tokens=tokens,
        messages_length=length,
        run_spending=run,
        epoch_spending=state.epoch_spent.plus(usage),
        session_spending=state.spent.plus(usage),
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether the run may make its next model call, as its log says (U3, U4)."""

    exceeded: str | None = None
    """Why it may not: the limit reached (the `budget_exceeded` error's message)."""
    warnings: tuple[WarningData, ...] = ()
    """The warnings of limits whose `warn_at` was crossed, to log first."""


def verdict(state: SessionState, now: datetime) -> Verdict:
    """The budgets of the run in progress and of the session, against what they spent."""
    run_seconds, all_seconds = state.seconds(now)
    run = state.run
    scopes: list[tuple[Scope, Budget | None, Spending, float, bool]] = [
        ("session", state.config.budget, state.spent, all_seconds, state.budget_warned),
    ]
    if run is not None:
        scopes.insert(0, ("run", run.budget, run.spent, run_seconds, run.warned))
    warnings: list[WarningData] = []
    for scope, budget, spent, seconds, warned in scopes:
        if budget is None:
            continue
        if (reached := _reached(scope, budget, spent, seconds)) is not None:
            return Verdict(exceeded=reached)
        if not warned and (near := _near(scope, budget, spent, seconds)) is not None:
            warnings.append(near)
    return Verdict(warnings=tuple(warnings))


def exhausted(state: SessionState, now: datetime) -> str | None:
    """Why the session's own budget refuses a new input (U5), if it does."""
    budget = state.config.budget
    if budget is None:
        return None
    return _reached("session", budget, state.spent, state.seconds(now)[1])


def _used(budget: Budget, spent: Spending, seconds: float) -> list[tuple[str, float, float]]:
    """Each limit the budget sets: its name, what was used, the limit."""
    used = {
        "input_tokens": spent.input_tokens,
        "output_tokens": spent.output_tokens,
        "total_tokens": spent.total_tokens,
        "cost": spent.cost,
        "model_calls": spent.model_calls,
        "wall_seconds": seconds,
    }
    return [
        (name, used[name], limit)
        for name in _LIMITS
        if (limit := getattr(budget, name)) is not None
    ]


def _reached(scope: Scope, budget: Budget, spent: Spending, seconds: float) -> str | None:
    for name, used, limit in _used(budget, spent, seconds):
        if used >= limit:
            remedy = (
                "raise it (set_budget) to go on"
                if scope == "session"
                else "send again, with a larger budget, to go on"
            )
            return (
                f"the {scope} used {_figure(used)} of its {name} budget of {_figure(limit)};"
                f" {remedy}"
            )
    return None


def _near(scope: Scope, budget: Budget, spent: Spending, seconds: float) -> WarningData | None:
    share = budget.warn_at
    if share is None:
        return None
    for name, used, limit in _used(budget, spent, seconds):
        if used >= share * limit:
            text = (
                f"the {scope} used {_figure(used)} of its {name} budget of {_figure(limit)}"
                f" ({used / limit:.0%})"
            )
            kind = RUN_BUDGET if scope == "run" else SESSION_BUDGET
            return WarningData(warning_type=kind, message=text)
    return None


def _figure(value: float) -> str:
    """A count as itself, an amount with what precision it needs."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.6g}" if abs(value) < 1 else f"{value:,.2f}"
