"""Where sessions live: the `Store` protocol, its backends, and `open_store` to pick one."""

from __future__ import annotations

import os
from pathlib import Path

from trimtab.store._base import (
    DEFAULT_TIMEOUT,
    CarriesLive,
    EventLog,
    Inbox,
    Lease,
    Leases,
    LiveFeed,
    SessionRecord,
    Snapshots,
    Store,
)
from trimtab.store.memory import MemoryStore
from trimtab.store.sqlite import SqliteStore

__all__ = [
    "DEFAULT_TIMEOUT",
    "CarriesLive",
    "EventLog",
    "Inbox",
    "Lease",
    "Leases",
    "LiveFeed",
    "MemoryStore",
    "SessionRecord",
    "Snapshots",
    "SqliteStore",
    "Store",
    "data_home",
    "open_store",
]

_SQLITE_PREFIX = "sqlite:///"
_POSTGRES_PREFIXES = ("postgresql://", "postgres://")
_ACCEPTED = (
    "None ($TRIMTAB_STORE, else SQLite at <home>/trimtab.db), 'memory', 'sqlite:///<path>'"
    " ('sqlite:////abs/path.db' for an absolute path), a file path, a postgresql:// URL,"
    " or a Store instance"
)


def open_store(
    spec: Store | str | os.PathLike[str] | None,
    *,
    home: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Store:
    """The store a spec names.

    Args:
        spec: `None` for `$TRIMTAB_STORE` if set (any string form below), else SQLite at
            `<home>/trimtab.db`; `"memory"` for a `MemoryStore`; `"sqlite:///<path>"`
            (SQLAlchemy style: the path after the third slash, so `sqlite:////var/lib/x.db`
            is absolute and `sqlite:///x.db` relative) or a plain path for a `SqliteStore`;
            a `postgresql://` or `postgres://` URL for a `PostgresStore` (needs the
            `trimtab[postgres]` extra); a `Store` instance is returned as is.
        home: trimtab's data directory; defaults to `$TRIMTAB_HOME`, else `~/.trimtab`.
            If missing, it is created with mode 0700 (and the database in it with 0600).
        timeout: Seconds within which every call of the store opened here completes or
            raises `StoreUnavailableError` (see `Store.timeout`); a `Store` instance keeps
            its own.

    Raises:
        ValueError: `spec` is none of the accepted forms.
        ImportError: a PostgreSQL URL, without the `trimtab[postgres]` extra installed.
    """
    if spec is None:
        if env_spec := os.environ.get("TRIMTAB_STORE"):
            return _open_url(env_spec, timeout)
        return SqliteStore(data_home(home) / "trimtab.db", timeout=timeout)
    if isinstance(spec, os.PathLike):
        return SqliteStore(spec, timeout=timeout)
    if isinstance(spec, str):
        return _open_url(spec, timeout)
    if isinstance(spec, Store):
        return spec
    raise ValueError(f"cannot open a store from {spec!r}: expected {_ACCEPTED}")


def _open_url(spec: str, timeout: float) -> Store:
    """The store a string names: `memory`, a `sqlite:///` or PostgreSQL URL, or a path."""
    if spec == "memory":
        return MemoryStore()
    if spec.startswith(_POSTGRES_PREFIXES):
        return _postgres(spec, timeout)
    if spec.startswith(_SQLITE_PREFIX) and len(spec) > len(_SQLITE_PREFIX):
        return SqliteStore(spec.removeprefix(_SQLITE_PREFIX), timeout=timeout)
    # Any other URL (or a bare "sqlite://") is a mistake, not a file name with a colon.
    if not spec or "://" in spec:
        raise ValueError(f"cannot open a store from {spec!r}: expected {_ACCEPTED}")
    return SqliteStore(spec, timeout=timeout)


def _postgres(dsn: str, timeout: float) -> Store:
    """A `PostgresStore`; imported here so that psycopg stays an optional dependency."""
    try:
        from trimtab.store.postgres import PostgresStore
    except ImportError as error:
        raise ImportError(
            f"a PostgreSQL store needs psycopg ({error}): pip install 'trimtab[postgres]'"
        ) from error
    return PostgresStore(dsn, timeout=timeout)


def data_home(home: str | os.PathLike[str] | None = None) -> Path:
    """trimtab's data directory: `home`, else `$TRIMTAB_HOME`, else `~/.trimtab`."""
    if home is None:
        home = os.environ.get("TRIMTAB_HOME") or "~/.trimtab"
    return Path(home).expanduser()
