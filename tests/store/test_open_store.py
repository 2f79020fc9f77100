"""`open_store`: every accepted spec, and a clear error for the rest."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.conftest import require_psycopg
from trimtab import Client
from trimtab.store import MemoryStore, SqliteStore, open_store
from trimtab.testing import ScriptedModel


async def test_default_is_sqlite_under_trimtab_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIMTAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRIMTAB_STORE", raising=False)
    async with Client() as client:
        session = await client.create_session(provider=ScriptedModel(["hi"]))
        await session.send_and_wait("hello")
    assert (tmp_path / "home" / "trimtab.db").exists()
    async with Client() as client:
        assert [r.session_id for r in await client.list_sessions()] == [session.session_id]


@pytest.mark.parametrize("spec", ["sqlite:///rel/x.db", "rel/x.db", Path("rel/x.db")])
async def test_sqlite_forms(
    tmp_path: Path, spec: str | Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store(spec)
    assert isinstance(store, SqliteStore)
    await store.create("s")
    await store.close()
    assert (tmp_path / "rel" / "x.db").exists()


async def test_memory_and_instances() -> None:
    assert isinstance(open_store("memory"), MemoryStore)
    store = MemoryStore()
    assert open_store(store) is store


@pytest.mark.parametrize("spec", ["postgresql://u@h/db", "postgres://h:5433/db?sslmode=disable"])
def test_postgresql_urls_open_a_postgres_store_without_connecting(spec: str) -> None:
    require_psycopg()
    from trimtab.store.postgres import PostgresStore

    assert isinstance(open_store(spec), PostgresStore)


def test_postgresql_url_without_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.startswith("trimtab.store.postgres")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an absent package looks like

    with pytest.raises(ImportError, match=re.escape("pip install 'trimtab[postgres]'")):
        open_store("postgresql://u@h/db")


@pytest.mark.parametrize(
    ("variable", "expected"), [("memory", MemoryStore), ("sqlite:///env.db", SqliteStore)]
)
async def test_trimtab_store_names_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, expected: type
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRIMTAB_STORE", variable)

    store = open_store(None)

    assert isinstance(store, expected)
    assert isinstance(open_store("memory"), MemoryStore)  # an explicit spec wins
    await store.close()


def test_bad_trimtab_store_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMTAB_STORE", "redis://x")

    with pytest.raises(ValueError, match="store"):
        open_store(None)


@pytest.mark.parametrize("spec", ["redis://x", "sqlite://", "", 42])
def test_bad_specs_are_clear_errors(spec: object) -> None:
    with pytest.raises(ValueError, match="store"):
        open_store(spec)  # type: ignore[arg-type]


async def test_a_version_1_sqlite_file_is_migrated(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    store = SqliteStore(path)
    await store.create("s")
    await store.close()
    db = sqlite3.connect(path)
    # Back to version 1: no snapshots (2), no idempotent appends nor claimed inputs (3), no
    # owners (5).
    db.executescript(
        "DROP TABLE snapshots; DROP INDEX events_by_id; DROP INDEX inputs_by_message;"
        " DROP INDEX inputs_pending; ALTER TABLE inputs DROP COLUMN claimed_seq;"
        " ALTER TABLE sessions DROP COLUMN owner; PRAGMA user_version = 1;"
    )
    db.close()
    store = SqliteStore(path)
    await store.save_snapshot("s", 0, "{}")
    assert await store.load_snapshot("s") == (0, "{}")
    await store.enqueue_input("s", "hi", "m1")
    await store.enqueue_input("s", "hi", "m1")
    assert await store.pending_inputs("s") == [("hi", "m1")]
    assert await store.sessions_with_inputs() == {"s"}
    assert (await store.get("s")).owner is None  # a session from before owners: nobody's
    await store.close()
