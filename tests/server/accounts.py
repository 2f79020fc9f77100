"""A second account of this machine, for tests of a boundary between users (spec S10-S17).

Created with `useradd` when the tests run as root, and removed afterwards; the tests that
need one skip otherwise. What it runs is plain `python3` with the standard library only:
an attacker on the same machine has no trimtab, only a socket.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CLIENT = r"""
import json, socket, sys

port, token, requests = int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
sock = socket.create_connection(("127.0.0.1", port), timeout=20)
stream = sock.makefile("rb")


def call(number, method, params):
    body = json.dumps({"jsonrpc": "2.0", "id": number, "method": method, "params": params})
    sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body.encode()) + body.encode())
    while True:
        length = None
        while line := stream.readline().strip():
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is None:
            return None  # the server closed the connection
        frame = json.loads(stream.read(length))
        if frame.get("id") == number:
            return frame


answers = [call(0, "connect", {"token": token})] if token is not None else []
answers += [call(n, method, params) for n, (method, params) in enumerate(requests, 1)]
print(json.dumps(answers))
"""
"""A JSON-RPC client in the standard library: connects, sends the requests, prints the
answers as one JSON list."""


@dataclass(frozen=True)
class Account:
    """Another user of this machine."""

    name: str
    uid: int
    gid: int
    python: str
    """A Python it can run (the standard library's only)."""

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """`argv` as this user, from `/`, with a bare environment."""
        return subprocess.run(
            argv,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "HOME": "/"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
        )

    def rpc(
        self, port: int, requests: list[tuple[str, dict[str, Any]]], token: str | None = None
    ) -> list[dict[str, Any] | None]:
        """The server's answers to `requests`, sent by this user (after `connect` with
        `token`, when given)."""
        given, asked = json.dumps(token), json.dumps(requests)
        done = self.run(self.python, "-I", "-c", CLIENT, str(port), given, asked)
        assert done.returncode == 0, done.stderr
        answers: list[dict[str, Any] | None] = json.loads(done.stdout)
        return answers


@pytest.fixture
def other_account() -> Iterator[Account]:
    """A user made for this test (needs root, else the test skips)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to create a second account with useradd")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if useradd is None or userdel is None or python is None:
        pytest.skip("needs useradd, userdel and a system python3")
    name = f"tt-{secrets.token_hex(4)}"
    shell = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
    subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", shell, name],
        check=True,
        capture_output=True,
    )
    try:
        info = subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True)
        group = subprocess.run(["id", "-g", name], capture_output=True, text=True, check=True)
        account = Account(name, int(info.stdout), int(group.stdout), python)
        if account.run(python, "-I", "-c", "pass").returncode != 0:
            pytest.skip(f"the second account cannot run {python}")
        yield account
    finally:
        subprocess.run([userdel, name], capture_output=True)


@pytest.fixture
def shared_directory(tmp_path: Path) -> Iterator[Path]:
    """A directory every account may enter (pytest's own are the test user's alone)."""
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="trimtab-shared-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
