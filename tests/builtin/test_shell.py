"""The built-in `bash` (spec B5-B7): output and exit code as the CLI shows them, a process
group killed on timeout, abort and disconnect, bounded output, the environment, permission
requests and denials."""

from __future__ import annotations

import asyncio
import json
import os
import time
import tracemalloc
from pathlib import Path

import pytest

from tests.builtin.conftest import (
    gone,
    none_running,
    processes_in_group,
    run_calls,
    written_pid,
)
from tests.conftest import Recorder
from trimtab import Client, PermissionDecision, PermissionHandler, builtin_tools
from trimtab.builtin import command_environment
from trimtab.testing import ScriptedModel, tool_call


def bash(command: str, description: str = "") -> tuple[str, dict[str, str]]:
    return ("bash", {"command": command, "description": description})


async def test_b5_output_and_exit_code_read_as_the_cli_shows_them(
    client: Client, root: Path
) -> None:
    calls = await run_calls(
        client,
        builtin_tools(root),
        bash("echo hello && echo world"),
        bash("echo error_msg >&2; sleep 0.1; echo ok"),
        bash("exit 3"),
        bash("printf 'no newline'; kill -9 $$"),
        bash("pwd"),
    )
    assert calls.outcomes == [
        ("success", "hello\nworld\n<exited with exit code 0>"),
        ("success", "error_msg\nok\n<exited with exit code 0>"),
        ("success", "<exited with exit code 3>"),
        ("success", "no newline\n<exited with exit code 137>"),
        ("success", f"{root}\n<exited with exit code 0>"),
    ]


async def test_b5_a_command_past_its_time_is_killed_with_its_whole_group(
    client: Client, root: Path
) -> None:
    """It ignores SIGTERM, and so does the child it started: SIGKILL after the grace."""
    command = "trap '' TERM; echo $$; (trap '' TERM; sleep 1000) & sleep 1000"
    started = time.monotonic()
    calls = await run_calls(client, builtin_tools(root, shell_timeout=0.5), bash(command))
    assert time.monotonic() - started < 10
    assert calls.outcome == "timeout"
    group = int(calls.text.split("\n")[0])
    assert calls.text == (
        f"{group}\n<timed out after 0.5 s: the command and its processes were killed>"
    )
    assert await gone(group)


@pytest.mark.parametrize("how", ["timeout", "abort"])
async def test_b5_a_stopped_command_gets_sigterm_first_and_may_clean_up(
    client: Client, root: Path, tmp_path: Path, how: str
) -> None:
    cleaned = tmp_path / "cleaned"
    command = f"trap 'echo done > {cleaned}; exit 0' TERM; echo started; sleep 1000 & wait"
    model = ScriptedModel([tool_call("bash", json.dumps({"command": command}))])
    timeout = 0.5 if how == "timeout" else 60
    session = await client.create_session(
        provider=model,
        tools=builtin_tools(root, shell_timeout=timeout),
        on_permission_request=PermissionHandler.approve_all,
    )
    recorder = Recorder(session)
    if how == "timeout":
        model.add("done")
        await session.send_and_wait("go", timeout=30)
    else:
        await session.send("go")
        await recorder.wait_for("tool.execution_start")
        await asyncio.sleep(0.3)  # bash has set its trap
        await session.abort()
        await recorder.wait_for("session.idle")
    (complete,) = recorder.of("tool.execution_complete")
    assert complete.data.outcome == ("timeout" if how == "timeout" else "cancelled")
    assert cleaned.read_text() == "done\n"


async def test_b5_what_a_command_leaves_running_does_not_outlive_its_call(
    client: Client, root: Path
) -> None:
    calls = await run_calls(client, builtin_tools(root), bash("sleep 1000 & echo $$"))
    assert calls.outcome == "success"
    group = int(calls.text.split("\n")[0])
    assert await gone(group)


@pytest.mark.parametrize("how", ["abort", "disconnect"])
async def test_b5_abort_and_disconnect_kill_the_command_group(
    client: Client, root: Path, tmp_path: Path, how: str
) -> None:
    pid_file = tmp_path / "pid"
    command = f"echo $$ > {pid_file}; sleep 1000 & sleep 1000"
    model = ScriptedModel([tool_call("bash", json.dumps({"command": command}))])
    session = await client.create_session(
        provider=model,
        tools=builtin_tools(root),
        on_permission_request=PermissionHandler.approve_all,
    )
    recorder = Recorder(session)
    await session.send("go")
    group = await written_pid(pid_file)
    assert len(processes_in_group(group)) >= 2
    if how == "abort":
        await session.abort()
        await recorder.wait_for("session.idle")
        (complete,) = recorder.of("tool.execution_complete")
        assert complete.data.outcome == "cancelled"
    else:
        await session.disconnect()
    assert await gone(group)


