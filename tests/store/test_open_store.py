"""`open_store`: every accepted spec, and a clear error for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from trimtab import Client
from trimtab.store import MemoryStore, SqliteStore, open_store
from trimtab.testing import ScriptedModel


async def test_default_is_sqlite_under_trimtab_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIMTAB_HOME", str(tmp_path / "home"))
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


@pytest.mark.parametrize("spec", ["postgresql://u@h/db", "redis://x", "sqlite://", "", 42])
def test_bad_specs_are_clear_errors(spec: object) -> None:
    with pytest.raises(ValueError, match="store"):
        open_store(spec)  # type: ignore[arg-type]
