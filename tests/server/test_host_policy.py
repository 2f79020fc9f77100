"""What a server's clients may make its host do (issue 34; spec S11-S15), driven as an
attacker would through the official client: commands named in `mcpServers`, files attached
by path, URLs of their choosing. Over a socket each is refused unless the operator allowed
it, with a typed error naming the flag, and nothing is stored; over stdio they work as
before.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from copilot import CopilotClient, RuntimeConnection
from copilot._jsonrpc import JsonRpcError
from copilot.session import PermissionHandler

from tests.mcp.conftest import DEMO
from tests.server.accounts import Account
from tests.server.conftest import (
    ServerProcess,
    StartServer,
    assistant,
    call,
    conversation,
    provider,
    tool,
    user,
)
from trimtab import PolicyRefusedError
from trimtab.protocol.errors import POLICY_REFUSED
from trimtab.server import ServerOptions
from trimtab.server.policy import HostPolicy
from trimtab.testing import ReplayServer

pytest.importorskip("mcp", reason="the MCP servers of these tests need the mcp extra")

ADD = conversation(
    user("Add"),
    assistant(None, call("c1", "demo__add", a=40, b=2)),
    tool("c1", "42"),
    assistant("It is 42."),
)


def demo(command: str = sys.executable, *args: str, **config: Any) -> dict[str, Any]:
    """A local MCP server config: the demo server, run by `command` unless `args` say."""
    return {"type": "local", "command": command, "args": list(args or [str(DEMO)]), **config}


OpenClient = Callable[..., Awaitable[CopilotClient]]


@pytest.fixture
async def official(start_server: StartServer) -> AsyncIterator[OpenClient]:
    """`official(*server_args)`: an official client of a new TCP server started with them,
    or `official(connection=...)` for a client of another transport."""
    started: list[CopilotClient] = []

    async def open_client(
        *args: str, connection: RuntimeConnection | None = None, env: dict[str, str] | None = None
    ) -> CopilotClient:
        if connection is None:
            connection = start_server(None, *args, env=env).connection()
        client = CopilotClient(connection=connection)
        await client.start()
        started.append(client)
        return client

    yield open_client
    for client in started:
        await client.force_stop()


def refusal(raised: pytest.ExceptionInfo[BaseException]) -> tuple[int, str]:
    """The JSON-RPC code and message of a refusal the official client raised."""
    error = raised.value
    assert isinstance(error, JsonRpcError), repr(error)
    return error.code, error.message


async def _reply(client: CopilotClient, model: ReplayServer, **options: Any) -> str | None:
    """Create a session with `options`, send `Add`, the reply's text."""
    session = await client.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        on_permission_request=PermissionHandler.approve_all,
        **options,
    )
    try:
        reply = await session.send_and_wait("Add", timeout=60)
    finally:
        await session.disconnect()
    return getattr(reply.data, "content", None) if reply is not None else None


# --- S12: commands a client names ---------------------------------------------------------


async def test_s12_a_tcp_clients_mcp_command_is_refused_and_nothing_is_stored(
    official: OpenClient, start_server: StartServer, tmp_path: Path
) -> None:
    server = start_server(None)
    client = await official(connection=server.connection())

    def logged(session_id: str) -> int:
        metadata = server.raw().result("session.getMetadata", {"sessionId": session_id})
        return int(metadata["session"]["eventCount"])

    marker = tmp_path / "ran"
    attack: Any = {"x": demo("/bin/sh", "-c", f"touch {marker}")}
    async with ReplayServer() as model:
        options: dict[str, Any] = {
            "provider": provider(model),
            "on_permission_request": PermissionHandler.approve_all,
        }
        with pytest.raises(Exception) as raised:
            await client.create_session(session_id="attack", mcp_servers=attack, **options)
        code, message = refusal(raised)
        assert code == POLICY_REFUSED
        assert message.startswith("POLICY_REFUSED: mcp_commands: MCP server 'x' would run")
        assert "--allow-mcp-commands, or --mcp-command sh" in message
        assert "attack" not in {s.session_id for s in await client.list_sessions()}

        # Nor through a resume of a session it has: the log is left as it was.
        plain = await client.create_session(session_id="plain", **options)
        await plain.disconnect()
        before = logged("plain")
        with pytest.raises(Exception) as raised:
            await client.resume_session("plain", mcp_servers=attack, **options)
        assert refusal(raised)[0] == POLICY_REFUSED
        assert logged("plain") == before
    assert not marker.exists()


