"""`Digest`: what the sessions page tells about one session, folded from its log.

The state follows the rules of `trimtab sessions list`: a run that has not ended is `running`
while a process holds the session's lease and `interrupted` once none does; a run that ended
in `session.error` leaves the session `failed` until the next message. When a run ends is the
replay's to say (`SessionState.apply`), so that the inspector and the runtime never disagree.

Every page counts model calls from here (`Summary.model_calls`), and tells a truncation that
withdraws an aborted run from any other with `Withdrawals` (spec L7).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from trimtab._state import SessionState, state_of
from trimtab.events import (
    AbortEvent,
    AssistantTurnStartEvent,
    AssistantUsageEvent,
    Event,
    SessionCompactionCompleteEvent,
    SessionErrorEvent,
    SessionPrunedEvent,
    SessionResumeEvent,
    SessionStartEvent,
    SessionTruncatedEvent,
    Spending,
    UserMessageEvent,
)

__all__ = ["Digest", "Status", "Summary", "Withdrawals", "summarize"]

Status: TypeAlias = Literal["idle", "running", "failed", "interrupted"]


@dataclass(frozen=True, slots=True)
class Summary:
    """A session's figures at one length of its log (`event_count`)."""

    event_count: int
    model: str | None
    provider: str | None
    forked_from: str | None
    model_calls: int
    """Calls of the session's model: its turns (`assistant.turn_start`), answered or not, as
    the window pages number them. A compaction's summary call is not one."""
    input_tokens: int
    output_tokens: int
    spent: Spending
    """What its model calls spent (spec U2): tokens, cached tokens, cost."""
    clears: int
    compactions: int
    truncations: int
    """Truncations other than withdrawals."""
    withdrawals: int
    """Aborted runs withdrawn from the window (`Withdrawals`)."""
    run_open: bool
    failed: bool

    def status(self, *, held: bool) -> Status:
        """The session's state, given whether a live process holds its lease."""
        if self.run_open:
            return "running" if held else "interrupted"
        return "failed" if self.failed else "idle"


@dataclass(slots=True)
class Withdrawals:
    """Tells the truncations that withdraw an aborted run (spec L6: chat's Ctrl-C truncates at
    the run's `user.message`) from the others; `see` every event, in order."""

    _run: str | None = None
    """The `user.message` that started the latest run."""
    _aborted: str | None = None
    """That message, once its run was aborted (and nothing else has been truncated since)."""

    def see(self, event: Event) -> bool:
        """Take `event` into account; True if it withdraws the run aborted just before."""
        match event:
            case UserMessageEvent() if event.data.source != "context_cleared":
                self._run, self._aborted = event.id, None
            case AbortEvent():
                self._aborted = self._run
            case SessionTruncatedEvent():
                withdrawn = self._aborted is not None and event.data.event_id == self._aborted
                self._aborted = None
                return withdrawn
            case _:
                pass
        return False


@dataclass(slots=True)
class Digest:
    """Folds a log, one event at a time, into a `Summary`."""

    state: SessionState = field(default_factory=lambda: state_of(()))
    """The runtime's own replay: it says when a run ends, and what it used."""
    event_count: int = 0
    model: str | None = None
    provider: str | None = None
    forked_from: str | None = None
    model_calls: int = 0
    compactions: int = 0
    truncations: int = 0
    withdrawals: int = 0
    run_open: bool = False
    failed: bool = False
    _withdrawn: Withdrawals = field(default_factory=Withdrawals)

    def apply(self, event: Event) -> None:
        """Take the next persisted event into account."""
        ended = self.state.apply(event)
        self.event_count += 1
        withdrawal = self._withdrawn.see(event)
        match event:
            case SessionStartEvent():
                config = event.data.config
                self.model, self.forked_from = config.model, event.data.forked_from
                self.provider = str((config.provider or {}).get("type") or "") or None
            case SessionResumeEvent() if event.data.config is not None:
                self.model = event.data.config.model or self.model
            case UserMessageEvent():
                self.run_open = True
                if event.data.source != "context_cleared":
                    self.failed = False
            case AssistantTurnStartEvent():
                self.model_calls += 1
                self.model = event.data.model or self.model
            case AssistantUsageEvent():
                self.model = self.model or event.data.model
            case SessionCompactionCompleteEvent() if event.data.success:
                self.compactions += 1
            case SessionTruncatedEvent() if withdrawal:
                self.withdrawals += 1
            case SessionTruncatedEvent():
                self.truncations += 1
            case SessionPrunedEvent():  # what the events it replaced counted (spec X8)
                self.event_count, self.model_calls = event.data.position, self.state.turns
                bases = [base.type for base in event.data.bases]
                self.compactions += bases.count("session.compaction_complete")
                self.truncations += bases.count("session.truncated")
                self.run_open = self.state.run_id is not None
            case SessionErrorEvent():
                self.run_open, self.failed = False, True
            case AbortEvent():
                self.run_open = False
            case _:
                pass
        if ended:
            self.run_open = False

    def summary(self) -> Summary:
        """The figures so far."""
        usage = self.state.usage
        return Summary(
            event_count=self.event_count,
            model=self.model,
            provider=self.provider,
            forked_from=self.forked_from,
            model_calls=self.model_calls,
            input_tokens=usage.input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
            spent=self.state.spent,
            clears=self.state.epoch,
            compactions=self.compactions,
            truncations=self.truncations,
            withdrawals=self.withdrawals,
            run_open=self.run_open,
            failed=self.failed,
        )


def summarize(events: Iterable[Event]) -> Summary:
    """The summary of a whole log."""
    digest = Digest()
    for event in events:
        digest.apply(event)
    return digest.summary()
