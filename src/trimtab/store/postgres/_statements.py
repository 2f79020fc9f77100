"""The store's statements, and the parameters of its append (docs: scale-out.md 4.2-4.5).

Each store call is one statement (a create is one transaction), so that a call costs one
round trip. Parameters that hold many values (a batch of events, the live events sent with
it) travel as one JSON text each, unpacked by the statement: psycopg dumps a list element
by element in Python, which cost more of this process's CPU than the rest of the statement.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from trimtab.events import Event
from trimtab.store._base import Lease, claimed_input, summarize

__all__ = [
    "ACQUIRE",
    "APPEND",
    "APPEND_STATE",
    "CHANNEL",
    "DELETE",
    "DISCARD_INPUTS",
    "PRUNE",
    "PRUNE_MARKER",
    "PRUNE_STATE",
    "ENQUEUE_INPUT",
    "GET",
    "LIST_SESSIONS",
    "LIVE_CHANNEL",
    "LOAD_SNAPSHOT",
    "NOTIFY_ALL",
    "PENDING_INPUTS",
    "READ",
    "RELEASE",
    "RENEW",
    "SAVE_SNAPSHOT",
    "SESSIONS_WITH_INPUTS",
    "append_params",
    "json_text",
    "live_payload",
    "text",
]

log = logging.getLogger(__name__)

CHANNEL = "trimtab_events"
"""The doorbell channel. Payload: `<session_id>:<last seq>` (0 when the session was deleted)."""

LIVE_CHANNEL = "trimtab_live"
"""The ephemeral events' channel. Payload: `["<session_id>", <after>]`, a newline, the event."""

_NOTIFY_LIMIT = 8000
"""PostgreSQL's limit on a NOTIFY payload, in bytes."""

# The fenced append (scale-out.md 4.3). With no lease (`token` NULL) it is unfenced. It stores
# nothing, and returns no row, when the session is unknown, the lease is not the session's
# current live one, the batch's first event is already in the log (the batch is a retry), or
# the batch follows an event (`parent`, leased appends only) that is not the log's last: a
# crash of the server lost appends this runtime made (spec P5). A user message claims the
# queued input it delivers, in the same statement. `sync` is the commit's
# `synchronous_commit`: 'off' for an append that need not wait for the disk, else the
# connection's own setting (set_config's local value is read at the commit, which ends the
# statement's own transaction). The ephemeral events published before the append and not sent
# yet (`live`) go in the same statement, before its doorbell: the aggregate over them is done
# before the join yields the row whose select list rings it. Those that follow events of this
# batch (`carried`, `CarriesLive`) are sent by the select list itself, before the doorbell,
# so only when the batch is stored: a listener reads the events they follow first.
#
# The batch (`events`: `[id, type, payload, claimed message id]` per event) and `live` come as
# one JSON text each. Each payload travels as a JSON string, so that `->>` gives back its
# exact text (a nested value would be re-read by the server, which refuses `\u0000` in it).
APPEND = f"""
    WITH new AS (
        SELECT e->>0 AS id, e->>1 AS type, (e->>2)::json AS payload, e->>3 AS message_id, n
        FROM json_array_elements(%(events)s::json) WITH ORDINALITY AS batch (e, n)
    ),
    session AS (
        UPDATE sessions
        SET last_seq = last_seq + %(count)s,
            updated_at = now(),
            summary = COALESCE(summary, %(summary)s)
        WHERE session_id = %(session_id)s
          AND (%(token)s::bigint IS NULL
               OR (%(lease_session)s = session_id
                   AND lease_owner = %(owner)s
                   AND lease_token = %(token)s
                   AND lease_expires_at > now()))
          AND NOT EXISTS (
              SELECT FROM session_events
              WHERE session_id = %(session_id)s AND id = %(first_id)s)
          AND (%(token)s::bigint IS NULL OR %(parent)s::text IS NULL OR EXISTS (
              SELECT FROM session_events
              WHERE session_id = %(session_id)s AND seq = sessions.last_seq
                AND id = %(parent)s))
        RETURNING last_seq
    ),
    claimed AS (
        UPDATE session_inputs i SET claimed_seq = session.last_seq - %(count)s + new.n
        FROM session, new
        WHERE i.session_id = %(session_id)s AND i.message_id = new.message_id
          AND i.claimed_seq IS NULL
    ),
    stored AS (
        INSERT INTO session_events (session_id, seq, id, type, payload, lease_token)
        SELECT %(session_id)s, session.last_seq - %(count)s + new.n,
               new.id, new.type, new.payload, %(token)s
        FROM session, new
    )
    SELECT last_seq,
           (SELECT count(pg_notify('{LIVE_CHANNEL}', payload))
            FROM json_array_elements_text(%(carried)s::json) AS payload),
           pg_notify('{CHANNEL}', %(session_id)s || ':' || last_seq),
           set_config('synchronous_commit',
                      COALESCE(%(sync)s, current_setting('synchronous_commit')), true)
    FROM session,
         (SELECT count(pg_notify('{LIVE_CHANNEL}', payload))
          FROM json_array_elements_text(%(live)s::json) AS payload) AS live
"""

