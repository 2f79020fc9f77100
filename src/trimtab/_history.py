"""`session.history`: the host's operations on the context window.

Every operation appends events that move the window's base; none edits the log, so every
earlier window stays readable and the session id never changes.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from trimtab._compaction import CompactResult, compact, summarize_for_handoff
from trimtab._errors import TrimtabError
from trimtab._replay import replay
from trimtab.events import SessionTruncatedEvent, TruncatedData

if TYPE_CHECKING:
    from trimtab._session import Session

__all__ = ["ClearContextResult", "CompactResult", "History", "TruncateResult"]


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


class TruncateResult(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    events_removed: int
    """Events from the named one to the end of the log, which the window no longer holds."""


class History:
    """Context operations on a session's window (`session.history`)."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    def clear_context(self, prompt: str) -> ClearContextResult:
        """Stage a clear of the model-facing conversation, seeded with `prompt` (spec C1-C11).

        Call it from a tool handler. The clear commits when that tool call succeeds, then the
        session runs `prompt` in the fresh window; if the call fails the clear is discarded.
        Raises `ClearContextError` (`remote_session`, `empty_prompt`, `no_tool_call_in_flight`
        or `clear_pending`) and changes nothing when the clear cannot be accepted.
        """
        return self._session._stage_clear(prompt)

    async def compact(self, custom_instructions: str | None = None) -> CompactResult:
        """Summarise the older conversation with the session's model; keep the newest messages.

        Runs between runs (queued behind a run in flight). Emits `session.compaction_start`
        and `session.compaction_complete`.
        """
        session = self._session
        return await session._exclusive(
            lambda: compact(session, trigger="manual", custom_instructions=custom_instructions)
        )

    async def truncate(self, event_id: str) -> TruncateResult:
        """Make the window forget `event_id` and everything after it; the log keeps them."""
        session = self._session

        async def apply() -> TruncateResult:
            events = await session.get_events()
            cut = next((i for i, e in enumerate(events) if e.id == event_id), None)
            if not cut:  # not found, or the session.start event
                raise ValueError(
                    f"no event {event_id!r} to truncate at in session {session.session_id}"
                )
            data = TruncatedData(
                event_id=event_id,
                events_removed=len(events) - cut,
                base=replay(events[:cut]).conversation(),
            )
            await session.emit(SessionTruncatedEvent(data=data))
            return TruncateResult(events_removed=data.events_removed)

        return await session._exclusive(apply)

    async def fork(self, event_id: str | None = None) -> Session:
        """A new session whose log is a copy of this one's before `event_id` (all of it if None)."""
        return await self._session._fork(event_id)

    async def summarize_for_handoff(self) -> str:
        """A markdown summary of the conversation for handing the work to another session.

        Refused on a remote session (spec R1): its model call would be logged here."""
        session = self._session
        if session.is_remote:
            raise TrimtabError(
                f"session {session.session_id} is run by another runtime (remote): "
                "summarize it there"
            )
        return await summarize_for_handoff(session)
