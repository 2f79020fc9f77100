"""The PostgreSQL test database: one fresh schema per test, from `TRIMTAB_TEST_PG_DSN`.

`.ci/start-postgres.sh` starts a throwaway server and sets the variable. Without it the
PostgreSQL cases skip, except in CI (`CI` set), where a missing server is a failure: the
suite must never pass there without having run against PostgreSQL.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

PG_DSN_VARIABLE = "TRIMTAB_TEST_PG_DSN"


def in_ci() -> bool:
    """Whether the tests run in CI, where nothing may be skipped for want of a server."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def require_env(name: str) -> str:
    """The variable's value; skips the test without it, or fails it in CI."""
    value = os.environ.get(name)
    if not value:
        message = f"{name} is not set (source .ci/start-postgres.sh to start a server)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return value


def require_psycopg() -> None:
    """Skip without the `trimtab[postgres]` extra, except in CI (the import then fails)."""
    if not in_ci():
        pytest.importorskip("psycopg", reason="needs the trimtab[postgres] extra")


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A DSN whose `search_path` is a new, empty schema, dropped after the test.

    Synchronous, so that async fixtures can get it with `request.getfixturevalue`.
    """
    server = require_env(PG_DSN_VARIABLE)
    require_psycopg()
    import psycopg

    schema = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        if server.startswith(("postgresql://", "postgres://")):  # stay a URL, for open_store
            yield f"{server}{'&' if '?' in server else '?'}options=-csearch_path%3D{schema}"
        else:
            yield psycopg.conninfo.make_conninfo(server, options=f"-csearch_path={schema}")
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
