"""`trimtab sessions list | show | events | prune | rm`, as a subprocess."""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import threading
from typing import Any

from tests.cli.conftest import Cli, json_lines, no_traceback, tool_call
from trimtab.events import SessionConfigData, SessionStartData, SessionStartEvent
from trimtab.providers import ProviderConfig
from trimtab.store import open_store


def _run(cli: Cli, prompt: str, *steps: object) -> str:
    """Run one prompt with demo tools approved; returns the new session's id."""
    result = cli("run", "--json", "--tools", "demo", "--yes", *cli.scripted(*steps), prompt)
    assert result.returncode == 0, result.stderr
    return str(json_lines(result.stdout)[0]["data"]["sessionId"])


def test_list_shows_a_table_and_json_newest_first(cli: Cli) -> None:
    empty, empty_json = cli.many(["sessions", "list"], ["sessions", "list", "--json"])
    assert empty.returncode == 0 and empty.stdout == ""
    assert "no sessions yet" in empty.stderr
    assert json.loads(empty_json.stdout) == []

    first = _run(cli, "First question", "First answer")
    second = _run(cli, "Second question", "Second answer")

    listed, listed_json = cli.many(["sessions", "list"], ["sessions", "list", "--json"])
    table = listed.stdout.splitlines()
    assert table[0].split() == ["ID", "UPDATED", "EVENTS", "STATUS", "FIRST", "MESSAGE"]
    assert [line.split()[0] for line in table[1:]] == [second, first]
    assert table[1].endswith("Second question")
    records = json.loads(listed_json.stdout)
    assert [r["sessionId"] for r in records] == [second, first]
    assert records[0]["summary"] == "Second question" and records[0]["eventCount"] == 6
    assert records[0]["leaseOwner"] is None


def test_show_and_events_accept_an_id_prefix(cli: Cli) -> None:
    steps = (tool_call("calculator", expression="6*7"), "It is 42.")
    session_id = _run(cli, "What is 6*7?", *steps)
    prefix = session_id[:8]

    show, show_json, events_text, events_json = cli.many(
        ["sessions", "show", prefix],
        ["sessions", "show", prefix, "--json"],
        ["sessions", "events", prefix],
        ["sessions", "events", prefix, "--json"],
    )
    assert f"id             {session_id}" in show.stdout
    assert "tools          calculator, current_time, clear_context" in show.stdout
    assert "usage          2 model calls," in show.stdout
    details = json.loads(show_json.stdout)
    assert details["sessionId"] == session_id and details["config"]["model"] == "scripted"
    assert details["usage"]["modelCalls"] == 2 and details["contextClears"] == 0

    table = events_text.stdout.splitlines()
    assert table[0].split() == ["#", "TIME", "TYPE", "DETAIL"]
    assert any("tool.execution_complete  calculator success: 42" in line for line in table)
    events = json_lines(events_json.stdout)
    assert len(events) == len(table) - 1
    assert [e["type"] for e in events][:2] == ["session.start", "user.message"]


def test_rm_deletes_and_unknown_ids_are_one_line_with_a_hint(cli: Cli) -> None:
    session_id = _run(cli, "Hi", "Hello")

    removed = cli("sessions", "rm", session_id[:6])
    assert removed.returncode == 0 and removed.stdout == f"deleted {session_id}\n"

    commands = (["sessions", command, session_id] for command in ("rm", "show", "events"))
    for missing in cli.many(*commands):
        assert missing.returncode == 1
        assert missing.stderr.splitlines() == [
            f"error: no session with id '{session_id}'",
            "hint: see 'trimtab sessions list'",
        ]


def test_events_follow_prints_new_events_until_ctrl_c(cli: Cli) -> None:
    session_id = _run(cli, "Hi", "Hello")
    follower = cli.popen(
        "sessions", "events", session_id, "--json", "--follow",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    lines = _lines_of(follower)
    try:
        first = [json.loads(lines.get(timeout=15))["type"] for _ in range(6)]
        assert first[0] == "session.start" and first[-1] == "assistant.turn_end"
        # Another process continues the session; the follower sees its events arrive.
        chat = cli("chat", "--resume", *cli.scripted("Hello again"), input="More\n/exit\n")
        assert chat.returncode == 0, chat.stderr
        more = [json.loads(lines.get(timeout=15))["type"] for _ in range(6)]
        assert more[0] == "session.resume" and more[-1] == "assistant.turn_end"
    finally:
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=10)
    assert follower.stderr is not None
    assert follower.returncode == 0 and "Traceback" not in follower.stderr.read()


