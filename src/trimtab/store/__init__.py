"""Where sessions live: the `Store` protocol, its backends, and `open_store` to pick one."""

from __future__ import annotations

import os
from pathlib import Path

from trimtab.store._base import Lease, SessionRecord, Store
from trimtab.store.memory import MemoryStore
from trimtab.store.sqlite import SqliteStore

__all__ = ["Lease", "MemoryStore", "SessionRecord", "SqliteStore", "Store", "open_store"]

_SQLITE_PREFIX = "sqlite:///"
_ACCEPTED = (
    "None (SQLite at <home>/trimtab.db), 'memory', 'sqlite:///<path>'"
    " ('sqlite:////abs/path.db' for an absolute path), a file path, or a Store instance"
)


def open_store(
    spec: Store | str | os.PathLike[str] | None, *, home: str | os.PathLike[str] | None = None
) -> Store:
    """The store a spec names.

    Args:
        spec: `None` for SQLite at `<home>/trimtab.db`; `"memory"` for a `MemoryStore`;
            `"sqlite:///<path>"` (SQLAlchemy style: the path after the third slash, so
            `sqlite:////var/lib/x.db` is absolute and `sqlite:///x.db` relative) or a plain
            path for a `SqliteStore`; a `Store` instance is returned as is.
        home: trimtab's data directory; defaults to `$TRIMTAB_HOME`, else `~/.trimtab`.

    Raises:
        ValueError: `spec` is none of the accepted forms (PostgreSQL URLs included, for now).
    """
    if spec is None:
        return SqliteStore(_home(home) / "trimtab.db")
    if isinstance(spec, os.PathLike):
        return SqliteStore(spec)
    if isinstance(spec, str):
        return _open_url(spec)
    if isinstance(spec, Store):
        return spec
    raise ValueError(f"cannot open a store from {spec!r}: expected {_ACCEPTED}")


def _open_url(spec: str) -> Store:
    """The store a string names: `memory`, a `sqlite:///` URL or a path."""
    if spec == "memory":
        return MemoryStore()
    if spec.startswith(("postgresql://", "postgres://")):
        raise ValueError("PostgreSQL stores are not available yet; use SQLite or 'memory'")
    if spec.startswith(_SQLITE_PREFIX) and len(spec) > len(_SQLITE_PREFIX):
        return SqliteStore(spec.removeprefix(_SQLITE_PREFIX))
    # Any other URL (or a bare "sqlite://") is a mistake, not a file name with a colon.
    if not spec or "://" in spec:
        raise ValueError(f"cannot open a store from {spec!r}: expected {_ACCEPTED}")
    return SqliteStore(spec)


def _home(home: str | os.PathLike[str] | None) -> Path:
    """trimtab's data directory: `home`, else `$TRIMTAB_HOME`, else `~/.trimtab`."""
    if home is None:
        home = os.environ.get("TRIMTAB_HOME") or "~/.trimtab"
    return Path(home).expanduser()
