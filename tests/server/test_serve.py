"""The server as a process: start-up time and memory, what it writes to stdout, the flags
official clients add, where it refuses to listen, and what it checks before it says it
listens (issue 15, item 7)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import StartServer
from trimtab.protocol.framing import encode_frame
from trimtab.server import ServerOptions, serve

COPILOT_FLAGS = [
    "--server",
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
    "--embedded-host",
    "--cli-login-sync-integration-id=vscode",
]
"""Every flag the official clients pass to a runtime they spawn (each SDK's own argv:
test_sdk_spawn.py)."""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A minimal environment that still imports this checkout's trimtab."""
    env = {"PATH": "/usr/bin:/bin", "TRIMTAB_HOME": str(tmp_path), **extra}
    if pythonpath := os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = pythonpath
    return env


def _serve(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """`python -m trimtab.server ARGS`, expected to stop by itself."""
    return subprocess.run(
        [sys.executable, "-m", "trimtab.server", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(tmp_path, **extra),
    )


def test_start_up_time_and_memory(start_server: StartServer, record_property: Any) -> None:
    server = start_server(None, *COPILOT_FLAGS)
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


def test_starting_builds_no_validator_of_trimtab_s_own() -> None:
    """Every trimtab model is built on first use: building them, and the first build's import
    of pydantic's plugin lookup, would be paid before the server accepts a connection."""
    code = (
        "import pydantic, trimtab.server.__main__\n"
        "def models(cls):\n"
        "    for sub in cls.__subclasses__():\n"
        "        yield sub\n"
        "        yield from models(sub)\n"
        "built = {m.__qualname__ for m in models(pydantic.BaseModel)\n"
        "         if m.__module__.startswith('trimtab') and m.__pydantic_complete__}\n"
        "assert not built, built\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


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
        [sys.executable, "-m", "trimtab.server", *COPILOT_FLAGS, "--stdio"],
        input=stdin,
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        env=_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr.decode()
    answers = {f["id"]: f for f in read_frames_strictly(done.stdout)}
    assert answers["a"]["result"]["protocolVersion"] == 3
    assert answers["b"]["result"]["message"] == "pong: hi"
    assert answers["c"]["error"]["code"] == -32601
    assert answers["d"]["result"] is None
    assert b"trimtab" in done.stderr  # the debug log went to stderr


def test_a_non_loopback_address_needs_a_token(tmp_path: Path) -> None:
    done = _serve(tmp_path, "--host", "0.0.0.0", "--store", "memory")
    assert done.returncode == 2 and "refusing to listen" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.com", ""])
def test_serve_refuses_before_binding(host: str) -> None:
    with pytest.raises(ValueError, match="without a connection token"):
        ServerOptions(host=host, store="memory")


@pytest.mark.parametrize(
    "duration",
    ["lease_ttl", "store_timeout", "pending_timeout", "frame_timeout", "connect_timeout"],
)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0, -5.0])
def test_w3_serve_refuses_a_duration_that_bounds_nothing(duration: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{duration}\n.*(greater than 0|finite number)"):
        ServerOptions.model_validate({"store": "memory", duration: value})


async def test_s10_a_loopback_server_in_process_makes_its_token_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIMTAB_HOME", str(tmp_path))
    for host in ("127.0.0.1", "127.0.0.2"):
        ready: asyncio.Queue[int] = asyncio.Queue()
        options = ServerOptions(host=host, store="memory")
        task = asyncio.create_task(serve(options, on_ready=ready.put_nowait))
        port = await asyncio.wait_for(ready.get(), 10)
        made = tmp_path / "serve" / f"{port}.token"
        assert len(made.read_text()) >= 40  # written before the server says it is ready
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert not made.exists()


# --- item 7: checked before "listening" -------------------------------------------------------


def _one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The error line of a server that refused to start: exit `code`, nothing on stdout (so
    no "listening"), an `error:` line and a `hint:` line, no traceback."""
    assert done.returncode == code, done.stderr
    assert done.stdout == ""
    error, hint = done.stderr.splitlines()
    assert error.startswith("error: ") and hint.startswith("hint: ")
    return error


def test_issue15_7_an_unreachable_database_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        started = time.monotonic()
        done = _serve(tmp_path, "--store", f"postgresql://postgres@127.0.0.1:{port}/trimtab")
    error = _one_line_error(done, 1)
    assert error.startswith("error: cannot open the session store: ")
    assert f"port {port} failed" in error
    assert time.monotonic() - started < 30


def test_issue15_7_a_missing_database_driver_is_one_line_and_exit_1(tmp_path: Path) -> None:
    # A psycopg that cannot be imported, ahead of the installed one on the path.
    fake = tmp_path / "fake" / "psycopg"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named psycopg')\n")
    path = os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "trimtab.server", "--store", "postgresql://x@127.0.0.1/db"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_env(tmp_path), "PYTHONPATH": path},
    )
    error = _one_line_error(done, 1)
    assert "a PostgreSQL store needs psycopg" in error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--provider", '{"type": "nope"}'], "error: Invalid value for '--provider': type: Input"),
        (["--provider", '{"type": "openai"'], "error: Invalid value for '--provider': not JSON"),
        (["--provider", '["openai"]'], "error: Invalid value for '--provider': expected openai,"),
        (["--provider", "gpt"], "error: Invalid value for '--provider': expected openai, anth"),
        (
            ["--provider", '{"type": "openai", "baseUrl": "localhost:11434"}'],
            "error: Invalid value for '--provider': baseUrl: 'localhost:11434' is not an http",
        ),
        (["--provider", '{"type": "azure"}'], "error: provider type 'azure' needs api_version"),
        (["--some-future-flag"], "error: No such option '--some-future-flag'"),
        (["serve"], "error: Got unexpected extra argument (serve)"),
        (["--port", "65536"], "error: Invalid value for '--port': Input should be less than or"),
        (["--lease-ttl", "0"], "error: Invalid value for '--lease-ttl': Input should be greater"),
        (
            ["--lease-ttl", "inf"],
            "error: Invalid value for '--lease-ttl': Input should be a finite",
        ),
        (["--idle-timeout", "nan"], "error: Invalid value for '--idle-timeout'"),
        (["--max-requests", "0"], "error: Invalid value for '--max-requests'"),
        (["--max-output", "1e3"], "error: Invalid value for '--max-output': Input should be a val"),
        (["--log-level", "loud"], "error: Invalid value for '--log-level': 'loud' is not one of"),
        (["--store", "mysql://x"], "error: cannot open a store from 'mysql://x'"),
    ],
)
def test_issue15_7_bad_flags_and_provider_configs_are_usage_errors(
    tmp_path: Path, args: list[str], message: str
) -> None:
    store = [] if "--store" in args else ["--store", "memory"]
    error = _one_line_error(_serve(tmp_path, *store, *args), 2)
    assert error.startswith(message), error


def test_issue15_7_both_entry_points_share_flags_defaults_and_help(tmp_path: Path) -> None:
    module = _serve(tmp_path, "--help")
    command = subprocess.run(
        [sys.executable, "-m", "trimtab", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(tmp_path),
    )
    assert module.returncode == command.returncode == 0
    assert module.stdout.startswith("Usage: python -m trimtab.server [OPTIONS]")
    assert command.stdout == module.stdout.replace("python -m trimtab.server", "trimtab serve")
    for default in (
        "[default: 127.0.0.1]",
        "[default: 30.0",
        "[default: 4096",
        "[default: warning]",
    ):
        assert default in " ".join(module.stdout.split()), default


def test_issue15_7_log_level_debug_logs(start_server: StartServer) -> None:
    server = start_server(None, "--log-level", "debug")
    client = server.raw()
    client.result("ping", {"message": "traced"})
    client.close()
    server.stop()
    log = server.log.read_text()
    assert " DEBUG trimtab.server: listening on 127.0.0.1 port " in log
    assert "connected (1 open)" in log and ": ping (id 2)" in log  # after `connect`
