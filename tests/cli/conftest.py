"""Drive the `trimtab` command line as a person would: as a subprocess, or in a real
pseudo-terminal (pexpect), with the scripted provider so that no model or network is needed.

The CLI is never imported in the test process: importing `trimtab.cli` would also make
`cli` an attribute of the `trimtab` package, which the public-surface test would see.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect  # type: ignore[import-untyped]
import pytest

from tests.fake_ollama import not_ollama, ollama  # noqa: F401 (fixtures of the CLI's tests)

SRC = Path(__file__).resolve().parents[2] / "src"

_SCRUBBED = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "NO_COLOR", "OLLAMA_HOST")


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local port bound but not listening: connecting to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


class Cli:
    """Runs `python -m trimtab` in a clean environment, in its own working directory.

    Each command runs in a process group of its own, which `close` (the fixture's teardown)
    kills if it is still running: a test that fails or times out half-way leaves nothing.
    """

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.env = env
        self.home = Path(env["TRIMTAB_HOME"])
        self._scripts = 0
        self._started: list[Any] = []

    def __call__(
        self, *args: str, input: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one command to its end; stdin is `input`, or empty (never the test's TTY)."""
        process = self.popen(
            *args,
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        stdout, stderr = process.communicate(input, timeout=60)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Start a command with empty stdin and captured output; `finish` collects it."""
        return self.popen(
            *args,
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    @staticmethod
    def finish(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
        """Wait for a started command."""
        stdout, stderr = process.communicate(timeout=60)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def many(self, *commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
        """Run independent commands at the same time (each one costs an interpreter start)."""
        return [self.finish(process) for process in [self.start(*c) for c in commands]]

    def popen(self, *args: str, **options: Any) -> subprocess.Popen[str]:
        """Start a command without waiting for it."""
        options.setdefault("env", self.env)
        process = subprocess.Popen(
            [sys.executable, "-m", "trimtab", *args],
            cwd=self.cwd,
            text=True,
            start_new_session=True,
            **options,
        )
        self._started.append(process)
        return process

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> Any:
        """Start a command in a real pseudo-terminal (a session of its own)."""
        child = pexpect.spawn(
            sys.executable,
            ["-m", "trimtab", *args],
            cwd=str(self.cwd),
            env={**self.env, **(env or {})},
            encoding="utf-8",
            timeout=15,
            dimensions=(50, 160),
        )
        self._started.append(child)
        return child

    def close(self) -> None:
        """Kill every command still running, with whatever it started in its group."""
        for started in self._started:
            running = (
                started.poll() is None
                if isinstance(started, subprocess.Popen)
                else (started.isalive())
            )
            if running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(started.pid, signal.SIGKILL)
            if isinstance(started, subprocess.Popen):
                started.wait()
                for stream in (started.stdin, started.stdout, started.stderr):
                    if stream is not None:
                        stream.close()
            else:
                started.close(force=True)

    def script(self, *steps: Any) -> str:
        """Write a scripted-provider file and return its path."""
        self._scripts += 1
        path = self.cwd / f"script{self._scripts}.json"
        path.write_text(json.dumps(list(steps)))
        return str(path)

    def scripted(self, *steps: Any) -> list[str]:
        """The flags selecting the scripted provider with these steps."""
        return ["--provider", "scripted", "--script", self.script(*steps)]


@pytest.fixture
def cli(tmp_path: Path, closed_port: int) -> Iterator[Cli]:
    """A CLI runner whose home, store and working directory are fresh and whose environment
    names no provider: the Ollama probe is pointed at a closed port, never at 11434."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("TRIMTAB_") and name not in _SCRUBBED
    }
    env.update(
        TRIMTAB_HOME=str(tmp_path / "home"),
        TRIMTAB_OLLAMA_URL=f"http://127.0.0.1:{closed_port}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")])),
        TERM="xterm-256color",
    )
    work = tmp_path / "work"
    work.mkdir()
    runner = Cli(work, env)
    yield runner
    runner.close()


def json_lines(text: str) -> list[dict[str, Any]]:
    """Each line of `text` parsed as one JSON object."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    """A script step in which the model calls one tool."""
    return {"tool_call": {"name": name, "arguments": arguments}}


def no_traceback(result: subprocess.CompletedProcess[str]) -> bool:
    """Neither stream shows a Python traceback."""
    return "Traceback" not in result.stdout + result.stderr
