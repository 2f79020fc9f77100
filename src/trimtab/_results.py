"""What the host's context operations report: `clear_context`, `compact` and `truncate`.

Plain values, below every layer that produces or hands them out (the session's history, and
the `SessionHandle` a tool handler holds).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["ClearContextResult", "CompactResult", "TruncateResult"]


class ClearContextResult(BaseModel):
    """What an accepted `clear_context` reports. Awaitable, so that `await` works from async
    code while a sync tool handler can use the result directly."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    messages_cleared: int
    """Non-system, non-developer messages in the window when the clear was staged (C5)."""

    def __await__(self) -> Generator[Any, None, ClearContextResult]:
        return self._self().__await__()

    async def _self(self) -> ClearContextResult:
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
