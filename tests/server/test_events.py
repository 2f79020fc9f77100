"""Every event trimtab emits parses with the official client's generated event parser.

That parser is strict: a missing required field or a non-UUID id makes the event vanish on
the client with no error anywhere (protocol section 5). So each event type gets a sample
with its optional fields left out, as `session.event` sends it, and must come out of
`copilot`'s `session_event_from_dict` with its type and required fields intact.

The same samples check that the stores' shortcut (each event written and read by its own
model, not the union) gives exactly what the union would.
"""

from __future__ import annotations

import typing
from datetime import datetime
from typing import Any

import pytest
from copilot.generated.session_events import SessionEventType, session_event_from_dict
from pydantic import ValidationError

from trimtab.events import Event, EventAdapter, event_from_json

KNOWN_TO_COPILOT = {member.value for member in SessionEventType}

SAMPLES: dict[str, dict[str, Any]] = {
    "session.start": {"sessionId": "s1"},
    "session.resume": {"eventCount": 3},
    "user.message": {"content": "hi", "messageId": "m1", "source": "user"},
    "assistant.turn_start": {"turnId": "0"},
    "assistant.message_delta": {"messageId": "a1", "deltaContent": "h"},
    "assistant.message": {
        "messageId": "a1",
        "content": "",
        "toolRequests": [{"toolCallId": "c1", "name": "echo", "arguments": {"text": "x"}}],
        "originatingMessageId": "m1",
    },
    "assistant.usage": {"model": "test-model", "cacheReadTokens": 3, "cost": 0.25},
    "assistant.turn_end": {"turnId": "0"},
    "tool.execution_start": {"toolCallId": "c1", "toolName": "echo", "arguments": "not json"},
    "tool.execution_complete": {
        "toolCallId": "c1",
        "success": False,
        "outcome": "denied",
        "error": {"message": "no", "code": "denied"},
    },
    "external_tool.requested": {
        "requestId": "r1",
        "sessionId": "s1",
        "toolCallId": "c1",
        "toolName": "echo",
    },
    "external_tool.completed": {"requestId": "r1"},
    "permission.requested": {
        "requestId": "r1",
        "permissionRequest": {"toolName": "echo", "toolCallId": "c1"},
    },
    "permission.completed": {"requestId": "r1", "result": {"kind": "approved"}},
    "session.context_cleared": {"messagesCleared": 2, "initialMessage": "Start over."},
    "session.compaction_start": {},
    "session.compaction_complete": {"success": True},
    "session.truncated": {"eventId": "e1", "eventsRemoved": 4},
    "session.pruned": {
        "eventsPruned": 10,
        "position": 11,
        "state": {"epoch": 1},
        "bases": [
            {
                "eventId": "e9",
                "type": "session.context_cleared",
                "timestamp": "2026-12-05T00:00:00Z",
                "contextEpoch": 1,
            }
        ],
    },
    "session.warning": {"warningType": "context_overflow", "message": "dropped a turn"},
    "session.info": {"infoType": "notification", "message": "noted"},
    "session.model_change": {"newModel": "other-model"},
    "session.title_changed": {"title": "Release notes", "auto": True},
    "session.plan_changed": {"operation": "update", "content": "# Plan"},
    "session.workspace_file_changed": {
        "operation": "create",
        "path": "notes/a.md",
        "content": "text",
    },
    "session.workspace_path_changed": {"operation": "rename", "path": "a", "destination": "b"},
    "session.permissions_changed": {"mode": "allow-all", "previousMode": "manual"},
    "command.queued": {"requestId": "r1", "command": "/deploy prod"},
    "command.completed": {"requestId": "r1"},
    "session.session_limits_changed": {
        "sessionLimits": {"maxAiCredits": 40.0},
        "budget": {"cost": 0.4, "modelCalls": 10},
    },
    "session.mode_changed": {"newMode": "plan", "previousMode": "interactive"},
    "pending_messages.modified": {},
    "session.shutdown": {
        "sessionStartTime": 1700000000000,
        "modelMetrics": {"m": {"requests": {"count": 1}, "usage": {"inputTokens": 3}}},
    },
    "session.usage_info": {"tokenLimit": 100, "currentTokens": 10, "messagesLength": 2},
    "session.error": {"errorType": "rate_limit", "message": "slow down"},
    "abort": {},
    "session.idle": {},
}


def event_types() -> list[str]:
    union = typing.get_args(typing.get_args(Event)[0])
    return [cls.model_fields["type"].default for cls in union]


def test_every_event_type_has_a_sample() -> None:
    # A new event type must be checked against the official parser before it ships.
    assert sorted(event_types()) == sorted(SAMPLES)


@pytest.mark.parametrize("event_type", sorted(SAMPLES))
def test_the_official_client_parses_the_event(event_type: str) -> None:
    event = EventAdapter.validate_python({"type": event_type, "data": SAMPLES[event_type]})
    wire = event.model_dump(by_alias=True, mode="json", exclude_none=True)
    parsed = session_event_from_dict(wire)
    assert str(parsed.id) == event.id and parsed.ephemeral is event.ephemeral
    if event_type in KNOWN_TO_COPILOT:
        assert parsed.type.value == event_type
        # What the client read back holds every field trimtab sent that it knows of.
        read_back = parsed.data.to_dict()
        for key in wire["data"].keys() & read_back.keys():
            assert _same(wire["data"][key], read_back[key]), key
    else:
        # trimtab's own event types reach the client as UNKNOWN, with their raw data.
        assert parsed.type is SessionEventType.UNKNOWN and parsed.raw_type == event_type


def _same(sent: Any, read: Any) -> bool:
    """Equal, counting `...Z` and `...+00:00` as the same instant."""
    if isinstance(sent, str) and isinstance(read, str) and sent != read:
        try:
            return datetime.fromisoformat(sent) == datetime.fromisoformat(read)
        except ValueError:
            return False
    return bool(sent == read)


@pytest.mark.parametrize("event_type", sorted(SAMPLES))
def test_an_event_reads_and_writes_by_its_model_as_by_the_union(event_type: str) -> None:
    event = EventAdapter.validate_python({"type": event_type, "data": SAMPLES[event_type]})
    body = event.model_dump_json()

    assert body.encode() == EventAdapter.dump_json(event)
    assert event_from_json(body, event_type) == event == EventAdapter.validate_json(body)
    assert event_from_json(body) == event


def test_an_event_read_under_another_type_is_refused() -> None:
    body = EventAdapter.validate_python({"type": "abort", "data": {}}).model_dump_json()

    with pytest.raises(ValidationError):
        event_from_json(body, "session.idle")
    # A type this version does not know leaves the choice to the union.
    assert event_from_json(body, "some.future_event").type == "abort"
