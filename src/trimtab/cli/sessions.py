"""`trimtab sessions list | show | events | prune | rm`: the stored sessions, read from the
store.

Reading never resumes a session: a session run by another process stays untouched (no lease
taken, no `session.resume` appended), and never creates a store that is not there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic.alias_generators import to_camel

from trimtab import Event, PruneError, SessionNotFoundError
from trimtab._retention import prune_log
from trimtab.cli.config import Resolved
from trimtab.cli.errors import EXIT_USAGE, CliError
from trimtab.cli.host import SessionHost, in_use, persisted_config
from trimtab.cli.render import (
    Terminal,
    describe,
    event_json,
    format_time,
    one_line,
    printable,
    table,
)
from trimtab.cli.runtime import Portal
from trimtab.cli.status import Status
from trimtab.events import AssistantUsageEvent, SessionContextClearedEvent
from trimtab.store import SessionRecord

__all__ = [
    "events_table",
    "list_sessions",
    "provider_text",
    "prune_sessions",
    "remove_sessions",
    "session_events",
    "sessions_table",
    "show_session",
]

_FOLLOW_INTERVAL = 0.25
"""Seconds between looks for new events: the store has no cross-process notification."""


def _record_json(record: SessionRecord, status: Status | None = None) -> dict[str, Any]:
    # camelCase, like the events and the Copilot protocol's session listings.
    data = record.model_dump(mode="json")
    if status is not None:
        data["status"] = status
    return {to_camel(name): value for name, value in data.items()}


def sessions_table(
    records: Sequence[tuple[SessionRecord, Status]], width: int | None, current: str = ""
) -> str:
    """Sessions and their states as a table; `current` is marked with `*`."""
    rows = [
        [
            ("* " if r.session_id == current else "") + r.session_id,
            format_time(r.updated_at),
            str(r.event_count),
            status,
            one_line(r.summary or "", 200),
        ]
        for r, status in records
    ]
    return table(["ID", "UPDATED", "EVENTS", "STATUS", "FIRST MESSAGE"], rows, width=width)


def events_table(events: Iterable[Event], width: int | None, start: int = 1) -> str:
    """Events as a table, numbered from `start`."""
    rows = [
        [str(number), format_time(e.timestamp, with_date=False), e.type, describe(e)]
        for number, e in enumerate(events, start)
    ]
    return table(["#", "TIME", "TYPE", "DETAIL"], rows, width=width)


def list_sessions(resolved: Resolved, *, as_json: bool) -> int:
    """Print every session and its state, most recently active first."""
    term = Terminal.detect()
    with Portal(term) as portal, SessionHost(portal, resolved, term, read_only=True) as host:
        records = [(record, host.status(record)) for record in host.records()]
    if as_json:
        term.line(json.dumps([_record_json(r, status) for r, status in records], indent=2))
    elif not records:
        term.note("no sessions yet: start one with 'trimtab chat' or 'trimtab run'")
    else:
        term.line(sessions_table(records, term.width))
    return 0


def show_session(resolved: Resolved, wanted: str, *, as_json: bool) -> int:
    """Print one session's record, configuration and totals."""
    term = Terminal.detect()
    with Portal(term) as portal, SessionHost(portal, resolved, term, read_only=True) as host:
        session_id = host.find(wanted)
        record = portal.call(host.store.get(session_id))
        events = host.events(session_id)
        status = host.status(record)
    details = _details(record, events, status)
    if as_json:
        term.line(printable(json.dumps(details, indent=2, ensure_ascii=False), json=True))
        return 0
    config, usage = details["config"], details["usage"]
    provider = config.get("provider") or {}
    rows = [
        ("id", record.session_id),
        ("created", format_time(record.created_at)),
        ("updated", format_time(record.updated_at)),
        ("events", str(record.event_count)),
        ("status", status + (f", open in {record.lease_owner}" if record.lease_owner else "")),
        ("model", config.get("model") or "-"),
        ("provider", provider_text(provider)),
        ("system", one_line(config.get("systemMessage") or "-")),
        ("tools", ", ".join(tool["name"] for tool in config.get("tools", [])) or "-"),
        ("clears", str(details["contextClears"])),
        ("usage", _usage_text(usage)),
        ("first message", record.summary or "-"),
    ]
    size = max(len(key) for key, _ in rows) + 2
    term.line("\n".join(f"{key:<{size}}{printable(value)}" for key, value in rows))
    return 0


_WIRE_APIS = {"completions": "Chat Completions API", "responses": "Responses API"}

_SECONDS = {"timeout": "timeout", "stallTimeout": "stall timeout"}
_NAMED = {
    "deployment": "deployment",
    "apiVersion": "API version",
    "wireModel": "model on the wire",
    "modelPath": "model file",
}


