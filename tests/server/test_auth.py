"""Every socket asks for a token, and a client sees its own sessions (issue 34; spec S10,
S16), driven as an attacker would: another account of the machine, a client without the
token, a client with another client's session id.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from copilot import CopilotClient, RuntimeConnection
from copilot.session import PermissionHandler

from tests.server.accounts import Account
from tests.server.conftest import (
    ServerProcess,
    StartServer,
    assistant,
    conversation,
    provider,
    user,
)
from tests.server.raw import RawClient
from trimtab import Client
from trimtab.protocol.errors import AUTHENTICATION_FAILED, SESSION_NOT_FOUND
from trimtab.server import ServerOptions
from trimtab.server.command import BOUNDARY
from trimtab.testing import ReplayServer


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m trimtab.server ARGS`, expected to refuse its flags."""
    return subprocess.run(
        [sys.executable, "-m", "trimtab.server", "--store", "memory", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), **(env or {})},
    )


# --- S10: a token on every socket ------------------------------------------------------------


async def test_s10_a_server_given_no_token_makes_one_only_its_user_can_read(
    other_account: Account, shared_directory: Path
) -> None:
    home = shared_directory / "home"
    server = ServerProcess(
        shared_directory / "t.db", env={"TRIMTAB_HOME": str(home)}, give_token=False
    )
    try:
        token_file = server.token_file
        assert token_file == home / "serve" / f"{server.port}.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        assert len(server.token or "") >= 40  # secrets.token_urlsafe(32)
        # Where it is is said on stderr; the token itself nowhere.
        log = server.log.read_text()
        assert f"connection token in {token_file}" in log and str(server.token) not in log

        # Another account of the machine reads neither the file nor the server's environment,
        # and is refused without the token, whatever it sends instead.
        assert other_account.run("cat", str(token_file)).returncode != 0
        assert other_account.run("cat", f"/proc/{server.process.pid}/environ").returncode != 0
        answers = other_account.rpc(server.port, [("session.list", {})])
        assert answers[0] is not None and answers[0]["error"]["code"] == AUTHENTICATION_FAILED
        for guess in ("", "x" * 43, str(server.token)[:-1]):
            [refused, listing] = other_account.rpc(server.port, [("session.list", {})], guess)
            assert refused is not None and refused["error"]["code"] == AUTHENTICATION_FAILED
            assert listing is not None and listing["error"]["code"] == AUTHENTICATION_FAILED

        # The user who started it connects with what the file holds.
        client = CopilotClient(connection=server.connection())
        await client.start()
        assert await client.list_sessions() == []
        await client.force_stop()
    finally:
        assert server.stop() == 0, server.log.read_text()
    assert not token_file.exists()  # removed on a clean stop


def test_s10_a_server_does_not_write_its_token_where_others_may_enter(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "serve").mkdir(parents=True)
    (home / "serve").chmod(0o777)
    done = subprocess.run(
        [sys.executable, "-m", "trimtab.server", "--store", "memory", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), "TRIMTAB_HOME": str(home)},
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: cannot write the connection token: "), done.stderr
    assert "mode 777" in done.stderr
    assert list((home / "serve").iterdir()) == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--no-auth", "--host", "0.0.0.0"], "--no-auth is for a TCP server on a loopback"),
        (["--no-auth", "--token", "t"], "--no-auth is for a TCP server on a loopback"),
        (["--no-auth", "--stdio"], "--no-auth is for a TCP server on a loopback"),
        (["--token", "t", "--tokens-file", "f"], "not both"),
        (["--admin", "ops"], "--admin names a token of --tokens-file"),
        (["--allow-mcp-commands", "--mcp-command", "sh"], "give one of them"),
        (["--api-key-file", "k"], "--api-key-file is the key of --provider"),
    ],
)
def test_s10_flags_that_would_open_more_than_they_say_are_refused(
    args: list[str], error: str
) -> None:
    done = _serve(*args)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert error in done.stderr.splitlines()[0]


