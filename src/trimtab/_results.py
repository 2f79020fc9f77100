"""What the host's context operations report: `clear_context`, `compact` and `truncate`.

Plain values, below every layer that produces or hands them out (the session's history, and
the `SessionHandle` a tool handler holds).
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr

__all__ = ["ClearContextResult", "CompactResult", "TruncateResult"]


class ClearContextResult(BaseModel):
    """What an accepted `clear_context` reports. Awaitable, so that `await` works from async
    code while a sync tool handler can use the result directly; a clear the host made
    between runs (spec X4) is stored once it is awaited."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    messages_cleared: int
    """Non-system, non-developer messages in the window when the clear was staged (C5)."""
    message_id: str | None = None
    """The seeded run's message id, for a clear the host made between runs (X4): its run is
    waited for as a `send`'s is."""
    _stored: asyncio.Future[None] | None = PrivateAttr(default=None)

    @classmethod
    def committing(
        cls, messages_cleared: int, message_id: str, stored: asyncio.Future[None]
    ) -> ClearContextResult:
        """The result of a host's clear, whose append `stored` settles (X4)."""
        result = cls(messages_cleared=messages_cleared, message_id=message_id)
        result._stored = stored
        return result

    def __await__(self) -> Generator[Any, None, ClearContextResult]:
        return self._self().__await__()

    async def _self(self) -> ClearContextResult:
        if self._stored is not None:
            await asyncio.shield(self._stored)  # (a waiter that gives up cancels nothing)
        return self


class CompactResult(BaseModel):
    """What a compaction did."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    success: bool
    """False when there was nothing to compact (the window is already small)."""
    summary: str | None = None
    """The summary that replaced the older messages (None if they were dropped unsummarised)."""
    messages_removed: int = 0
    tokens_removed: int = 0
    """Estimated tokens the window lost."""


class TruncateResult(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    events_removed: int
    """Events from the named one to the end of the log, which the window no longer holds."""
