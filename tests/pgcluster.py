"""A private, throwaway PostgreSQL cluster, for tests that stop or freeze the server.

Other test runs share the cluster of `TRIMTAB_TEST_PG_DSN`, so a test that freezes a server
must never freeze that one: it starts its own (initdb and pg_ctl into a temporary directory,
as `.ci/start-postgres.sh` does, as the `postgres` OS user when run as root). Without the
PostgreSQL binaries it skips (`tests/requirements.py`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.requirements import require_psycopg, unmet

__all__ = ["PrivateCluster", "private_cluster"]


class PrivateCluster:
    """A running cluster of one test module's own: its DSN, and ways to freeze or crash it."""

    def __init__(self, root: Path, port: int, start: list[str]) -> None:
        self.data = root / "data"
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        self._start = start

    def crash(self) -> None:
        """Kill every server process at once (SIGKILL), as a power cut does to what was not
        written yet (frozen ones included), then start the server again: it recovers from
        the WAL it wrote."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # Gone, not only killed: a new server refuses shared memory still attached.
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in pids):
            if time.monotonic() > deadline:
                raise TimeoutError("the killed server processes did not exit")
            time.sleep(0.05)
        subprocess.run(self._start, check=True, capture_output=True)

    def pids(self) -> list[int]:
        """The postmaster, then every server process it started."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    # The parent pid is the second field after the command's ")".
                    if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                        children.append(int(entry.name))
        return [postmaster, *children]

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Every server process stopped (SIGSTOP) for the block: connections stay open and
        accepted, but nothing answers, as on a frozen or overloaded host."""
        pids = self.pids()  # the postmaster first, so that it starts no process meanwhile
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def private_cluster(*settings: str) -> Iterator[PrivateCluster]:
    """Start a cluster in a temporary directory, with the server `settings` given
    (`name=value`); stop it and delete it afterwards."""
    require_psycopg()
    binaries = _binaries()
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            unmet("running as root needs a 'postgres' OS user to run PostgreSQL")
        as_user = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="trimtab-pg-"))
    if as_user:
        shutil.chown(root, "postgres")
    pg_ctl = [*as_user, str(binaries / "pg_ctl"), "-D", str(root / "data")]
    try:
        subprocess.run(
            [*as_user, str(binaries / "initdb"), "-D", str(root / "data"), "-U", "postgres"]
            + ["--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
        )
        port = _free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
        options += "".join(f" -c {setting}" for setting in settings)
        start = [*pg_ctl, "-l", str(root / "server.log"), "-w", "-t", "60", "-o", options, "start"]
        subprocess.run(start, check=True, capture_output=True)
        cluster = PrivateCluster(root, port, start)
        try:
            yield cluster
        finally:
            with contextlib.suppress(OSError, ValueError, IndexError):
                for pid in cluster.pids():  # a test that failed half-way may leave it frozen
                    os.kill(pid, signal.SIGCONT)
            subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _binaries() -> Path:
    """The directory of initdb and pg_ctl: next to `TRIMTAB_TEST_PG_CTL`, Debian's newest
    `/usr/lib/postgresql/*/bin`, or on the PATH."""
    candidates = []
    if pg_ctl := os.environ.get("TRIMTAB_TEST_PG_CTL"):
        candidates.append(Path(pg_ctl).parent)
    debian = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(debian, key=_version, reverse=True)
    if initdb := shutil.which("initdb"):
        candidates.append(Path(initdb).parent)
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    unmet("no PostgreSQL binaries (initdb, pg_ctl) to start a private cluster")


def _version(binaries: Path) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", binaries.parent.name)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