def test_s10_no_auth_on_loopback_lets_a_client_in_without_a_token(
    start_server: StartServer,
) -> None:
    server = start_server(None, "--no-auth")
    assert server.token is None
    assert server.raw().result("session.list") == {"sessions": []}


def test_s10_serve_help_states_the_boundary() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trimtab.server", "--help"], capture_output=True, text=True
    )
    text = "".join(done.stdout.split())  # as wrapped by click, which may cut at a hyphen
    assert "".join(BOUNDARY.split()) in text
    assert BOUNDARY.count(". ") == 1 and BOUNDARY.endswith(".")  # two sentences
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert "".join(BOUNDARY.split()) in "".join(readme.replace("`", "").split())
    no_auth = " ".join((ServerOptions.model_fields["no_auth"].description or "").split())
    assert "every account of this machine can then drive every session" in no_auth
    assert "".join(no_auth.split()) in text


# --- S16: sessions belong to the token that created them --------------------------------------

ALICE, BOB, OPS = (secrets.token_urlsafe(24) for _ in range(3))


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(f'alice = "{ALICE}"\nbob = "{BOB}"\nops = "{OPS}"\n')
    path.chmod(0o600)
    return path


@pytest.fixture
async def clients() -> AsyncIterator[Callable[[ServerProcess, str], Any]]:
    """Official clients of a server, each with the token it is given; stopped after."""
    started: list[CopilotClient] = []

    async def connect(server: ServerProcess, token: str) -> CopilotClient:
        connection = RuntimeConnection.for_uri(f"127.0.0.1:{server.port}", connection_token=token)
        client = CopilotClient(connection=connection)
        await client.start()
        started.append(client)
        return client

    yield connect
    for client in started:
        await client.force_stop()


async def _ids(client: CopilotClient) -> set[str]:
    return {session.session_id for session in await client.list_sessions()}


async def test_s16_a_client_sees_resumes_and_deletes_only_its_own_sessions(
    start_server: StartServer, tokens_file: Path, tmp_path: Path, clients: Any
) -> None:
    store = tmp_path / "trimtab.db"
    hello = conversation(user("Say hello"), assistant("Hello!"))
    async with ReplayServer([hello]) as model:
        # A session from before owners (in-process): nobody's, so only an admin's.
        async with Client(store=store) as runtime:
            old = await runtime.create_session(session_id="legacy", provider=provider(model))
            await old.disconnect()
        args = ("--tokens-file", str(tokens_file), "--admin", "ops")
        server = start_server(store, *args)
        alice, bob, ops = [await clients(server, t) for t in (ALICE, BOB, OPS)]
        heard: list[tuple[str, str]] = []
        bob.on_lifecycle(lambda event: heard.append((event.type, event.session_id)))
        options: dict[str, Any] = {
            "provider": provider(model),
            "on_permission_request": PermissionHandler.approve_all,
        }
        mine = await alice.create_session(session_id="alice-1", **options)
        assert await mine.send_and_wait("Say hello", timeout=30) is not None
        await bob.create_session(session_id="bob-1", **options)

        assert await _ids(alice) == {"alice-1"}
        assert await _ids(bob) == {"bob-1"}
        assert await _ids(ops) == {"alice-1", "bob-1", "legacy"}
        assert await bob.get_last_session_id() == "bob-1"
        assert await bob.get_session_metadata("alice-1") is None
        assert (await alice.get_session_metadata("alice-1")) is not None
        # Lifecycle notifications come in order: once bob heard of his own session, he
        # would have heard of alice's before it.
        for _ in range(100):
            if ("session.created", "bob-1") in heard:
                break
            await asyncio.sleep(0.05)
        assert ("session.created", "bob-1") in heard
        assert not [entry for entry in heard if entry[1] != "bob-1"]

        # Another's session is not found, exactly as one that never existed.
        for session_id in ("alice-1", "legacy", "never-was"):
            with pytest.raises(Exception, match=f"Session not found: {session_id} "):
                await bob.resume_session(session_id, **options)
            with pytest.raises(RuntimeError, match=f"no session with id '{session_id}'"):
                await bob.delete_session(session_id)
    assert await _ids(alice) == {"alice-1"}  # bob's deletes removed nothing
    # The owner is the log's (`session.start`), and the store lists it.
    records = {r.session_id: r.owner for r in await Client(store=store).list_sessions()}
    assert records == {"alice-1": "alice", "bob-1": "bob", "legacy": None}


