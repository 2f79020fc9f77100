"""Sessions on Temporal (the `temporal` extra: `pip install '.[temporal]'` in the checkout;
spec section 15).

`Client(engine=TemporalEngine(...))` stores its sessions' inputs and follows their logs;
`Worker` processes (or `trimtab worker`) run their runs, one activity per attempt, taken over
by another worker when one dies or stalls. The log stays the only transcript: Temporal's
history holds ids, fences and counters.
"""

from __future__ import annotations

from trimtab.temporal._engine import DEFAULT_TASK_QUEUE, TemporalEngine, parse_engine_url
from trimtab.temporal._worker import Worker

__all__ = ["DEFAULT_TASK_QUEUE", "TemporalEngine", "Worker", "parse_engine_url"]
