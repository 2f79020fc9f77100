"""The handoff policy (spec X5): past a share of the model's context, a run hands its work to
a fresh window instead of compacting.

The session's own model writes a handoff note (`summarize_for_handoff`); a clear is committed
whose seed is the note and the request the run is working on, in one append with the seed's
`user.message`, and the run goes on as that clear's seeded run (C8): one epoch, the seed once,
and a crash after the append finds the seed to run (C10).
"""

from __future__ import annotations

from trimtab._compaction import handoff_due, summarize_for_handoff
from trimtab._run_context import RunContext, Writer
from trimtab._state import SessionState
from trimtab.events import (
    ContextClearedData,
    SessionContextClearedEvent,
    UserMessageData,
    UserMessageEvent,
    new_id,
)

__all__ = ["HANDOFF_SEED", "hand_off"]

HANDOFF_SEED = """\
{note}

---
You are taking this work over in a fresh context, from the handoff note above. The request \
being worked on:

{request}"""


async def hand_off(ctx: RunContext, log: Writer, request: str | None) -> tuple[str, str] | None:
    """Hand the run's work to a fresh window when the next request passes the policy's
    threshold: the seed committed and the request it carries over (`request`, else the
    window's newest user message), or None when no handoff was due or the note could not be
    written (the window is then fitted as usual)."""
    state = log.state
    if not handoff_due(ctx, state) or state.pending_seed is not None:
        # (A seed not answered yet is a fresh window already: handing it off again would
        # only write notes about notes.)
        return None
    note = await summarize_for_handoff(ctx, log)
    if not note:
        return None
    request = request or _last_request(state)
    seed = HANDOFF_SEED.format(note=note, request=request)
    cleared = ContextClearedData(messages_cleared=state.messages_cleared(), initial_message=seed)
    message = UserMessageData(content=seed, message_id=new_id(), source="context_cleared")
    await log.emit_all((SessionContextClearedEvent(data=cleared), UserMessageEvent(data=message)))
    return seed, request


def _last_request(state: SessionState) -> str:
    """The newest user message of the window: the request of a run a crash interrupted,
    whose prompt this runtime was not given."""
    return next((m.content for m in reversed(state.conversation()) if m.role == "user"), "")
