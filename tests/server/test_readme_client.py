"""The README's Copilot client program runs as written (issue 33): against `trimtab serve` on
the port it names, and spawning the server itself over stdio. Only the addresses change: the
server's port is a free one, and the model is a replay server in Ollama's place."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import socket
import sys
from pathlib import Path

import pytest

from tests.server.conftest import ServerProcess, assistant, conversation, user
from trimtab.testing import ReplayServer

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Use trimtab as the runtime for Copilot SDK programs"
README_PORT = "8765"
OLLAMA = "http://localhost:11434/v1"
HELLO = conversation(user("Say hello."), assistant("Hello!"))


def _blocks() -> list[tuple[str, str]]:
    """The (language, code) of each fenced block of the README's section on Copilot clients."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.DOTALL)


def _snippets() -> tuple[list[str], str, str]:
    """The `trimtab serve` command's arguments, the client program, its stdio variant line."""
    (shell, command), (_, program), (_, stdio) = _blocks()[:3]
    assert shell == "bash"
    args = shlex.split(command, comments=True)
    assert args[:2] == ["trimtab", "serve"], args
    return args[2:], program, stdio.strip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _run(program: str, env: dict[str, str]) -> str:
    """Run `program` with this interpreter; its stdout, once it exited 0."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        program,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()
    return stdout.decode()


async def test_issue33_the_readme_client_runs_against_trimtab_serve(tmp_path: Path) -> None:
    args, program, _ = _snippets()
    port = str(_free_port())
    assert program.count(f"127.0.0.1:{README_PORT}") == 1 and program.count(OLLAMA) == 1
    home = {"TRIMTAB_HOME": str(tmp_path / "home")}
    async with ReplayServer([HELLO]) as model:
        # As the README runs it: no token given, so the server makes one and writes it where
        # the program reads it (spec S10).
        server = ServerProcess(
            tmp_path / "t.db",
            *(port if arg == README_PORT else arg for arg in args),
            env=home,
            give_token=False,
        )
        try:
            assert server.port == int(port)
            program = program.replace(README_PORT, port).replace(OLLAMA, model.base_url)
            printed = await _run(program, {**os.environ, **home})
        finally:
            assert server.stop() == 0, server.log.read_text()
    assert printed == "Hello!\n"
    assert not server.token_file.exists()  # removed when the server stopped


async def test_issue33_the_readme_client_spawns_trimtab_serve_over_stdio(tmp_path: Path) -> None:
    _, program, stdio = _snippets()
    # The statement that makes the TCP client: from `client = ` to its closing parenthesis.
    tcp = re.search(r"^( +)client = CopilotClient\(\n.*?\n\1\)\n", program, re.M | re.S)
    assert tcp is not None and "RuntimeConnection.for_uri" in tcp.group()
    assert stdio.startswith("client = ")
    program = program.replace(tcp.group(), tcp.group(1) + stdio + "\n")
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "trimtab").exists():
        pytest.fail("the `trimtab` command is not installed next to this interpreter")
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
        "TRIMTAB_HOME": str(tmp_path),
    }
    async with ReplayServer([HELLO]) as model:
        printed = await _run(program.replace(OLLAMA, model.base_url), env)
    assert printed == "Hello!\n"
