"""`SessionMetrics`: what a session spent, read from its log (spec K5).

Every model call leaves an `assistant.usage` event, so the log alone says how many calls each
model answered, with how many tokens and how much time; nothing is counted on the side.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from trimtab.events import (
    AssistantUsageEvent,
    Event,
    ModelMetric,
    ModelRequests,
    ModelTokens,
    SessionPrunedEvent,
    SessionStartEvent,
    Spending,
    UserMessageEvent,
    now,
)

__all__ = ["SessionMetrics", "metrics_of"]


class SessionMetrics(BaseModel):
    """A session's usage so far."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    start_time: datetime
    api_duration_ms: float = 0.0
    """Milliseconds spent waiting for model calls."""
    user_requests: int = 0
    """Inputs sent to the session (the seed of a clear is not one)."""
    last_call_tokens: tuple[int, int] = (0, 0)
    """Input and output tokens of the latest model call."""
    models: dict[str, ModelMetric] = Field(default_factory=dict)
    """Calls and tokens by model."""


def metrics_of(events: Iterable[Event]) -> SessionMetrics:
    """The metrics of a session's log (its events, oldest first)."""
    start: datetime | None = None
    duration, requests, last = 0.0, 0, (0, 0)
    spent: dict[str, Spending] = {}
    for event in events:
        match event:
            case SessionStartEvent():
                start = event.data.start_time
            case AssistantUsageEvent():
                data = event.data
                last = (data.input_tokens or 0, data.output_tokens or 0)
                spent[data.model] = (spent.get(data.model) or Spending()).plus(data)
                duration += data.duration or 0.0
            case UserMessageEvent() if event.data.source not in _NOT_INPUTS:
                requests += 1
            case SessionPrunedEvent() if event.data.metrics:  # what the events it replaced spent
                pruned = SessionMetrics.model_validate(event.data.metrics)
                duration, requests = pruned.api_duration_ms, pruned.user_requests
                last = pruned.last_call_tokens
                spent = {
                    model: Spending(
                        model_calls=m.requests.count,
                        input_tokens=m.usage.input_tokens,
                        output_tokens=m.usage.output_tokens,
                        cache_read_tokens=m.usage.cache_read_tokens,
                        cost=m.requests.cost,
                    )
                    for model, m in pruned.models.items()
                }
            case _:
                pass
    models = {
        model: ModelMetric(
            requests=ModelRequests(count=used.model_calls, cost=used.cost),
            usage=ModelTokens(
                input_tokens=used.input_tokens,
                output_tokens=used.output_tokens,
                cache_read_tokens=used.cache_read_tokens,
            ),
        )
        for model, used in spent.items()
    }
    return SessionMetrics(
        start_time=start or now(),
        api_duration_ms=duration,
        user_requests=requests,
        last_call_tokens=last,
        models=models,
    )


_NOT_INPUTS = frozenset({"context_cleared", "hook", "output"})
"""Messages the runtime wrote: a clear's seed, hooks' notes, a typed result's retry (OUT3)."""