async def test_s16_an_admin_token_sees_all_and_ownership_survives_a_restart(
    start_server: StartServer, tokens_file: Path, tmp_path: Path, clients: Any
) -> None:
    store = tmp_path / "trimtab.db"
    args = ("--tokens-file", str(tokens_file), "--admin", "ops")
    async with ReplayServer() as model:
        options: dict[str, Any] = {
            "provider": provider(model),
            "on_permission_request": PermissionHandler.approve_all,
        }
        first = start_server(store, *args)
        alice = await clients(first, ALICE)
        session = await alice.create_session(session_id="kept", **options)
        await session.disconnect()
        assert first.stop() == 0

        again = start_server(store, *args)
        bob, ops, alice = [await clients(again, t) for t in (BOB, OPS, ALICE)]
        assert await _ids(bob) == set()
        with pytest.raises(Exception, match="Session not found: kept "):
            await bob.resume_session("kept", **options)
        assert await _ids(ops) == {"kept"}
        resumed = await ops.resume_session("kept", **options)  # an admin may open it
        await resumed.disconnect()
        assert (await alice.resume_session("kept", **options)).session_id == "kept"


async def test_s16_a_fork_of_anothers_session_is_not_found(
    start_server: StartServer, tokens_file: Path
) -> None:
    server = start_server(None, "--tokens-file", str(tokens_file))
    async with ReplayServer() as model:
        alice = RawClient(server.port, token=ALICE)
        bob = RawClient(server.port, token=BOB)
        alice.result("session.create", {"sessionId": "a", "provider": provider(model)})
        theirs = bob.request("sessions.fork", {"sessionId": "a"})
        nobodys = bob.request("sessions.fork", {"sessionId": "zz"})
    assert theirs["error"]["code"] == nobodys["error"]["code"] == SESSION_NOT_FOUND
    assert theirs["error"]["message"].replace(" a ", " zz ") == nobodys["error"]["message"]
    # One connection is one client: it cannot take a second token's sessions on.
    assert bob.request("connect", {"token": ALICE})["error"]["code"] == AUTHENTICATION_FAILED
    assert bob.result("session.list") == {"sessions": []}


@pytest.mark.parametrize(
    ("content", "mode", "error"),
    [
        (f'alice = "{ALICE}"\n', 0o644, "may be read by other accounts (mode 644)"),
        ('alice = "x"\nbob = "x"\n', 0o600, "'alice' and 'bob' have the same token"),
        ('alice = ""\n', 0o600, "must be a non-empty string"),
        ("alice = 3\n", 0o600, "must be a non-empty string"),
        ("not toml", 0o600, "is not TOML"),
        ("", 0o600, "names no token"),
    ],
)
def test_s16_a_tokens_file_that_cannot_be_trusted_stops_the_server(
    tmp_path: Path, content: str, mode: int, error: str
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(content)
    path.chmod(mode)
    done = _serve("--tokens-file", str(path))
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert error in done.stderr.splitlines()[0]
    assert ALICE not in done.stderr


def test_s16_an_admin_must_be_a_name_of_the_tokens_file(tokens_file: Path) -> None:
    done = _serve("--tokens-file", str(tokens_file), "--admin", "root")
    assert done.returncode == 2
    assert "--admin 'root' is not a name of" in done.stderr
