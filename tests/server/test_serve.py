"""The server as a process: start-up time and memory, what it writes to stdout, the flags
official clients add, and where it refuses to listen."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import StartServer
from trimtab.server import serve
from trimtab.server.framing import encode_frame

COPILOT_FLAGS = [
    "--headless",
    "--no-auto-update",
    "--log-level",
    "debug",
    "--auth-token-env",
    "COPILOT_SDK_AUTH_TOKEN",
    "--no-auto-login",
    "--session-idle-timeout",
    "30",
    "--remote",
    "--some-future-flag",
]


def test_start_up_time_and_memory(start_server: StartServer, record_property: Any) -> None:
    server = start_server(None, *COPILOT_FLAGS[:-1])
    rss_kb = int(
        next(
            line.split()[1]
            for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
    )
    record_property("ready_seconds", round(server.ready_seconds, 3))
    record_property("rss_mb", round(rss_kb / 1024, 1))
    assert server.ready_seconds < 10
    assert rss_kb < 300 * 1024


def read_frames_strictly(data: bytes) -> list[Any]:
    """Frames as the official Python client reads them: one `Content-Length` line, one line
    it throws away, the body; anything else on stdout ends the connection for it."""
    frames = []
    while data:
        header, _, data = data.partition(b"\r\n")
        assert header.startswith(b"Content-Length: "), header
        blank, _, data = data.partition(b"\r\n")
        assert blank == b""
        length = int(header.split(b":")[1])
        frames.append(json.loads(data[:length]))
        data = data[length:]
    return frames


def test_stdio_writes_nothing_but_frames(tmp_path: Path) -> None:
    requests = [
        {"jsonrpc": "2.0", "id": "a", "method": "connect", "params": {"token": "ignored"}},
        {"jsonrpc": "2.0", "id": "b", "method": "ping", "params": {"message": "hi"}},
        {"jsonrpc": "2.0", "id": "c", "method": "no.such.method", "params": {}},
        {"jsonrpc": "2.0", "id": "d", "method": "runtime.shutdown", "params": {}},
    ]
    stdin = b"".join(encode_frame(json.dumps(r).encode()) for r in requests)
    done = subprocess.run(
        [sys.executable, "-m", "trimtab.server", "serve", *COPILOT_FLAGS, "--stdio"],
        input=stdin,
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "TRIMTAB_HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr.decode()
    answers = {f["id"]: f for f in read_frames_strictly(done.stdout)}
    assert answers["a"]["result"]["protocolVersion"] == 3
    assert answers["b"]["result"]["message"] == "pong: hi"
    assert answers["c"]["error"]["code"] == -32601
    assert answers["d"]["result"] is None
    assert b"trimtab" in done.stderr  # the debug log went to stderr


def test_a_non_loopback_address_needs_a_token(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trimtab.server", "--host", "0.0.0.0", "--store", "memory"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "TRIMTAB_HOME": str(tmp_path)},
    )
    assert done.returncode == 2 and "refusing to listen" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.com", ""])
async def test_serve_refuses_before_binding(host: str) -> None:
    with pytest.raises(ValueError, match="without a connection token"):
        await serve(host=host, store="memory")


async def test_loopback_addresses_need_no_token() -> None:
    for host in ("127.0.0.1", "127.0.0.2"):
        ready: asyncio.Queue[int] = asyncio.Queue()
        task = asyncio.create_task(serve(host=host, store="memory", on_ready=ready.put_nowait))
        assert await asyncio.wait_for(ready.get(), 10) > 0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