async def test_s12_another_account_on_a_no_auth_server_runs_no_command(
    other_account: Account, start_server: StartServer, shared_directory: Path
) -> None:
    """The issue's attack: a local account reaches a loopback server and names a shell
    command, which ran as the server's user (root)."""
    server = start_server(None, "--no-auth")
    marker = shared_directory / "pwned"
    create = {
        "sessionId": "attack",
        "provider": {"type": "openai", "baseUrl": "http://127.0.0.1:9/v1", "apiKey": "k"},
        "mcpServers": {"x": {"command": "/bin/sh", "args": ["-c", f"id > {marker}"]}},
    }
    created, sent = other_account.rpc(
        server.port,
        [("session.create", create), ("session.send", {"sessionId": "attack", "prompt": "go"})],
    )
    assert created is not None and created["error"]["code"] == POLICY_REFUSED
    assert created["error"]["data"] == {
        "code": "policy_refused",
        "policy": "mcp_commands",
        "flag": "--allow-mcp-commands, or --mcp-command sh",
    }
    assert sent is not None and "Session not found: attack" in sent["error"]["message"]
    assert server.raw().result("session.list") == {"sessions": []}
    assert not marker.exists()


async def test_s12_allow_mcp_commands_runs_a_tcp_clients_command(official: OpenClient) -> None:
    client = await official("--allow-mcp-commands")
    async with ReplayServer([ADD]) as model:
        assert await _reply(client, model, mcp_servers={"demo": demo()}) == "It is 42."


async def test_s12_over_stdio_a_clients_mcp_command_runs_as_before(
    official: OpenClient, stdio_executable: Path, tmp_path: Path
) -> None:
    args = ["--store", str(tmp_path / "stdio.db")]
    client = await official(
        connection=RuntimeConnection.for_stdio(path=str(stdio_executable), args=args)
    )
    async with ReplayServer([ADD]) as model:
        assert await _reply(client, model, mcp_servers={"demo": demo()}) == "It is 42."


async def test_s12_an_allow_list_matches_the_file_a_command_resolves_to(
    official: OpenClient, tmp_path: Path
) -> None:
    bin_dir, elsewhere = tmp_path / "bin", tmp_path / "elsewhere"
    for directory in (bin_dir, elsewhere):
        directory.mkdir()
        script = directory / "demo-mcp"
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DEMO}" "$@"\n')
        script.chmod(0o755)
    alias = tmp_path / "alias"
    alias.symlink_to(bin_dir / "demo-mcp")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    client = await official("--mcp-command", "demo-mcp", env=env)

    async with ReplayServer([ADD, ADD]) as model:
        # By its name on the server's PATH, and by a path to the same file.
        runs = {"demo": demo("demo-mcp", "stdio", env={"DEMO_NOTE": "an ordinary variable"})}
        assert await _reply(client, model, mcp_servers=runs) == "It is 42."
        assert await _reply(client, model, mcp_servers={"demo": demo(str(alias), "stdio")}) == (
            "It is 42."
        )
        refused = [
            # Another file of the same name: the name is not what is allowed.
            (demo(str(elsewhere / "demo-mcp"), "stdio"), "--mcp-command"),
            (demo("/bin/sh", "-c", "true"), "--mcp-command"),
            # What would make the allowed command load or find another program.
            (demo("demo-mcp", "stdio", env={"LD_PRELOAD": str(tmp_path / "x.so")}), "LD_PRELOAD"),
            (demo("demo-mcp", "stdio", env={"PATH": str(elsewhere)}), "sets PATH"),
            (demo("demo-mcp", "stdio", env={"PYTHONPATH": str(tmp_path)}), "PYTHONPATH"),
        ]
        for config, why in refused:
            with pytest.raises(Exception) as raised:
                await _reply(client, model, mcp_servers={"demo": config})
            code, message = refusal(raised)
            assert code == POLICY_REFUSED and why in message, message
        assert [s.session_id for s in await client.list_sessions()].__len__() == 2


def test_s12_an_allow_list_entry_must_name_an_executable() -> None:
    options = ServerOptions(mcp_command=["no-such-command-here"], store="memory")
    with pytest.raises(ValueError, match="--mcp-command 'no-such-command-here' names no exec"):
        HostPolicy.of(options)


# --- S13: files a client names ------------------------------------------------------------


async def _send(client: CopilotClient, model: ReplayServer, attachments: list[Any]) -> Any:
    """Create a session and send `Look` with `attachments`; the session (still open)."""
    session = await client.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        on_permission_request=PermissionHandler.approve_all,
    )
    await session.send("Look", attachments=attachments)
    return session