def _lines_of(process: subprocess.Popen[str]) -> queue.SimpleQueue[str]:
    """The process's stdout lines, read on a thread so that a test can wait with a timeout."""
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()
    stdout = process.stdout
    assert stdout is not None

    def pump() -> None:
        for line in iter(stdout.readline, ""):
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def test_rm_refuses_a_session_in_use_and_ctrl_c_ends_a_run_cleanly(cli: Cli) -> None:
    script = cli.scripted({"reply": "slow", "delay": 30})
    busy = cli.start("run", "--json", *script, "Take your time")
    try:
        # session.start is printed once the session exists, and so once its lease is held.
        start = json.loads(_lines_of(busy).get(timeout=30))
        session_id = start["data"]["sessionId"]
        refused = cli("sessions", "rm", session_id)
        assert refused.returncode == 1 and no_traceback(refused)
        error, hint = refused.stderr.splitlines()
        assert error.startswith(f"error: session {session_id} is in use by ")
        assert hint.startswith("hint: close it there first, or pass --force; a process that")
    finally:
        busy.send_signal(signal.SIGINT)
        busy.wait(timeout=30)
    # Ctrl-C aborts the run: the shell's exit code for SIGINT, no traceback, lease released.
    assert busy.stderr is not None
    assert busy.returncode == 130 and "Traceback" not in busy.stderr.read()
    assert cli("sessions", "rm", session_id).stdout == f"deleted {session_id}\n"


def test_issue33_show_says_what_the_provider_settings_are(cli: Cli) -> None:
    providers: list[dict[str, Any]] = [
        {"type": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-never-shown"},
        {"type": "openai", "wire_api": "responses", "max_retries": 1, "timeout": 30},
        {"type": "anthropic", "headers": {"X-Team": "a", "X-Api-Key": "secret"}},
        {"type": "local", "model_path": "/models/m.gguf"},
    ]

    ids = [f"s{number}" for number in range(len(providers))]

    async def create() -> None:
        # The logs as the runtime writes them (the config without secrets), with no provider
        # built: the embedded model's and Anthropic's packages need not be installed.
        store = open_store(cli.home / "trimtab.db")
        for session_id, provider in zip(ids, providers, strict=True):
            config = SessionConfigData(
                model="m", provider=ProviderConfig.model_validate(provider).public_dict()
            )
            start = SessionStartData(session_id=session_id, config=config)
            await store.create(session_id, [SessionStartEvent(data=start)])
        await store.close()

    asyncio.run(create())
    shown = cli.many(*(["sessions", "show", session_id] for session_id in ids))

    lines = []
    for result in shown:
        assert result.returncode == 0, result.stderr
        [line] = [line for line in result.stdout.splitlines() if line.startswith("provider")]
        lines.append(line.removeprefix("provider").strip())
    assert lines == [
        "openai at http://127.0.0.1:9/v1, Chat Completions API, 2 retries",
        "openai, Responses API, timeout 30 s, 1 retry",
        "anthropic, 2 retries, headers X-Team",
        "local, model file /models/m.gguf",
    ]


def test_x8_prune_drops_the_events_before_the_window_and_the_session_goes_on(cli: Cli) -> None:
    steps = (tool_call("clear_context", prompt="Say FRESH."), "FRESH")
    session_id = _run(cli, "Start over please", *steps)
    before = json_lines(cli("sessions", "events", session_id, "--json").stdout)
    cleared = next(i for i, e in enumerate(before) if e["type"] == "session.context_cleared")

    pruned = cli("sessions", "prune", session_id[:8])
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout == (
        f"pruned {session_id}: {cleared - 1} events before its window"
        f" (event {cleared} holds what they were)\n"
    )
    after = json_lines(cli("sessions", "events", session_id, "--json").stdout)
    assert [e["type"] for e in after[:3]] == [
        "session.start",
        "session.pruned",
        "session.context_cleared",
    ]
    assert len(after) == len(before) - cleared + 2
    assert after[1]["data"]["eventsPruned"] == cleared - 1
    again, everything = cli.many(["sessions", "prune", session_id], ["sessions", "prune", "--all"])
    assert again.stdout == f"nothing to prune in {session_id}\n"
    assert everything.returncode == 0 and f"nothing to prune in {session_id}" in everything.stdout
    listed = json.loads(cli("sessions", "list", "--json").stdout)
    assert listed[0]["eventCount"] == len(before)  # positions stay
    neither = cli("sessions", "prune")
    assert neither.returncode == 2
    assert "name the sessions to prune, or pass --all" in neither.stderr
