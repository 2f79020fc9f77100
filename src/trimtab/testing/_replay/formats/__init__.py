"""The wire formats the replay server speaks, each converting to and from the canonical form."""

from __future__ import annotations

from trimtab.testing._replay.formats._base import ParsedRequest, Reply, WireFormat
from trimtab.testing._replay.formats.anthropic import ANTHROPIC
from trimtab.testing._replay.formats.openai_chat import OPENAI_CHAT, openai_error
from trimtab.testing._replay.formats.responses import RESPONSES

__all__ = ["FORMATS", "ParsedRequest", "Reply", "WireFormat", "format_for", "openai_error"]

FORMATS = (OPENAI_CHAT, RESPONSES, ANTHROPIC)


def format_for(path: str) -> WireFormat | None:
    """The format of a model request to `path`, or None if it is no model endpoint."""
    return next((f for f in FORMATS if f.handles(path)), None)
