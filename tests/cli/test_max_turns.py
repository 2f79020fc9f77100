"""`--max-turns N` (issue 14, item 5; spec E5): how many model calls one run of `run` or
`chat` may make, as a flag, `TRIMTAB_MAX_TURNS` or `max_turns` in trimtab.toml."""

from __future__ import annotations

import json

import pexpect  # type: ignore[import-untyped]

from tests.cli.conftest import Cli, json_lines, tool_call
from tests.cli.test_chat import PROMPT


def test_e5_run_max_turns_ends_a_model_that_keeps_calling_tools(cli: Cli) -> None:
    """Before `--max-turns`, the flag was a usage error, and the run had no cap at all."""
    calls = [tool_call("calculator", expression="1+1")] * 5
    steps = cli.scripted(*calls)

    result = cli("run", "--json", "--tools", "demo", "--yes", "--max-turns", "3", *steps, "Go")

    assert result.returncode == 1
    events = json_lines(result.stdout)
    assert [e["type"] for e in events].count("assistant.turn_start") == 3
    error = next(e for e in events if e["type"] == "session.error")
    assert error["data"]["errorType"] == "max_turns"
    assert events[-1]["type"] == "session.idle"
    assert "2 step(s) of the --script file were not used" in result.stderr


def test_e5_the_max_turns_error_says_what_to_do(cli: Cli) -> None:
    """Before `--max-turns`, the flag was a usage error, and no hint named it."""
    steps = cli.scripted(tool_call("calculator", expression="1+1"))

    result = cli("run", "--tools", "demo", "--yes", "--max-turns", "1", *steps, "Go")

    assert result.returncode == 1
    assert result.stderr.splitlines()[-2:] == [
        "error: max_turns: the run made 1 model calls, its limit (max_turns); send again to go on",
        "hint: the model kept calling tools: send again to go on, or raise --max-turns",
    ]


def test_e5_max_turns_comes_from_the_flag_the_environment_or_the_file(cli: Cli) -> None:
    """Before `max_turns` was a setting, `trimtab config` had none to show."""

    def setting(*args: str, env: dict[str, str] | None = None) -> tuple[object, str]:
        result = cli("config", "--json", *args, env=env)
        assert result.returncode == 0, result.stderr
        found = json.loads(result.stdout)["settings"]["max_turns"]
        return found["value"], found["source"]

    assert setting() == (100, "default")
    (cli.cwd / "trimtab.toml").write_text("max_turns = 40\n")
    assert setting()[0] == 40
    assert setting(env={"TRIMTAB_MAX_TURNS": "20"}) == (20, "TRIMTAB_MAX_TURNS")
    assert setting("--max-turns", "7", env={"TRIMTAB_MAX_TURNS": "20"}) == (7, "--max-turns")


def test_e5_max_turns_must_be_a_positive_number(cli: Cli) -> None:
    """Before `--max-turns`, the flag itself was refused as unknown, whatever its value."""
    for value in ("0", "-3", "many"):
        result = cli("run", "--max-turns", value, "Hi")
        assert result.returncode == 2
        first = result.stderr.splitlines()[0]
        assert "invalid value" in first.lower() and "--max-turns" in first, first


def test_e5_chat_max_turns_applies_to_new_and_resumed_sessions(cli: Cli) -> None:
    """Before `--max-turns`, the flag was a usage error, and a chat's run had no cap."""
    calls = [tool_call("calculator", expression="1+1")] * 3
    first = cli.spawn("chat", "--tools", "demo", "--yes", "--max-turns", "2", *cli.scripted(*calls))
    first.expect(PROMPT)
    first.sendline("Go")
    first.expect_exact("the run made 2 model calls, its limit (max_turns)")
    first.expect(PROMPT)
    first.sendline("/exit")
    first.expect(pexpect.EOF)

    again = cli.spawn(
        "chat", "--resume", "--tools", "demo", "--yes", "--max-turns", "1", *cli.scripted(*calls)
    )
    again.expect(PROMPT)
    again.sendline("Go on")
    again.expect_exact("the run made 1 model calls, its limit (max_turns)")
    again.expect(PROMPT)
    again.sendline("/exit")
    again.expect(pexpect.EOF)
