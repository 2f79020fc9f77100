"""`trimtab chat` in a real pseudo-terminal (pexpect), typed into as a person would."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pexpect  # type: ignore[import-untyped]

from tests.cli.conftest import Cli, tool_call

PROMPT = r"you>(?:\x1b\[0m)? "
"""The chat's prompt, plain or in colour (when NO_COLOR is not set)."""
ASK = r"\[y\]es once / \[a\]lways this session / \[n\]o: "


def _say(child: Any, line: str) -> None:
    """Wait for the prompt, then type a line."""
    child.expect(PROMPT)
    child.sendline(line)


def _leave(child: Any) -> None:
    _say(child, "/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _sessions(cli: Cli) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(cli("sessions", "list", "--json").stdout)
    return records


def test_chat_streams_replies_asks_about_tools_and_shows_events_and_sessions(cli: Cli) -> None:
    steps = cli.scripted(
        "Hello! I am a scripted model.",
        tool_call("calculator", expression="6*7"),
        "It is 42.",
        tool_call("calculator", expression="6*8"),
        tool_call("calculator", expression="6*9"),
        "48 and 54.",
    )
    child = cli.spawn("chat", "--tools", "demo", *steps, env={"NO_COLOR": "1"})
    child.expect(r"new session ([0-9a-f-]{36}) \(scripted, scripted; tools: calculator")
    session_id = child.match.group(1)

    _say(child, "Hi")
    child.expect_exact("Hello! I am a scripted model.")
    _say(child, "What is 6*7?")
    child.expect_exact('⚙ calculator {"expression": "6*7"}')
    child.expect(rf"allow calculator\? {ASK}")
    child.sendline("y")
    child.expect_exact("✓ 42")
    child.expect_exact("It is 42.")
    # "always" approves the tool for the session: the next call is not asked about.
    _say(child, "And 6*8, 6*9?")
    child.expect(ASK)
    child.sendline("a")
    child.expect_exact("✓ 48")
    child.expect_exact("✓ 54")
    child.expect_exact("48 and 54.")
    assert "allow calculator" not in child.before

    _say(child, "/events")
    child.expect(r"tool\.execution_complete +calculator success: 54")
    _say(child, "/sessions")
    child.expect_exact(f"* {session_id}")
    _leave(child)
    assert [r["sessionId"] for r in _sessions(cli)] == [session_id]


def test_chat_resume_continues_the_last_session(cli: Cli) -> None:
    first = cli.spawn("chat", *cli.scripted("First answer"))
    first.expect(r"new session ([0-9a-f-]{36})")
    session_id = first.match.group(1)
    _say(first, "Remember this")
    first.expect_exact("First answer")
    _leave(first)

    again = cli.spawn("chat", "--resume", *cli.scripted("Second answer"))
    again.expect_exact(f"resumed session {session_id}")
    _say(again, "Do you remember?")
    again.expect_exact("Second answer")
    _leave(again)

    [resumed] = _sessions(cli)
    assert resumed["sessionId"] == session_id
    # Each chat logged a session.start or session.resume, then five events for its turn.
    assert resumed["summary"] == "Remember this" and resumed["eventCount"] == 12


def test_clear_asks_the_model_to_clear_only_with_the_demo_tools(cli: Cli) -> None:
    plain = cli.spawn("chat", *cli.scripted())
    _say(plain, "/clear Start over")
    plain.expect_exact("/clear works through the clear_context tool, which this session lacks")
    _leave(plain)

    seed = "Summarise: we chose SQLite."
    steps = cli.scripted("Noted.", tool_call("clear_context", prompt=seed), "Fresh start.")
    child = cli.spawn("chat", "--tools", "demo", *steps)
    _say(child, "We chose SQLite.")
    child.expect_exact("Noted.")
    _say(child, f"/clear {seed}")
    # The person asked for it: the clear_context call with that prompt is not asked about again.
    child.expect_exact("clear_context: approved (you asked for /clear)")
    child.expect_exact(f"context cleared (4 messages); fresh context starts with: {seed}")
    child.expect_exact("Fresh start.")
    _leave(child)


def test_ctrl_c_stops_a_slow_reply_and_no_rejects_a_tool(cli: Cli) -> None:
    steps = cli.scripted(
        {"reply": "too slow", "delay": 30},
        tool_call("calculator", expression="1+1"),
        "Still here.",
    )
    child = cli.spawn("chat", "--tools", "demo", *steps)
    _say(child, "Take your time")
    child.expect_exact("thinking")  # the spinner, on a terminal
    child.sendintr()
    child.expect_exact("(aborted)")
    # The interrupted request leaves the window (spec L6): it is not answered later.
    child.expect_exact("(the interrupted request is left out of the conversation)")
    _say(child, "/events")
    child.expect(r"session\.truncated")
    _say(child, "Add 1+1")
    child.expect(ASK)
    child.sendline("n")
    child.expect_exact("rejected: The user rejected this tool call.")
    # A rejection ends the run (spec O2); the chat goes on.
    _say(child, "/events")
    child.expect(r"permission\.completed +denied-interactively-by-user")
    _say(child, "Still there?")
    child.expect_exact("Still here.")
    _leave(child)


def test_run_on_a_terminal_asks_before_a_tool_and_streams_the_reply(cli: Cli) -> None:
    steps = cli.scripted(tool_call("current_time", timezone="UTC"), "Time told.")
    child = cli.spawn("run", "--tools", "demo", *steps, "What time is it?")
    child.expect(rf"allow .*current_time.*\? {ASK}")
    child.sendline("y")
    child.expect(r"✓ \d{4}-\d\d-\d\dT")
    child.expect_exact("Time told.")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_s5_the_chat_history_is_as_private_as_the_sessions(tmp_path: Path) -> None:
    import readline

    from trimtab.cli.chat import _line_editing

    home = tmp_path / "new" / "home"
    save = _line_editing(home)
    assert save is not None
    readline.add_history("a prompt nobody else may read")
    previous = os.umask(0o022)
    try:
        save()
    finally:
        os.umask(previous)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "chat_history").stat().st_mode) == 0o600