# Why an append stored nothing (or, for an empty batch, the count it returns).
APPEND_STATE = """
    SELECT last_seq, lease_owner, lease_token,
           extract(epoch FROM lease_expires_at)::float8, extract(epoch FROM now())::float8,
           EXISTS (SELECT FROM session_events e
                   WHERE e.session_id = s.session_id AND e.id = %(first_id)s),
           (SELECT e.id FROM session_events e
            WHERE e.session_id = s.session_id AND e.seq = s.last_seq)
    FROM sessions s
    WHERE session_id = %(session_id)s
"""

# No row: unknown session. One row with a NULL payload: no events after the cursor.
READ = """
    SELECT e.type, e.payload::text
    FROM sessions s LEFT JOIN session_events e ON e.session_id = s.session_id AND e.seq > %s
    WHERE s.session_id = %s
    ORDER BY e.seq
"""

# One row per payload, in their order: NOTIFY delivers in the order it was called.
NOTIFY_ALL = "SELECT pg_notify(%s, payload) FROM json_array_elements_text(%s::json) AS payload"

# The lease owner is reported only while the lease is live.
_RECORD_COLUMNS = """
    session_id, created_at, updated_at, last_seq,
    CASE WHEN lease_expires_at > now() THEN lease_owner END, summary, lease_expires_at, owner
"""

GET = f"SELECT {_RECORD_COLUMNS} FROM sessions WHERE session_id = %s"

LIST_SESSIONS = f"SELECT {_RECORD_COLUMNS} FROM sessions ORDER BY updated_at DESC, session_id DESC"

# The foreign keys cascade to `session_events` and `session_inputs`; subscribers learn of it
# from the doorbell's 0.
# A prune's checks, with the session's row locked for the transaction (appends wait): the
# lease, the clock, and the id of the event at the marker's position.
PRUNE_STATE = """
    SELECT lease_owner, lease_token,
           extract(epoch FROM lease_expires_at)::float8, extract(epoch FROM now())::float8,
           (SELECT e.id FROM session_events e
            WHERE e.session_id = s.session_id AND e.seq = %(position)s)
    FROM sessions s WHERE session_id = %(session_id)s FOR UPDATE
"""

PRUNE = (
    "DELETE FROM session_events"
    " WHERE session_id = %(session_id)s AND seq BETWEEN 2 AND %(position)s"
)

PRUNE_MARKER = (
    "INSERT INTO session_events (session_id, seq, id, type, payload, lease_token)"
    " VALUES (%(session_id)s, %(position)s, %(id)s, %(type)s, %(payload)s, %(token)s)"
)

DELETE = (
    "WITH gone AS (DELETE FROM sessions WHERE session_id = %(id)s RETURNING 1)"
    f" SELECT pg_notify('{CHANNEL}', %(id)s || ':0') FROM gone"
)

# One row per session id: NULL when another runtime holds the lease; no row for an unknown
# session (the outer SELECT reads the snapshot from before the UPDATE).
ACQUIRE = """
    WITH taken AS (
        UPDATE sessions SET
            -- SET expressions all see the old row, so the CASE tests the previous owner.
            lease_token = CASE WHEN lease_owner = %(owner)s AND lease_expires_at > now()
                               THEN lease_token ELSE lease_token + 1 END,
            lease_owner = %(owner)s,
            lease_expires_at = now() + make_interval(secs => %(ttl)s)
        WHERE session_id = %(session_id)s
          AND (lease_owner IS NULL OR lease_owner = %(owner)s OR lease_expires_at <= now())
        RETURNING lease_token
    )
    SELECT (SELECT lease_token FROM taken) FROM sessions WHERE session_id = %(session_id)s
"""

# An engine's claim (see `Store.claim_lease`): the outer SELECT reads the row as it was
# before the update, so a refused claim still learns the token it was refused by.
CLAIM_FENCED = """
    WITH taken AS (
        UPDATE sessions SET
            lease_token = %(fence)s,
            lease_owner = %(owner)s,
            lease_expires_at = now() + make_interval(secs => %(ttl)s)
        WHERE session_id = %(session_id)s
          AND (lease_token < %(fence)s
               OR (lease_token = %(fence)s AND lease_owner IS NOT DISTINCT FROM %(owner)s))
        RETURNING lease_token
    )
    SELECT (SELECT lease_token FROM taken), lease_token FROM sessions
    WHERE session_id = %(session_id)s
"""

# An expired lease is not renewed: another runtime may have read the session as free.
RENEW = (
    "UPDATE sessions SET lease_expires_at = now() + make_interval(secs => %s)"
    " WHERE lease_owner = %s AND lease_expires_at > now() RETURNING session_id"
)

# The token stays: the next acquisition bumps it, fencing out this holder.
RELEASE = (
    "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL"
    " WHERE session_id = %s AND lease_owner = %s AND lease_token = %s"
)

ENQUEUE_INPUT = (
    "INSERT INTO session_inputs (session_id, message_id, body)"
    " VALUES (%s, %s, %s::json) ON CONFLICT DO NOTHING"
)

