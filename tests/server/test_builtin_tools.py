"""The built-in tools on `trimtab serve` (spec B8, B9), driven by the official Copilot client:
a program that declares no tool of its own reads, edits and tests code in its working
directory, as on the Copilot CLI."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from copilot import CopilotClient, RuntimeConnection
from copilot.session import PermissionHandler

from tests.builtin.conftest import gone, processes_in_group, written_pid
from tests.server.conftest import (
    StartServer,
    assistant,
    call,
    conversation,
    provider,
    tool,
    user,
)
from trimtab.testing import ReplayServer

Clients = Callable[[Path], Awaitable[CopilotClient]]
"""`clients(cwd)`: an official client that spawned `trimtab serve` over stdio in `cwd`."""


@pytest.fixture
async def clients(stdio_executable: Path, tmp_path: Path) -> AsyncIterator[Clients]:
    """Official clients over stdio, each with a server of its own; all stopped after the
    test, also when it fails."""
    started: list[CopilotClient] = []

    async def start(cwd: Path) -> CopilotClient:
        store = tmp_path / f"stdio{len(started)}.db"
        connection = RuntimeConnection.for_stdio(
            path=str(stdio_executable), args=["--store", str(store)]
        )
        client = CopilotClient(connection=connection, working_directory=str(cwd))
        started.append(client)
        await client.start()
        return client

    yield start
    for client in started:
        await client.stop()


async def open_session(client: CopilotClient, model: ReplayServer | None, **options: Any) -> Any:
    """A session of the official client whose model is `model` (none: one that is never
    reached), approving every call unless told otherwise."""
    unreachable = {"type": "openai", "base_url": "http://127.0.0.1:9", "api_key": "k"}
    settings: dict[str, Any] = {
        "provider": provider(model) if model is not None else unreachable,
        "model": "test-model",
        "on_permission_request": PermissionHandler.approve_all,
        **options,
    }
    return await client.create_session(**settings)


def text(reply: Any) -> str | None:
    """What an `assistant.message` said."""
    return None if reply is None else str(reply.data.content)


BROKEN = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"


def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(BROKEN)
    (repo / "test_calc.py").write_text(TEST)
    return repo


def fix_conversation(repo: Path) -> Any:
    test = f"{sys.executable} test_calc.py"
    return conversation(
        user("Fix the failing test"),
        assistant(None, call("c1", "view", path=f"{repo}/calc.py")),
        tool("c1", "1. def add(a, b):\n2.     return a - b\n3."),
        assistant(
            None,
            call("c2", "edit", path=f"{repo}/calc.py", old_str="a - b", new_str="a + b"),
        ),
        tool("c2", f"File {repo}/calc.py updated with changes."),
        assistant(None, call("c3", "bash", command=test, description="Run the test")),
        tool("c3", "ok\n<exited with exit code 0>"),
        assistant("Fixed: add adds now, and the test passes."),
    )


async def test_b8_a_copilot_program_reads_edits_and_tests_code_over_stdio(
    clients: Clients, tmp_path: Path
) -> None:
    repo = repository(tmp_path)
    asked: list[Any] = []

    def approve(request: Any, invocation: Any) -> Any:
        asked.append(request)
        return PermissionHandler.approve_all(request, invocation)

    client = await clients(repo)
    async with ReplayServer([fix_conversation(repo)]) as model:
        session = await open_session(client, model, on_permission_request=approve)
        reply = await session.send_and_wait("Fix the failing test", timeout=60)
        assert reply is not None
        assert text(reply) == "Fixed: add adds now, and the test passes."
        await session.disconnect()
    offered = {t["function"]["name"] for t in model.requests[0]["tools"]}
    assert (repo / "calc.py").read_text() == BROKEN.replace("a - b", "a + b")
    assert {"view", "create", "edit", "bash", "grep", "glob"} <= offered
    assert "report_intent" not in offered and "ask_user" not in offered
    kinds = [(r.kind, getattr(r, "path", None) or getattr(r, "file_name", None)) for r in asked]
    assert kinds[:2] == [("read", f"{repo}/calc.py"), ("write", f"{repo}/calc.py")]
    assert "-    return a - b\n+    return a + b" in asked[1].diff
    shell = asked[2]
    assert shell.kind == "shell" and shell.full_command_text.endswith("test_calc.py")
    assert shell.intention == "Run the test"
    assert [c.identifier for c in shell.commands] == [sys.executable]


async def test_b8_over_tcp_the_builtin_tools_are_off_unless_the_operator_turns_them_on(
    start_server: StartServer, tmp_path: Path
) -> None:
    repo = repository(tmp_path)
    missing = conversation(
        user("Look"),
        assistant(None, call("c1", "view", path=f"{repo}/calc.py")),
        tool("c1", "Tool 'view' does not exist."),
        assistant("No view here."),
    )
    server = start_server(tmp_path / "a.db")
    async with ReplayServer([missing]) as model:
        client = CopilotClient(connection=server.connection())
        await client.start()
        try:
            session = await open_session(
                client,
                model,
            )
            reply = await session.send_and_wait("Look", timeout=30)
            assert reply is not None and text(reply) == "No view here."
            await session.disconnect()
        finally:
            await client.force_stop()
    assert "tools" not in model.requests[0] or not model.requests[0]["tools"]


async def test_b8_over_tcp_a_working_directory_is_a_path_the_file_policy_decides(
    start_server: StartServer, tmp_path: Path
) -> None:
    """With the built-in tools on over TCP, a session's `workingDirectory` is a path its
    client names (spec S13): refused without `--attachments-root`, allowed inside it."""
    inside = tmp_path / "shared" / "project"
    inside.mkdir(parents=True)
    (inside / "notes.txt").write_text("inside\n")
    script = conversation(
        user("Read"),
        assistant(None, call("c1", "view", path="notes.txt")),
        tool("c1", "1. inside\n2."),
        assistant("Read it."),
    )
    closed = start_server(tmp_path / "a.db", "--builtin-tools", "on")
    rooted = start_server(
        tmp_path / "b.db", "--builtin-tools", "on", "--attachments-root", str(tmp_path / "shared")
    )
    for server in (closed, rooted):
        client = CopilotClient(connection=server.connection())
        await client.start()
        try:
            if server is closed:
                with pytest.raises(Exception, match="reads no file for its clients"):
                    await open_session(client, None, working_directory=str(inside))
                continue
            with pytest.raises(Exception, match="outside the directory"):
                await open_session(client, None, working_directory=str(tmp_path))
            async with ReplayServer([script]) as model:
                session = await open_session(client, model, working_directory=str(inside))
                assert text(await session.send_and_wait("Read", timeout=60)) == "Read it."
                await session.disconnect()
        finally:
            await client.force_stop()


@pytest.mark.parametrize(
    ("answer", "result"),
    [
        ({"answer": "Option A", "wasFreeform": False}, "User selected: Option A"),
        ({"answer": "Something else", "wasFreeform": True}, "User responded: Something else"),
    ],
)
async def test_b9_ask_user_is_answered_by_the_clients_user_input_handler(
    clients: Clients, tmp_path: Path, answer: dict[str, Any], result: str
) -> None:
    question = {"question": "Which?", "choices": ["Option A", "Option B"]}
    script = conversation(
        user("Ask me"),
        assistant(None, call("c1", "ask_user", **question)),
        tool("c1", result),
        assistant("Thanks."),
    )
    asked: list[Any] = []

    def on_user_input(request: Any, invocation: Any) -> dict[str, Any]:
        asked.append(request)
        return answer

    client = await clients(tmp_path)
    async with ReplayServer([script]) as model:
        session = await open_session(
            client,
            model,
            on_user_input_request=on_user_input,
        )
        reply = await session.send_and_wait("Ask me", timeout=60)
        assert reply is not None and text(reply) == "Thanks."
        await session.disconnect()
    assert asked == [
        {"question": "Which?", "choices": ["Option A", "Option B"], "allowFreeform": True}
    ]
    offered = {t["function"]["name"] for t in model.requests[0]["tools"]}
    assert "ask_user" in offered


async def test_b8_available_and_excluded_tools_choose_among_the_builtin_tools(
    clients: Clients, tmp_path: Path
) -> None:
    client = await clients(tmp_path)
    offered: list[set[str]] = []
    script = [conversation(user("Hi"), assistant("Hello."))]
    for limits in (
        {"available_tools": ["view", "report_intent"]},
        {"excluded_tools": ["bash", "edit"]},
    ):
        async with ReplayServer(script) as model:
            session = await open_session(
                client,
                model,
                **limits,
            )
            await session.send_and_wait("Hi", timeout=60)
            await session.disconnect()
        offered.append({t["function"]["name"] for t in model.requests[0]["tools"]})
    assert offered == [{"view", "report_intent"}, {"view", "create", "grep", "glob"}]


@pytest.mark.parametrize("how", ["disconnect", "stop"])
async def test_b5_a_clients_disconnect_kills_a_running_command_group(
    clients: Clients, tmp_path: Path, how: str
) -> None:
    pid_file = tmp_path / "pid"
    command = f"echo $$ > {pid_file}; sleep 1000 & sleep 1000"
    script = conversation(
        user("Run it"),
        assistant(None, call("c1", "bash", command=command)),
        tool("c1", "never recorded"),
        assistant("Never."),
    )
    client = await clients(tmp_path)
    async with ReplayServer([script]) as model:
        session = await open_session(
            client,
            model,
        )
        await session.send("Run it")
        group = await written_pid(pid_file)
        assert len(processes_in_group(group)) == 3
        if how == "disconnect":
            await session.disconnect()
        else:
            await client.stop()
        assert await gone(group)
