"""Files trimtab creates are private (issue 14, item 9; spec S5): `$TRIMTAB_HOME` 0700, the
SQLite database and its -wal and -shm files 0600, whatever the umask; what exists already
keeps its mode.

Each case runs in a subprocess with a umask of 0, which would otherwise make everything
world-readable (and writable).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.store.processes import SRC

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")

# Opens the store the way `Client()` does with no store named, appends (so that the -wal and
# -shm files exist), and prints the mode of every path under the root while the store is open.
OPEN_AND_LIST = """
import asyncio, json, os, sys
from pathlib import Path
from trimtab.events import UserMessageData, UserMessageEvent
from trimtab.store import open_store

async def main(root, home):
    os.umask(0)
    store = open_store(None, home=home)
    await store.create("s")
    await store.append("s", [UserMessageEvent(data=UserMessageData(content="secret"))], lease=None)
    modes = {str(p.relative_to(root)): oct(p.stat().st_mode & 0o777)
             for p in sorted(Path(root).rglob("*"))}
    await store.close()
    print(json.dumps(modes))

asyncio.run(main(*sys.argv[1:]))
"""


def modes_after_opening(root: Path, home: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("TRIMTAB_STORE", None)
    done = subprocess.run(
        [sys.executable, "-c", OPEN_AND_LIST, str(root), str(home)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modes: dict[str, str] = json.loads(done.stdout)
    return modes


def test_s2_a_new_home_and_database_are_private_whatever_the_umask(tmp_path: Path) -> None:
    modes = modes_after_opening(tmp_path, tmp_path / "users" / "me" / ".trimtab")

    assert modes == {
        "users": "0o700",
        "users/me": "0o700",
        "users/me/.trimtab": "0o700",
        "users/me/.trimtab/trimtab.db": "0o600",
        "users/me/.trimtab/trimtab.db-wal": "0o600",
        "users/me/.trimtab/trimtab.db-shm": "0o600",
    }


def test_s2_existing_directories_and_database_keep_their_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    (shared / "trimtab.db").touch()
    (shared / "trimtab.db").chmod(0o640)

    modes = modes_after_opening(tmp_path, shared)

    # The -wal and -shm files follow the database's mode, as SQLite makes them.
    assert modes == {
        "shared": "0o755",
        "shared/trimtab.db": "0o640",
        "shared/trimtab.db-wal": "0o640",
        "shared/trimtab.db-shm": "0o640",
    }
    assert stat.S_IMODE((shared / "trimtab.db").stat().st_mode) == 0o640
