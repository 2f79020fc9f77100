"""Spec D15 and MCP9: trimtab's remote client (`Client.connect`) configures a session's MCP
servers as the official client does; they run where the session runs, in the server."""

from __future__ import annotations

from pathlib import Path

from tests.mcp.conftest import DEMO, assert_no_orphans, stdio
from tests.server.conftest import StartServer, assistant, call, conversation, provider, tool, user
from trimtab import PermissionHandler
from trimtab.testing import ReplayServer


async def test_d15_the_remote_client_sends_mcp_servers(
    start_server: StartServer, pids: Path, tmp_path: Path
) -> None:
    """Before D15, `mcp_servers` on a remote session was refused with `TypeError`."""
    recorded = conversation(
        user("Use the tool"),
        assistant(None, call("call_1", "demo__add", a=40, b=2)),
        tool("call_1", "42"),
        assistant("It said 42."),
    )
    servers = {"demo": stdio(DEMO, pids=pids, working_directory=str(tmp_path))}
    # Over TCP a client's MCP commands run only where the operator allows them (spec S11).
    server = start_server(None, "--allow-mcp-commands")
    async with ReplayServer([recorded]) as model, server.remote() as remote:
        session = await remote.create_session(
            provider=provider(model),
            model="test-model",
            mcp_servers=servers,
            on_permission_request=PermissionHandler.approve_all,
        )
        reply = await session.send_and_wait("Use the tool", timeout=60)
        await session.disconnect()
    assert reply is not None and reply.data.content == "It said 42."
    assert_no_orphans(pids, runtime_pid=server.process.pid)  # stopped with the session