# No row: unknown session. One row of NULLs: nothing pending. Else the inputs, oldest first.
PENDING_INPUTS = """
    SELECT i.body::text, i.message_id
    FROM sessions s
    LEFT JOIN session_inputs i ON i.session_id = s.session_id AND i.claimed_seq IS NULL
    WHERE s.session_id = %(session_id)s
    ORDER BY i.id
"""

# By the partial index of pending inputs (`session_inputs_pending`).
SESSIONS_WITH_INPUTS = "SELECT DISTINCT session_id FROM session_inputs WHERE claimed_seq IS NULL"

# No row: unknown session. One row of NULL: nothing removed. Else the ids removed.
DISCARD_INPUTS = """
    WITH gone AS (
        DELETE FROM session_inputs
        WHERE session_id = %(s)s AND message_id = ANY(%(ids)s) AND claimed_seq IS NULL
        RETURNING message_id
    )
    SELECT g.message_id FROM sessions s LEFT JOIN gone g ON true WHERE s.session_id = %(s)s
"""

# An edit of the queue in place (`rewrite_inputs`), in one transaction: the session's row
# locked first (an append updates it, an enqueue's foreign key check shares it: both wait),
# then its pending inputs read, then each renumbered in its new order past every input so
# far, from the inputs' own sequence, or added. Rows are updated, never deleted and added
# again, so that an append that claims one (by message id) claims it wherever it moved.
LOCK_SESSION = "SELECT FROM sessions WHERE session_id = %s FOR UPDATE"

PENDING_IDS = (
    "SELECT message_id FROM session_inputs"
    " WHERE session_id = %s AND claimed_seq IS NULL ORDER BY id"
)

# `inputs`: `[message_id, body]` per input in its new order, as one JSON text, each body a
# JSON string (`->>` gives back its exact text: the server refuses `\u0000` in a text);
# `kept`: the message ids of those pending already.
REWRITE_INPUTS = """
    WITH edit AS (
        SELECT e->>0 AS message_id, (e->>1)::json AS body, n,
               e->>0 = ANY(%(kept)s) AS kept
        FROM json_array_elements(%(inputs)s::json) WITH ORDINALITY AS edit (e, n)
    ),
    drawn AS (SELECT nextval(pg_get_serial_sequence('session_inputs', 'id')) AS id FROM edit),
    numbered AS (
        SELECT edit.*, ranked.id
        FROM edit JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM drawn) AS ranked
            USING (n)
    ),
    moved AS (
        UPDATE session_inputs i SET id = numbered.id, body = numbered.body
        FROM numbered
        WHERE numbered.kept AND i.session_id = %(s)s AND i.message_id = numbered.message_id
    )
    INSERT INTO session_inputs (id, session_id, message_id, body)
    SELECT id, %(s)s, message_id, body FROM numbered WHERE NOT kept
"""

SAVE_SNAPSHOT = (
    "INSERT INTO session_snapshots (session_id, event_count, data)"
    " VALUES (%(s)s, %(n)s, %(d)s) ON CONFLICT (session_id)"
    " DO UPDATE SET event_count = EXCLUDED.event_count, data = EXCLUDED.data"
)

# No row: unknown session. A row of NULLs: no snapshot.
LOAD_SNAPSHOT = (
    "SELECT s.session_id, p.event_count, p.data::text FROM sessions s"
    " LEFT JOIN session_snapshots p USING (session_id) WHERE s.session_id = %(s)s"
)


def append_params(
    session_id: str, events: Sequence[Event], lease: Lease | None, durable: bool = True
) -> dict[str, Any]:
    """The parameters of `APPEND`; events are serialised here, before any lock is taken."""
    return {
        "session_id": session_id,
        "count": len(events),
        "summary": text(summarize(events)),
        "token": lease.token if lease else None,
        "owner": lease.owner if lease else None,
        "lease_session": lease.session_id if lease else None,
        "events": json_text(
            [[e.id, e.type, e.model_dump_json(), claimed_input(e)] for e in events]
        ),
        "first_id": events[0].id,
        "parent": events[0].parent_id,
        "sync": None if durable else "off",
        "live": None,
        "carried": None,
    }


def live_payload(session_id: str, event: Event, after: int) -> str | None:
    """The live channel's payload of an ephemeral event; None when it is too large to send."""
    payload = f"{json.dumps([session_id, after, event.type])}\n{event.model_dump_json()}"
    if len(payload.encode()) >= _NOTIFY_LIMIT:
        log.debug("ephemeral %s of %r too large to publish", event.type, session_id)
        return None
    return payload


json_text = json.JSONEncoder(ensure_ascii=False, check_circular=False, separators=(",", ":")).encode
"""JSON text for a `::json` parameter (a list of strings, no cycles; non-ASCII kept as is)."""


def text(value: str | None) -> str | None:
    """`value` fit for a `text` column, which cannot hold NUL: U+FFFD stands in for it."""
    return value.replace("\x00", "\ufffd") if value else value
