"""The durations callers give (timeouts, intervals, lease lengths), checked where they enter."""

from __future__ import annotations

import math

__all__ = ["check_seconds"]


def check_seconds(name: str, value: float | None, *, bounded: bool = True) -> None:
    """Raise `ValueError` unless `value` is a positive number of seconds.

    NaN compares false with everything, so a plain `value <= 0` lets it through, and a wait
    bounded by NaN (or by infinity, where `bounded`) never ends: `bounded=False` is for the
    waits where None already means "no limit", and takes infinity as that too.
    """
    if value is None and not bounded:
        return
    try:
        # An int too large for a float (10**400) cannot be waited for either.
        seconds = float(value) if isinstance(value, int | float) else math.nan
    except OverflowError:
        seconds = math.nan
    if (
        isinstance(value, bool)
        or math.isnan(seconds)
        or seconds <= 0
        or (bounded and math.isinf(seconds))
    ):
        kind = "a positive, finite" if bounded else "a positive"
        raise ValueError(f"{name} must be {kind} number of seconds, got {value!r}")
