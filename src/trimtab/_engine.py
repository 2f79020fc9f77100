"""`Engine`: the seam to a durable execution engine that runs sessions' runs.

By default a `Client` runs its sessions' loops itself, holding each session's lease (spec
R1). Given an engine (`Client(engine=...)`), it runs none: a `send` stores its input in the
session's inbox, as for a session another runtime runs, and tells the engine, which has the
run executed by one of its workers and hands each attempt a fencing token (spec EN1-EN3).
The log stays the only transcript: the engine keeps ids, fences and counters, never messages.

A run on an engine asks its questions outside itself (a permission request, a call of a
tool its worker does not hold) through the log; whichever process has the session open with
what answers them (its permission handler, that tool) sends the `Answer` through the engine
(spec EN5, EN6).
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from trimtab._permissions import PermissionDecision
from trimtab.events import ToolOutcome

__all__ = ["MAX_ANSWER_BYTES", "Answer", "Engine", "PermissionAnswer", "ToolAnswer"]

MAX_ANSWER_BYTES = 1024 * 1024
"""The largest answer an engine carries (its JSON): answers pass through the engine's own
history once, where a payload past a few MiB is refused (spec EN6)."""


class PermissionAnswer(BaseModel):
    """A decision on a permission request a run announced (`permission.requested`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: Literal["permission"] = "permission"
    decision: PermissionDecision


class ToolAnswer(BaseModel):
    """How a call of a tool the worker does not hold ended, where the tool was (an
    `external_tool.requested`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: Literal["tool"] = "tool"
    outcome: ToolOutcome
    text: str
    """What the model reads."""
    references: list[str] = []
    """Deferred tools a successful call made callable."""


Answer: TypeAlias = Annotated[PermissionAnswer | ToolAnswer, Field(discriminator="kind")]
"""What a process that has the session open answers one of its run's questions with."""


class Engine(Protocol):
    """Where a `Client`'s sessions run when it does not run them itself (spec EN1)."""

    @property
    def name(self) -> str:
        """What the engine is, for messages (`temporal://host:port`)."""
        ...

    async def start(self) -> None:
        """Connect; called once by the `Client` that uses the engine, before any session."""
        ...

    async def stop(self) -> None:
        """Disconnect; the engine's workers and the runs they execute go on."""
        ...

    async def open_session(self, session_id: str) -> None:
        """Have the engine run the session from now on (idempotent): its runs, the inputs
        its inbox holds, and a run a crash or a park left in progress (EN2)."""
        ...

    async def submit(self, session_id: str, message_id: str) -> None:
        """Tell the engine an input waits in the session's inbox (stored before, so that
        nothing acknowledged is lost, P4); it runs in the order of the inbox (EN2)."""
        ...

    async def delete_session(self, session_id: str) -> None:
        """The session was deleted: the engine stops running it."""
        ...

    async def abort(self, session_id: str) -> None:
        """Stop the session's run in progress, parked or not; returns once it ended (E4)."""
        ...

    async def answer(self, session_id: str, request_id: str, answer: Answer) -> bool:
        """Answer a run's question; False when it is not pending (answered before, or its
        run ended without it, D7)."""
        ...
