"""The baseline of `bench/temporal.py`: bare `temporalio` workflows doing one activity per
request. A module of its own, importing nothing but temporalio: the workflow sandbox imports
it again for every workflow run."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

__all__ = ["SEEN", "BareNudged", "BareOneActivity", "BareUpdates", "noop", "seen"]

SEEN: dict[int, asyncio.Future[None]] = {}
"""Futures the `seen` activity resolves, by request number (activities run in the client's
process here, outside the sandbox)."""


@activity.defn(name="bare.noop")
async def noop(n: int) -> int:
    return n + 1


@workflow.defn(name="bare.Updates")
class BareUpdates:
    """A long-lived workflow whose update returns once the activity it ran returned."""

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update
    async def ask(self, n: int) -> int:
        result: int = await workflow.execute_activity(
            noop, n, start_to_close_timeout=timedelta(seconds=30)
        )
        return result


@workflow.defn(name="bare.OneActivity")
class BareOneActivity:
    @workflow.run
    async def run(self, n: int) -> int:
        result: int = await workflow.execute_activity(
            noop,
            n,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )
        return result


@activity.defn(name="bare.seen")
async def seen(n: int) -> None:
    future = SEEN.pop(n, None)
    if future is not None and not future.done():
        future.set_result(None)


@workflow.defn(name="bare.Nudged")
class BareNudged:
    """A long-lived workflow like trimtab's: an update only queues a request (it returns once
    accepted), and the workflow runs an activity per queued request; the client learns the
    activity ran from the activity itself (as a trimtab client learns a run ended from the
    log), not from the workflow."""

    def __init__(self) -> None:
        self.pending: list[int] = []

    @workflow.run
    async def run(self) -> None:
        while True:
            await workflow.wait_condition(lambda: bool(self.pending))
            n = self.pending.pop(0)
            await workflow.execute_activity(
                seen,
                n,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )

    @workflow.update
    def submit(self, n: int) -> None:
        self.pending.append(n)
