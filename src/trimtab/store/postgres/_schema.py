"""The store's tables, as versioned migrations applied on first use (docs: scale-out.md 4.1).

Events are stored as their JSON (`event.model_dump_json()`, read by `event_from_json`) in a
`json` column, not `jsonb`: `jsonb` rewrites the document (it reorders keys, normalises
numbers, refuses `\\u0000`), and the log must give back exactly what was appended; `json`
still allows `payload->'data'` queries.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

__all__ = ["MIGRATIONS", "migrate"]

log = logging.getLogger(__name__)

_MIGRATION_LOCK = 0x7472696D746162
"""`pg_advisory_xact_lock` key ("trimtab" in ASCII): one migrating runtime at a time."""

# Versioned schema: version n is MIGRATIONS[n - 1]. Append a script; never edit one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
        session_id        text COLLATE "C" PRIMARY KEY,  -- byte order, like SQLite and memory
        last_seq          bigint      NOT NULL DEFAULT 0,  -- the row lock serialises appends
        lease_owner       text,
        lease_token       bigint      NOT NULL DEFAULT 0,  -- fencing token, +1 per acquisition
        lease_expires_at  timestamptz,
        summary           text,
        created_at        timestamptz NOT NULL DEFAULT now(),
        updated_at        timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX sessions_by_update ON sessions (updated_at);
    CREATE INDEX sessions_by_lease_owner ON sessions (lease_owner) WHERE lease_owner IS NOT NULL;

    CREATE TABLE session_events (
        session_id   text COLLATE "C" NOT NULL REFERENCES sessions ON DELETE CASCADE,
        seq          bigint NOT NULL,
        id           text   NOT NULL,
        type         text   NOT NULL,
        payload      json   NOT NULL,
        idem_key     text,               -- client message id, tool call id: dedups retries
        lease_token  bigint,             -- the lease that wrote it (audit)
        created_at   timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (session_id, seq)
    );
    CREATE UNIQUE INDEX session_events_idem_key
        ON session_events (session_id, idem_key) WHERE idem_key IS NOT NULL;

    CREATE TABLE session_inputs (
        id          bigserial PRIMARY KEY,
        session_id  text COLLATE "C" NOT NULL REFERENCES sessions ON DELETE CASCADE,
        message_id  text NOT NULL,
        body        json NOT NULL,       -- {"prompt": ...}: json, as text refuses NUL
        created_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX session_inputs_by_session ON session_inputs (session_id, id);
    """,
    # 2: derived state, so that a session opens without replaying its whole log.
    """
    CREATE TABLE session_snapshots (
        session_id   text COLLATE "C" PRIMARY KEY REFERENCES sessions ON DELETE CASCADE,
        event_count  bigint NOT NULL,
        data         json NOT NULL
    );
    """,
    # 3: appends idempotent by event id; inputs stay until the message they become is stored.
    """
    CREATE UNIQUE INDEX session_events_by_id ON session_events (session_id, id);
    ALTER TABLE session_events DROP COLUMN idem_key;
    ALTER TABLE session_inputs ADD COLUMN claimed_seq bigint;
    CREATE UNIQUE INDEX session_inputs_by_message ON session_inputs (session_id, message_id);
    CREATE INDEX session_inputs_pending ON session_inputs (session_id, id)
        WHERE claimed_seq IS NULL;
    """,
    # 4: who each session belongs to (its `session.start`'s owner), for a server's listings.
    """
    ALTER TABLE sessions ADD COLUMN owner text;
    """,
)


async def migrate(conn: psycopg.AsyncConnection[Any]) -> None:
    """Apply the missing schema versions; refuse a database written by a newer trimtab."""
    async with conn.transaction():
        # Transaction-scoped: released at commit, and by the server if this process dies.
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS trimtab_schema ("
            " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cursor = await conn.execute("SELECT coalesce(max(version), 0) FROM trimtab_schema")
        row = await cursor.fetchone()
        version = int(row[0]) if row else 0
        if version > len(MIGRATIONS):
            raise RuntimeError(
                f"the database has schema version {version}, newer than this trimtab's"
                f" {len(MIGRATIONS)}: upgrade trimtab"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            log.info("migrating the trimtab schema to version %d", number)
            await conn.execute(script)  # no parameters: sent as one multi-statement script
            await conn.execute("INSERT INTO trimtab_schema (version) VALUES (%s)", (number,))
