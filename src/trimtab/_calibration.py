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

__all__ = [
    "MAX_RATIO",
    "MIN_RATIO",
    "MIN_WEIGHT",
    "NONE",
    "OVERFLOW_MARGIN",
    "SIGNIFICANT",
    "Ratios",
    "as_mapping",
    "from_mapping",
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

Ratios = tuple[tuple[str, float, float], ...]
"""(model, ratio, the weight of the observations folded in: one per full-size request), one
per model. A tuple, not a dict: every session holds one, mostly of a single model, and an
idle session's memory is budgeted (docs/performance.md)."""

NONE: Ratios = ()


def ratio(ratios: Ratios, model: str) -> float:
    """The factor that turns the window's estimate into `model`'s tokens (1 until learned)."""
    return _learned(ratios, model)[0]


def as_mapping(ratios: Ratios) -> dict[str, tuple[float, float]]:
    """Model -> (ratio, weight): how a snapshot keeps them."""
    return {model: (value, mass) for model, value, mass in ratios}


def from_mapping(mapping: Mapping[str, tuple[float, float]]) -> Ratios:
    return tuple((model, value, mass) for model, (value, mass) in mapping.items())


def _learned(ratios: Ratios, model: str) -> tuple[float, float]:
    """`model`'s ratio and weight; (1, 0) until learned."""
    for name, value, mass in ratios:
        if name == model:
            return value, mass
    return 1.0, 0.0


def _with(ratios: Ratios, model: str, value: float, mass: float) -> Ratios:
    return (*(entry for entry in ratios if entry[0] != model), (model, value, mass))


def observed(ratios: Ratios, model: str, estimated: int | None, reported: int | None) -> Ratios:
    """`ratios` with one model call's figures folded in; unchanged when the call has no
    estimate (a log written before calibration) or its provider reported no tokens."""
    if not estimated or not reported or estimated <= 0 or reported <= 0:
        return ratios
    current, mass = _learned(ratios, model)
    size = min(1.0, estimated / SIGNIFICANT)
    weight = max(size / (mass + size), MIN_WEIGHT * size)  # (the first counts fully)
    sample = _bounded(reported / estimated)
    return _with(ratios, model, _bounded(current + weight * (sample - current)), mass + size)


def overflowed(ratios: Ratios, model: str, estimated: int | None, limit: int | None) -> Ratios:
    """`ratios` after `model` refused a request estimated at `estimated` tokens as longer than
    its `limit`: the ratio is raised to explain it (never lowered)."""
    if not estimated or not limit or estimated <= 0 or limit <= 0:
        return ratios
    current, mass = _learned(ratios, model)
    least = _bounded(OVERFLOW_MARGIN * limit / estimated)
    if least <= current:
        return ratios
    return _with(ratios, model, least, mass)


def _bounded(value: float) -> float:
    return min(MAX_RATIO, max(MIN_RATIO, value))
