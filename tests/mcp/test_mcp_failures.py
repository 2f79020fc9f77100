"""Issue 18: a misbehaving MCP server ends the call with a typed outcome, the run goes on, and
none of its processes is left behind (spec MCP5, MCP8). `servers/faulty.py` misbehaves."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.mcp.conftest import FAULTY, alive, assert_no_orphans, guards, started, stdio, wait_gone
from tests.mcp.test_mcp_tools import open_session, outcomes
from trimtab import Client
from trimtab.events import SessionWarningEvent
from trimtab.mcp._results import MAX_RESULT_CHARS
from trimtab.testing import ScriptedModel, tool_call


async def run(
    pids: Path, mode: str, *calls: str, timeout: int = 60_000
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Run one prompt whose model calls `calls` of the `mode` server, one per turn."""
    model = ScriptedModel([*(tool_call(f"bad__{name}") for name in calls), "still going"])
    async with Client(store="memory") as client:
        servers = {"bad": stdio(FAULTY, mode, pids=pids, timeout=timeout)}
        session = await open_session(client, model, mcp_servers=servers)
        reply = await session.send_and_wait("go")
        events = await session.get_events()
    assert reply is not None and reply.data.content == "still going"  # the run went on
    warnings = [e.data.message for e in events if isinstance(e, SessionWarningEvent)]
    return outcomes(events), warnings


async def test_mcp8_a_server_that_exits_at_start_is_left_out_with_a_warning(pids: Path) -> None:
    done, warnings = await run(pids, "exit", "ok")
    assert done == [("bad__ok", "failure", "Tool 'bad__ok' does not exist.")]
    assert len(warnings) == 1
    assert warnings[0].startswith("MCP server 'bad' failed to start: the server exited")
    assert "refusing to start" in warnings[0]  # its last words, from its stderr
    assert_no_orphans(pids)


async def test_mcp8_a_crash_mid_call_fails_the_call_and_the_next_call_restarts_it(
    pids: Path,
) -> None:
    done, warnings = await run(pids, "crash", "crash", "ok")
    assert done[0][:2] == ("bad__crash", "failure")
    assert done[0][2].startswith("MCP server 'bad' stopped during the call")
    assert done[1] == ("bad__ok", "success", "fine")
    assert len(started(pids)) == 2  # restarted
    assert warnings == []
    assert_no_orphans(pids)


async def test_mcp8_a_call_that_hangs_past_the_timeout_ends_timeout(pids: Path) -> None:
    done, _ = await run(pids, "hang", "hang", "ok", timeout=500)
    assert done[0] == ("bad__hang", "timeout", "Tool 'bad__hang' timed out after 0.5 s.")
    assert done[1] == ("bad__ok", "success", "fine")  # the same server serves on
    assert len(started(pids)) == 1
    assert_no_orphans(pids)


async def test_mcp8_a_malformed_result_is_a_failure(pids: Path) -> None:
    done, _ = await run(pids, "malformed", "bad", "ok")
    assert done[0] == ("bad__bad", "failure", "MCP server 'bad' returned a malformed result.")
    assert done[1] == ("bad__ok", "success", "fine")
    assert_no_orphans(pids)


async def test_mcp8_a_flood_of_output_is_bounded(pids: Path) -> None:
    done, _ = await run(pids, "flood", "flood", "ok")
    name, outcome, text = done[0]
    assert (name, outcome) == ("bad__flood", "success")
    # 20 MB went to stderr (read and dropped), and the result was cut for the model.
    assert text.startswith("y" * 1000) and text.endswith("[... 200000 more characters cut]")
    assert len(text) < MAX_RESULT_CHARS + 100
    assert done[1] == ("bad__ok", "success", "fine")
    assert_no_orphans(pids)


async def test_mcp5_a_server_that_ignores_eof_and_sigterm_is_killed(pids: Path) -> None:
    started_at = time.monotonic()
    done, _ = await run(pids, "stubborn", "ok")
    assert done == [("bad__ok", "success", "fine")]
    assert len(started(pids)) == 2  # the server and the child it started
    assert_no_orphans(pids)
    assert time.monotonic() - started_at < 20


RUNTIME = """
import asyncio, sys
from trimtab import Client, PermissionHandler
from trimtab.testing import ScriptedModel, tool_call

async def main():
    model = ScriptedModel([tool_call("bad__ok"), "ready"])
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=model, on_permission_request=PermissionHandler.approve_all,
            mcp_servers={"bad": {"command": sys.executable, "args": [sys.argv[1], "stubborn"],
                                 "env": {"TRIMTAB_TEST_PIDS": sys.argv[2]}}},
        )
        await session.send_and_wait("go")
        print("ready", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_mcp5_no_orphan_after_kill_9_of_the_runtime(pids: Path) -> None:
    runtime = subprocess.Popen(
        [sys.executable, "-c", RUNTIME, str(FAULTY), str(pids)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert runtime.stdout is not None
    assert runtime.stdout.readline() == b"ready\n"
    deadline = time.monotonic() + 15
    while len(started(pids)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the server's child writes its pid file once it runs
    servers, guard = started(pids), guards(runtime.pid)
    assert len(servers) == 2 and len(guard) == 1
    assert all(alive(pid) for pid in [*servers, *guard])
    runtime.send_signal(signal.SIGKILL)
    runtime.wait()
    # The guard notices at once (PR_SET_PDEATHSIG), and the server ignores SIGTERM: SIGKILL
    # after the grace period.
    assert wait_gone([*servers, *guard]) == []


async def test_mcp3_a_failed_start_logs_no_secret_of_the_servers_url() -> None:
    # httpx names the URL in its error, and the reason is logged: its user, password and
    # query (where tokens go) stay out of the log.
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://user:SECRET-PASSWORD@127.0.0.1:{port}/sse?api_key=SECRET-TOKEN"
    try:
        async with Client(store="memory") as client:
            session = await open_session(
                client,
                ScriptedModel(["fine"]),
                mcp_servers={"s": {"type": "sse", "url": url, "tools": ["*"]}},
            )
            await session.send_and_wait("go")
            events = await session.get_events()
    finally:
        server.close()
    warnings = [e.data.message for e in events if isinstance(e, SessionWarningEvent)]
    assert warnings and "failed to start" in warnings[0]
    assert f"127.0.0.1:{port}/sse" in warnings[0]
    assert not any("SECRET" in warning for warning in warnings), warnings