async def _refused(client: CopilotClient, model: ReplayServer, attachment: dict[str, Any]) -> str:
    """The message of the refusal of a send with `attachment`, which stored nothing."""
    session = await client.create_session(
        provider=provider(model),  # type: ignore[arg-type]
        on_permission_request=PermissionHandler.approve_all,
    )
    before = len(await session.get_events())
    with pytest.raises(Exception) as raised:
        await session.send("Look", attachments=[attachment])  # type: ignore[list-item]
    code, message = refusal(raised)
    assert code == POLICY_REFUSED, message
    assert len(await session.get_events()) == before
    await session.disconnect()
    return message


async def test_s13_a_tcp_client_gets_no_file_without_a_root(
    official: OpenClient, tmp_path: Path
) -> None:
    client = await official()
    notes = tmp_path / "notes.txt"
    notes.write_text("notes")
    async with ReplayServer() as model:
        for attachment in (
            {"type": "file", "path": "/etc/shadow"},
            {"type": "file", "path": str(notes)},
            {"type": "directory", "path": "/etc"},
            {"type": "selection", "filePath": "/etc/shadow", "displayName": "s"},
        ):
            message = await _refused(client, model, attachment)
            assert message.startswith("POLICY_REFUSED: files: attachment ")
            assert "this server reads no file for its clients" in message
            assert "--attachments-root DIR" in message
        # What reads no file of the host is not refused: a selection's given text, a blob.
        given = {"type": "selection", "filePath": "/etc/shadow", "displayName": "s", "text": "t"}
        session = await _send(client, model, [given])
        await session.disconnect()
    assert "root:" not in str(model.requests)


async def test_s13_inside_the_root_only_with_symlinks_and_dots_resolved(
    official: OpenClient, tmp_path: Path
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "notes.txt").write_text("inside text")
    key = outside / "api.key"
    key.write_text("sk-SECRET-KEY")
    key.chmod(0o600)
    (root / "key-link").symlink_to(key)
    (root / "shadow-link").symlink_to("/etc/shadow")
    (root / "out-dir").symlink_to(outside)
    (root / "inner-link").symlink_to(root / "sub" / "notes.txt")
    client = await official("--attachments-root", str(root))
    seen = conversation(user("Look"), assistant("Seen."))
    async with ReplayServer([seen, seen]) as model:
        for attachment in (
            {"type": "file", "path": "/etc/shadow"},
            {"type": "file", "path": str(root / "shadow-link")},
            {"type": "file", "path": str(root / "key-link")},
            {"type": "file", "path": f"{root}/../outside/api.key"},
            {"type": "file", "path": str(root / "out-dir" / "api.key")},
            {"type": "directory", "path": str(root / "out-dir")},
            {"type": "selection", "filePath": str(root / "key-link"), "displayName": "k"},
        ):
            message = await _refused(client, model, attachment)
            assert "is outside the directory this server reads its clients' files from" in message
            assert "--attachments-root" in message
        assert model.requests == []
        inside = [
            {"type": "file", "path": str(root / "sub" / "notes.txt")},
            {"type": "file", "path": str(root / "inner-link")},
            {"type": "directory", "path": f"{root}/sub/../sub"},
            {"type": "selection", "filePath": str(root / "inner-link")},  # its text is read
        ]
        session = await _send(client, model, inside)
        for _ in range(300):
            if model.requests:
                break
            await asyncio.sleep(0.1)
        await session.disconnect()
    [request] = model.requests
    text = request["messages"][-1]["content"]
    # Files and directories are named with their lines and entries counted (D11), a
    # selection quoted: each was read through the policy.
    assert f"* {root / 'sub' / 'notes.txt'} (1 lines)" in text
    assert f"* {root / 'inner-link'} (1 lines)" in text
    assert f"* {root}/sub/../sub (1 items)" in text
    assert text.count("inside text") == 1
    assert "SECRET" not in str(model.requests)


def test_s13_a_local_providers_weights_are_a_file_too(start_server: StartServer) -> None:
    # (The official client sends only the provider keys it knows: trimtab's own take it.)
    client = start_server(None).raw()
    local = {"type": "local", "modelPath": "/etc/shadow"}
    refused = client.request("session.create", {"sessionId": "w", "provider": local})
    assert refused["error"]["code"] == POLICY_REFUSED
    assert "the provider's model_path /etc/shadow" in refused["error"]["message"]
    assert client.result("session.list") == {"sessions": []}


