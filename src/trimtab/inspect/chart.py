"""The token chart of the session page: tokens per model call, drawn as inline SVG.

The page draws it from this module's coordinates (no script, nothing fetched). A long session
is bucketed to at most `MAX_POINTS` points, each the largest call of its bucket, so that the
drawing stays small and the peaks stay visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trimtab.inspect.timeline import OpName, UsagePoint

__all__ = ["MAX_POINTS", "Chart", "Marker", "usage_chart"]

MAX_POINTS = 400

WIDTH, HEIGHT = 800, 180
"""The drawing's size in SVG units (it scales to the page's width)."""
_LEFT, _TOP, _BOTTOM = 56, 10, 22
"""Room for the axis labels."""


@dataclass(frozen=True, slots=True)
class Marker:
    """A context operation between two calls: a vertical line at `x`."""

    x: float
    operation: OpName


@dataclass(frozen=True, slots=True)
class Chart:
    points: int
    """Answers with token counts, one point each: the session's answered model calls and its
    compactions' summary calls."""
    peak: int
    """The most tokens of any one call, input or output: the top of the scale."""
    total_in: int
    total_out: int
    input_points: str
    """SVG `points` of the input tokens' line."""
    output_points: str
    markers: list[Marker]
    width: int = WIDTH
    height: int = HEIGHT
    left: int = _LEFT
    top: int = _TOP
    bottom: int = HEIGHT - _BOTTOM


def _buckets(usage: Sequence[UsagePoint]) -> list[tuple[int, int]]:
    """Input and output tokens per point: each the maximum over a run of consecutive calls."""
    size = max(1, -(-len(usage) // MAX_POINTS))
    return [
        (
            max(p.input_tokens for p in usage[start : start + size]),
            max(p.output_tokens for p in usage[start : start + size]),
        )
        for start in range(0, len(usage), size)
    ]


def usage_chart(usage: Sequence[UsagePoint], markers: Sequence[tuple[int, OpName]]) -> Chart | None:
    """The chart of a session's model calls and context operations; None before any call."""
    if not usage:
        return None
    points = _buckets(usage)
    peak = max(1, *(max(p) for p in points))
    span = WIDTH - _LEFT - 8
    bottom = HEIGHT - _BOTTOM

    def x(index: float, count: int) -> float:
        return _LEFT + (span * index / (count - 1) if count > 1 else span / 2)

    def line(values: list[int]) -> str:
        height = bottom - _TOP
        return " ".join(
            f"{x(i, len(values)):.1f},{bottom - height * v / peak:.1f}"
            for i, v in enumerate(values)
        )

    return Chart(
        points=len(usage),
        peak=peak,
        total_in=sum(p.input_tokens for p in usage),
        total_out=sum(p.output_tokens for p in usage),
        input_points=line([p[0] for p in points]),
        output_points=line([p[1] for p in points]),
        # An operation after the k-th call sits between points k-1 and k.
        markers=[
            Marker(round(x(max(before - 0.5, 0), len(usage)), 1), operation)
            for before, operation in markers
        ],
    )