def provider_text(provider: dict[str, Any]) -> str:
    """A session's logged provider config (wire keys) as a person reads it: `openai at URL,
    Chat Completions API, 2 retries`. Only what applies to its type: the embedded model has
    no wire API and makes no retries."""
    if not provider:
        return "-"
    kind = str(provider.get("type", "?"))
    parts = [kind + (f" at {provider['baseUrl']}" if "baseUrl" in provider else "")]
    http = kind != "local"
    for key, value in provider.items():
        if key in ("type", "baseUrl"):
            continue
        if key == "wireApi":
            if kind in ("openai", "azure"):
                parts.append(_WIRE_APIS.get(str(value), f"{value} API"))
        elif key == "maxRetries":
            if http:
                parts.append(f"{value} {'retry' if value == 1 else 'retries'}")
        elif key in _SECONDS:
            parts.append(f"{_SECONDS[key]} {value:g} s")
        elif key == "headers" and isinstance(value, dict):
            if value:  # (the log keeps no header that may carry a credential)
                parts.append("headers " + ", ".join(map(str, value)))
        else:
            parts.append(f"{_NAMED.get(key, key)} {value}")
    return ", ".join(parts)


def _usage_text(usage: dict[str, int]) -> str:
    calls, tokens_in, tokens_out = usage["modelCalls"], usage["inputTokens"], usage["outputTokens"]
    return f"{calls} model calls, {tokens_in} tokens in, {tokens_out} out"


def _details(record: SessionRecord, events: list[Event], status: Status) -> dict[str, Any]:
    usage = [e.data for e in events if isinstance(e, AssistantUsageEvent)]
    config = persisted_config(events)
    return {
        **_record_json(record, status),
        "config": config.model_dump(by_alias=True, mode="json", exclude_none=True),
        "contextClears": sum(isinstance(e, SessionContextClearedEvent) for e in events),
        "usage": {
            "modelCalls": len(usage),
            "inputTokens": sum(u.input_tokens or 0 for u in usage),
            "outputTokens": sum(u.output_tokens or 0 for u in usage),
        },
    }


def session_events(resolved: Resolved, wanted: str, *, as_json: bool, follow: bool) -> int:
    """Print a session's stored events; with `follow`, keep printing new ones until Ctrl-C."""
    term = Terminal.detect()
    with Portal(term) as portal, SessionHost(portal, resolved, term, read_only=True) as host:
        session_id = host.find(wanted)
        seen = _print_events(term, host.events(session_id), as_json, start=1, header=True)
        if follow:
            _follow(term, host, session_id, seen, as_json)
    return 0


def _print_events(
    term: Terminal, events: list[Event], as_json: bool, *, start: int, header: bool
) -> int:
    """Print events; returns the number of the last one."""
    if as_json:
        for event in events:
            term.line(event_json(event))
    elif events:
        lines = events_table(events, term.width, start).split("\n")
        term.line("\n".join(lines if header else lines[1:]))
    return start + len(events) - 1


def _follow(term: Terminal, host: SessionHost, session_id: str, seen: int, as_json: bool) -> None:
    # Only stored events can be followed from another process: deltas are never stored.
    try:
        while True:
            time.sleep(_FOLLOW_INTERVAL)
            new = host.events(session_id, after=seen)
            if new:
                seen = _print_events(term, new, as_json, start=seen + 1, header=False)
    except KeyboardInterrupt:
        pass  # the way to stop following
    except SessionNotFoundError:
        term.note(f"session {session_id} was deleted")


def remove_sessions(resolved: Resolved, wanted: Sequence[str], *, force: bool) -> int:
    """Delete sessions; one in use elsewhere (or whose holder died, until its lease expires)
    needs `force`."""
    term = Terminal.detect()
    with Portal(term) as portal, SessionHost(portal, resolved, term, read_only=True) as host:
        ids = [host.find(given) for given in wanted]
        for session_id in ids:
            record = portal.call(host.store.get(session_id))
            if record.lease_owner and not force:
                raise in_use(session_id, record, forceable=True)
            portal.call(host.client.delete_session(session_id))
            term.line(f"deleted {session_id}")
    return 0


def prune_sessions(resolved: Resolved, wanted: Sequence[str], *, every: bool) -> int:
    """Prune sessions before their windows' bases (spec X8); one in use elsewhere is refused,
    or skipped with `every`."""
    if every == bool(wanted):
        raise CliError(
            "name the sessions to prune, or pass --all",
            hint="see 'trimtab sessions list'",
            exit_code=EXIT_USAGE,
        )
    term = Terminal.detect()
    with Portal(term) as portal, SessionHost(portal, resolved, term, read_only=True) as host:
        records = portal.call(host.store.list_sessions()) if every else None
        ids = [r.session_id for r in records] if records else [host.find(w) for w in wanted]
        for session_id in ids:
            record = portal.call(host.store.get(session_id))
            if record.lease_owner:
                if every:
                    term.line(f"skipped {session_id}: in use by {record.lease_owner}")
                    continue
                raise in_use(session_id, record)
            try:
                result = portal.call(prune_log(host.store, session_id))
            except PruneError as exc:
                raise CliError(f"session {session_id} was not pruned: {exc}") from None
            if result.events_removed:
                term.line(
                    f"pruned {session_id}: {result.events_removed} events before its window"
                    f" (event {result.position} holds what they were)"
                )
            else:
                term.line(f"nothing to prune in {session_id}")
    return 0