async def test_s13_over_stdio_attachments_read_any_file_as_before(
    official: OpenClient, stdio_executable: Path, tmp_path: Path
) -> None:
    notes = tmp_path / "anywhere.txt"
    notes.write_text("read as before")
    args = ["--store", str(tmp_path / "stdio.db")]
    client = await official(
        connection=RuntimeConnection.for_stdio(path=str(stdio_executable), args=args)
    )
    seen = conversation(user("Look"), assistant("Seen."))
    async with ReplayServer([seen]) as model:
        attachments = [
            {"type": "file", "path": str(notes)},
            {"type": "selection", "filePath": str(notes)},  # its text is read
        ]
        session = await _send(client, model, attachments)
        for _ in range(300):
            if model.requests:
                break
            await asyncio.sleep(0.1)
        await session.disconnect()
    text = model.requests[0]["messages"][-1]["content"]
    assert "read as before" in text and f"* {notes} (1 lines)" in text


def test_s13_a_symlink_put_in_the_way_after_the_check_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "dir").mkdir(parents=True)
    outside.mkdir()
    (root / "dir" / "file").write_text("inside")
    (outside / "file").write_text("outside")
    policy = HostPolicy.of(ServerOptions(attachments_root=root, store="memory"))
    checked = HostPolicy.check_path

    def swapped(self: HostPolicy, path: Path, what: str) -> Path:
        target = checked(self, path, what)
        # The race: once checked, the directory on the path becomes a link outside.
        (root / "dir").rename(root / "was-dir")
        (root / "dir").symlink_to(outside)
        return target

    monkeypatch.setattr(HostPolicy, "check_path", swapped)
    with pytest.raises(PolicyRefusedError, match="moved outside the directory"):
        policy.open(root / "dir" / "file", os.O_RDONLY, "attachment file")


# --- S14: URLs a client names -------------------------------------------------------------


async def test_s14_allowed_hosts_confine_a_clients_provider_and_mcp_urls(
    official: OpenClient,
) -> None:
    client = await official("--allowed-host", "127.0.0.1")
    hello = conversation(user("Add"), assistant("Hello."))
    async with ReplayServer([hello]) as model:
        assert await _reply(client, model) == "Hello."  # the model at 127.0.0.1
        elsewhere = {
            **provider(model),
            "base_url": model.base_url.replace("127.0.0.1", "localhost"),
        }
        for options in (
            {"provider": elsewhere},
            {
                "provider": provider(model),
                "mcp_servers": {"meta": {"type": "http", "url": "http://169.254.169.254/mcp"}},
            },
        ):
            with pytest.raises(Exception) as raised:
                await client.create_session(
                    on_permission_request=PermissionHandler.approve_all,
                    **options,  # type: ignore[arg-type]
                )
            code, message = refusal(raised)
            assert code == POLICY_REFUSED and message.startswith("POLICY_REFUSED: hosts: ")
            assert "--allowed-host" in message
    assert len(await client.list_sessions()) == 1


def test_s14_an_allowed_host_names_a_host_or_its_subdomains() -> None:
    policy = HostPolicy.of(
        ServerOptions(allowed_host=["API.example.com", "*.models.test", "::1"], store="memory")
    )
    for url in (
        "https://api.example.com/v1",
        "https://API.EXAMPLE.COM./v1",
        "http://a.models.test/v1",
        "http://a.b.models.test:8080/v1",
        "http://[::1]:11434/v1",
    ):
        policy.check_url(url, "url")
    for url in (
        "https://example.com/v1",
        "https://api.example.com.evil.test/v1",
        "http://models.test/v1",
        "http://evilmodels.test/v1",
        "http://user@evil.test/?@api.example.com",
    ):
        with pytest.raises(PolicyRefusedError, match="--allowed-host"):
            policy.check_url(url, "url")


@pytest.mark.parametrize("entry", ["https://api.example.com", "api.example.com:443", "", "*"])
def test_s14_an_allowed_host_that_names_no_host_stops_the_start(entry: str) -> None:
    with pytest.raises(ValueError, match="is not a host: give its name or address alone"):
        HostPolicy.of(ServerOptions(allowed_host=[entry], store="memory"))


# --- S15: the refusal as trimtab's own client sees it -------------------------------------


async def test_s15_a_refusal_is_a_policy_refused_error_in_the_remote_client(
    start_server: StartServer,
) -> None:
    server: ServerProcess = start_server(None)
    async with ReplayServer() as model, server.remote() as client:
        session = await client.create_session(provider=provider(model))
        with pytest.raises(PolicyRefusedError) as raised:
            await session.send("Look", attachments=[{"type": "file", "path": "/etc/shadow"}])
        assert (raised.value.policy, raised.value.flag) == ("files", "--attachments-root DIR")
        assert "attachment file /etc/shadow" in str(raised.value)
        assert [e.type for e in await session.get_events()] == ["session.start"]