async def test_b5_huge_output_keeps_its_head_and_tail_in_bounded_memory(
    client: Client, root: Path
) -> None:
    command = "echo FIRST; head -c 50000000 /dev/zero | tr '\\0' x; echo; echo LAST"
    tracemalloc.start()
    try:
        calls = await run_calls(client, builtin_tools(root, output_limit=8192), bash(command))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert calls.outcome == "success"
    assert calls.text.startswith("FIRST\nxxx")
    assert calls.text.endswith("xxx\nLAST\n<exited with exit code 0>")
    assert "bytes of output cut ...]" in calls.text
    assert len(calls.text) < 8192 + 200
    assert peak < 4_000_000, peak  # 50 MB went through, never held


async def test_b5_a_denied_command_does_not_run(client: Client, root: Path) -> None:
    calls = await run_calls(
        client,
        builtin_tools(root),
        bash("touch ran.txt", "Touch a file"),
        decide=lambda request: PermissionDecision(kind="user-not-available"),
    )
    assert calls.outcomes == [
        ("denied", "Permission denied and could not request permission from user")
    ]
    assert not (root / "ran.txt").exists()
    (request,) = calls.asked
    assert request.model_dump(by_alias=True, exclude_none=True) | {"toolDescription": ""} == {
        "kind": "shell",
        "toolName": "bash",
        "toolDescription": "",
        "args": {"command": "touch ran.txt", "description": "Touch a file"},
        "toolCallId": request.tool_call_id,
        "requestId": request.request_id,
        "intention": "Touch a file",
        "fullCommandText": "touch ran.txt",
        "commands": [{"identifier": "touch", "readOnly": False}],
        "possiblePaths": [],
        "possibleUrls": [],
        "hasWriteFileRedirection": False,
        "canOfferSessionApproval": False,
    }


async def test_b7_a_rejected_command_does_not_run_and_ends_the_run(
    client: Client, root: Path
) -> None:
    calls = await run_calls(
        client,
        builtin_tools(root),
        bash("touch ran.txt"),
        decide=lambda request: PermissionDecision(kind="reject"),
        answers=False,
    )
    assert calls.outcome == "rejected" and not (root / "ran.txt").exists()


def test_b7_a_shell_request_names_commands_paths_urls_and_redirections() -> None:
    from trimtab.builtin._shell import shell_request

    request = shell_request(
        "FOO=1 ./build.sh src/a.c > out/log.txt 2>&1 && curl -s https://example.com/x"
        " | tee /dev/null",
        "",
    )
    assert request["intention"] == request["full_command_text"]
    assert [c["identifier"] for c in request["commands"]] == ["./build.sh", "curl", "tee"]
    assert request["possible_paths"] == ["src/a.c", "out/log.txt", "/dev/null"]
    assert request["possible_urls"] == [{"url": "https://example.com/x"}]
    assert request["has_write_file_redirection"] is True
    assert shell_request("ls > /dev/null", "")["has_write_file_redirection"] is False
    assert shell_request("echo 'unclosed", "")["commands"] == [
        {"identifier": "echo", "read_only": False}
    ]


def test_b6_commands_get_the_environment_without_credentials() -> None:
    environment = command_environment(
        {
            "PATH": "/bin",
            "HOME": "/home/u",
            "OPENAI_API_KEY": "sk-1",
            "ANTHROPIC_API_KEY": "sk-2",
            "GITHUB_TOKEN": "ghp",
            "PGPASSWORD": "pw",
            "AWS_SECRET_ACCESS_KEY": "a",
            "TRIMTAB_STORE": "postgresql://u:pw@h/db",
            "OPENAI_CUSTOM_HEADERS": "Authorization: x",
            "LANG": "C.UTF-8",
        }
    )
    assert environment == {
        "PATH": "/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "GIT_TERMINAL_PROMPT": "0",
    }


async def test_b6_a_command_does_not_see_the_servers_keys(
    client: Client, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("TRIMTAB_VISIBLE_CHECK", "1")
    calls = await run_calls(
        client,
        builtin_tools(root),
        bash('echo "[$OPENAI_API_KEY][$TRIMTAB_VISIBLE_CHECK][$PAGER]"'),
    )
    assert calls.outcomes == [("success", "[][][cat]\n<exited with exit code 0>")]


async def test_b5_a_call_cancelled_while_bash_starts_kills_its_group(root: Path) -> None:
    """Cancelled between bash's fork and the moment its pipes are connected: asyncio kills
    bash alone, so the group is killed once the start has finished. Bash may be killed before
    it runs a line, so what is checked is that nothing it could have started is left: its
    processes are found by a duration no other process uses."""
    from typing import Any, cast

    from trimtab._tools import ToolInvocation

    marker = f"1000.{os.getpid()}{time.monotonic_ns() % 10**6}"
    (tool,) = builtin_tools(root, names=["bash"])
    arguments = {"command": f"sleep {marker} & sleep {marker}"}
    params = tool.validate(arguments)
    invocation = ToolInvocation("s", "c", "bash", arguments, cast(Any, None))
    call = asyncio.ensure_future(tool.run(params, invocation))  # type: ignore[arg-type]
    for _ in range(2):
        await asyncio.sleep(0)  # bash is forked; its pipes are being connected
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await none_running(marker)
