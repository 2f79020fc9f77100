"""Matching a request against recorded conversations, independently of the wire format.

Every format converts its request to `ConversationMessage`s first; from there a request
matches a conversation when its messages are a prefix of it and the next recorded message is
an assistant's. Tool call ids compare by order of appearance, arguments as parsed JSON, and
system (and developer) messages are left out unless asked for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from trimtab.testing._replay.conversations import ConversationMessage, ConversationToolCall

__all__ = ["Match", "Normalized", "answer_calls", "estimate_tokens", "find_answer", "normalize"]


class Ids:
    """Numbers tool call ids by order of first appearance, so ids compare by position."""

    def __init__(self) -> None:
        self.by_id: dict[str, int] = {}

    def ordinal(self, call_id: str) -> int:
        """The number of `call_id`, given on first sight."""
        return self.by_id.setdefault(call_id, len(self.by_id))

    def id_of(self, ordinal: int) -> str | None:
        """The id numbered `ordinal`, if any."""
        return next((i for i, n in self.by_id.items() if n == ordinal), None)


@dataclass(frozen=True)
class Normalized:
    """A message reduced to what matching compares."""

    role: str
    content: str
    calls: tuple[tuple[str, str, int], ...]
    """(name, canonical JSON arguments, ordinal) of each tool call."""
    answers: int | None
    """On tool messages: the ordinal of the call answered."""
    position: int = field(compare=False)
    """Index in the original message list, for error messages."""
    source: ConversationMessage = field(compare=False)


def _canonical_json(text: str) -> str:
    # Text that is not JSON compares as `{}`: Anthropic's `tool_use.input` must be an object,
    # so invalid arguments go back to the server as `{}` (as do empty ones, everywhere).
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return "{}"


def normalize(
    messages: Sequence[ConversationMessage], *, match_system: bool
) -> tuple[list[Normalized], Ids]:
    """The messages to compare (system ones dropped unless matched) and their id numbering."""
    ids = Ids()
    result: list[Normalized] = []
    for position, message in enumerate(messages):
        # Providers may send "developer" as "system" (servers reject the former): one role.
        role = "system" if message.role == "developer" else message.role
        if role == "system" and not match_system:
            continue
        calls = tuple(
            (c.function.name, _canonical_json(c.function.arguments), ids.ordinal(c.id))
            for c in message.tool_calls or ()
        )
        answers = ids.ordinal(message.tool_call_id) if message.tool_call_id is not None else None
        content = message.content or ""
        result.append(Normalized(role, content, calls, answers, position, message))
    return result, ids


def _describe(message: Normalized) -> str:
    text = message.content if len(message.content) <= 120 else message.content[:117] + "..."
    parts = [f"{message.role} {text!r}"]
    parts += [f"call #{n} {name}({args})" for name, args, n in message.calls]
    if message.answers is not None:
        parts.append(f"answering call #{message.answers}")
    return ", ".join(parts)


@dataclass
class Match:
    """The recorded answer to a request, and the id numberings to translate its calls' ids."""

    answer: ConversationMessage
    conversation_ids: Ids
    request_ids: Ids


def _compare(
    index: int, recorded: list[Normalized], request: list[Normalized]
) -> tuple[int, str | None]:
    """How many request messages match, and why the conversation does not answer (or None)."""
    for i, got in enumerate(request):
        if i >= len(recorded):
            return i, f"conversation {index} has no message for request message {got.position}"
        if recorded[i] != got:
            return i, (
                f"conversation {index}, request message {got.position}: "
                f"expected {_describe(recorded[i])}; got {_describe(got)}"
            )
    if len(recorded) == len(request):
        return len(request), f"conversation {index} ends where the request ends"
    if recorded[len(request)].role != "assistant":
        role = recorded[len(request)].role
        return len(request), f"conversation {index} continues with a {role} message"
    return len(request), None


def find_answer(
    conversations: Sequence[tuple[list[Normalized], Ids]],
    messages: Sequence[ConversationMessage],
    *,
    match_system: bool,
) -> Match | str:
    """The match for a request, or an explanation of the closest miss."""
    request, request_ids = normalize(messages, match_system=match_system)
    best: tuple[int, str] = (-1, "the replay server has no conversations")
    for index, (recorded, ids) in enumerate(conversations):
        matched, reason = _compare(index, recorded, request)
        if reason is None:
            return Match(recorded[matched].source, ids, request_ids)
        best = max(best, (matched, reason), key=lambda b: b[0])
    return f"no recorded conversation continues these {len(messages)} messages; {best[1]}"


def answer_calls(match: Match) -> list[ConversationToolCall]:
    """The answer's tool calls with ids the client can match to what it already sent."""
    taken = set(match.request_ids.by_id)
    calls: list[ConversationToolCall] = []
    for call in match.answer.tool_calls or ():
        ordinal = match.conversation_ids.ordinal(call.id)
        call_id = match.request_ids.id_of(ordinal)
        if call_id is None:
            # A new call: keep the recorded id unless the client already uses it for another.
            call_id = call.id if call.id not in taken else f"call_replay_{ordinal}"
        calls.append(call.model_copy(update={"id": call_id}))
    return calls


def estimate_tokens(*texts: str | None) -> int:
    """A stand-in token count (4 characters a token), so usage is non-zero and stable."""
    return max(1, sum(len(t or "") for t in texts) // 4)
