"""Token calibration: how far the window's estimate is from what each model counts (spec X1).

The window's size is estimated without a tokenizer (`_window.estimate_tokens`: 4 characters
a token), which real tokenizers miss by a factor of 1.4 or more (code, JSON, other scripts).
Every model call logs its request's estimate next to the input tokens its provider reported
(`assistant.usage`), and a call the provider refused as too long logs the estimate and the
model's limit (a `context_length` warning): folded per model, they give the ratio by which
the estimate is scaled wherever the runtime compares it with the model's context. Resume is
replay, so a resumed session keeps what it learned.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "MAX_RATIO",
    "MIN_RATIO",
    "MIN_WEIGHT",
    "NONE",
    "OVERFLOW_MARGIN",
    "SIGNIFICANT",
    "Ratios",
    "observed",
    "overflowed",
    "ratio",
]

MIN_RATIO = 0.5
MAX_RATIO = 4.0
"""Bounds of a model's ratio (reported / estimated tokens). English prose runs ~0.8 on the
common tokenizers, code and JSON 1.2-2, scripts without spaces up to ~4; a figure outside
these is a provider's miscount (a cached prefix left out, a proxy's total), not the model's."""

MIN_WEIGHT = 0.25
"""The least weight a new observation of a full size (`SIGNIFICANT`) gets: the first ones are
averaged (1, 1/2, 1/3, ...), then each moves the ratio by a quarter of its difference, so that
the ratio follows a conversation whose content changes (prose, then a tool's JSON) within a
few calls."""

SIGNIFICANT = 1_000
"""Requests of at least this many tokens (by the estimate) count fully; a smaller one in
proportion to its size: its count is mostly the provider's per-message overhead, and the
ratio matters where a window nears the model's context, not in a short request."""

OVERFLOW_MARGIN = 1.1
"""A refused request was more than the model's limit: the ratio becomes at least this much
above `limit / estimate`, the least that explains the refusal."""

Ratios = Mapping[str, tuple[float, float]]
"""Model -> (ratio, the weight of the observations folded in: one per full-size request)."""

NONE: Ratios = MappingProxyType({})


def ratio(ratios: Ratios, model: str) -> float:
    """The factor that turns the window's estimate into `model`'s tokens (1 until learned)."""
    learned = ratios.get(model)
    return 1.0 if learned is None else learned[0]


def observed(ratios: Ratios, model: str, estimated: int | None, reported: int | None) -> Ratios:
    """`ratios` with one model call's figures folded in; unchanged when the call has no
    estimate (a log written before calibration) or its provider reported no tokens."""
    if not estimated or not reported or estimated <= 0 or reported <= 0:
        return ratios
    current, mass = ratios.get(model, (1.0, 0.0))
    size = min(1.0, estimated / SIGNIFICANT)
    weight = max(size / (mass + size), MIN_WEIGHT * size)  # (the first counts fully)
    sample = _bounded(reported / estimated)
    return {**ratios, model: (_bounded(current + weight * (sample - current)), mass + size)}


def overflowed(ratios: Ratios, model: str, estimated: int | None, limit: int | None) -> Ratios:
    """`ratios` after `model` refused a request estimated at `estimated` tokens as longer than
    its `limit`: the ratio is raised to explain it (never lowered)."""
    if not estimated or not limit or estimated <= 0 or limit <= 0:
        return ratios
    current, mass = ratios.get(model, (1.0, 0.0))
    least = _bounded(OVERFLOW_MARGIN * limit / estimated)
    if least <= current:
        return ratios
    return {**ratios, model: (least, mass)}


def _bounded(value: float) -> float:
    return min(MAX_RATIO, max(MIN_RATIO, value))
