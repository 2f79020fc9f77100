"""The PostgreSQL store (`PostgresStore`): one database shared by many runtimes.

By role: `store` (the `Store` methods), `_statements` (the SQL and its parameters),
`_schema` (the tables, migrated on first use), `_calls` (connections, and every call bounded
by the store's timeout), `_live` (ephemeral events on their way, in order) and `_listener`
(the LISTEN connection that rings subscribers).
"""

from trimtab.store.postgres._listener import SUBSCRIBE_POLL
from trimtab.store.postgres._statements import CHANNEL, LIVE_CHANNEL
from trimtab.store.postgres.store import PostgresStore

__all__ = ["CHANNEL", "LIVE_CHANNEL", "SUBSCRIBE_POLL", "PostgresStore"]
