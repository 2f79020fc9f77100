"""`trimtab run`: one prompt, non-interactive, as a subprocess in a pipe."""

from __future__ import annotations

import json
import re

from tests.cli.conftest import Cli, json_lines, no_traceback, tool_call

ANSI = re.compile(r"\x1b\[")


def test_run_prints_only_the_reply_into_a_pipe(cli: Cli) -> None:
    result = cli("run", *cli.scripted("Hello from the script"), "Say hello")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello from the script\n"
    # A pipe gets no colour and no spinner, even with a colour-capable TERM.
    assert not ANSI.search(result.stdout + result.stderr)


def test_run_json_prints_every_event_in_the_wire_shape(cli: Cli) -> None:
    result = cli("run", "--json", *cli.scripted("A reply long enough to stream"), "Hi")

    assert result.returncode == 0, result.stderr
    events = json_lines(result.stdout)
    types = [event["type"] for event in events]
    assert types[0] == "session.start" and types[-1] == "session.idle"
    assert "assistant.message_delta" in types  # ephemeral events are included
    message = next(e for e in events if e["type"] == "assistant.message")
    assert message["data"]["content"] == "A reply long enough to stream"
    assert "contextEpoch" in message and "messageId" in message["data"]  # camelCase
    assert all(value is not None for event in events for value in event.values())


def test_run_exits_non_zero_with_one_line_and_a_hint_on_a_session_error(cli: Cli) -> None:
    error = {"error": {"type": "rate_limit", "message": "slow down", "status_code": 429}}
    result = cli("run", *cli.scripted(error), "Hi")

    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: rate_limit: slow down",
        "hint: the provider is limiting requests: wait a moment and try again",
    ]

    as_json = cli("run", "--json", *cli.scripted(error), "Hi")
    assert as_json.returncode == 1
    assert [e["type"] for e in json_lines(as_json.stdout)][-2:] == ["session.error", "session.idle"]


def test_run_with_demo_tools_clears_the_context_and_prints_the_seeded_reply(cli: Cli) -> None:
    seed = "Reply with exactly FRESH_CONTEXT."
    steps = cli.scripted(tool_call("clear_context", prompt=seed), "FRESH_CONTEXT")
    result = cli("run", "--tools", "demo", "--yes", *steps, f'Call clear_context with "{seed}"')

    assert result.returncode == 0, result.stderr
    assert result.stdout == "FRESH_CONTEXT\n"
    assert f"context cleared (2 messages); fresh context starts with: {seed}" in result.stderr

    session_id = json.loads(cli("sessions", "list", "--json").stdout)[0]["sessionId"]
    events = json_lines(cli("sessions", "events", session_id, "--json").stdout)
    cleared = next(e for e in events if e["type"] == "session.context_cleared")
    assert cleared["data"] == {"messagesCleared": 2, "initialMessage": seed}
    seeds = [e for e in events if e["type"] == "user.message" and e["contextEpoch"] == 1]
    assert [e["data"]["source"] for e in seeds] == ["context_cleared"]


def test_demo_calculator_and_clock_report_results_and_failures(cli: Cli) -> None:
    calls = {
        "tool_calls": [
            {"name": "calculator", "arguments": {"expression": "(2 + 5) * 6"}},
            {"name": "calculator", "arguments": {"expression": "1 / 0"}},
            {"name": "calculator", "arguments": {"expression": "__import__('os')"}},
            {"name": "calculator", "arguments": {"expression": "2 (3)"}},
            {"name": "current_time", "arguments": {"timezone": "UTC"}},
            {"name": "current_time", "arguments": {"timezone": "Mars/Olympus"}},
        ]
    }
    result = cli("run", "--json", "--tools", "demo", "--yes", *cli.scripted(calls, "ok"), "Go")

    assert result.returncode == 0, result.stderr
    events = json_lines(result.stdout)
    asked = [
        r["toolCallId"]
        for e in events
        if e["type"] == "assistant.message"
        for r in e["data"].get("toolRequests") or ()
    ]
    done = {
        e["data"]["toolCallId"]: e["data"] for e in events if e["type"] == "tool.execution_complete"
    }
    # In the order asked: sync handlers run in threads, and complete in any order (spec T3).
    texts = [
        done[c]["result"]["content"] if done[c]["success"] else done[c]["error"]["message"]
        for c in asked
    ]
    # Code is refused by the argument's pattern before it is read; what fits the pattern but
    # is not arithmetic, by the evaluator.
    assert texts[:2] == ["42", "division by zero"]
    assert texts[2].startswith("Invalid tool arguments:\nexpression: String should match pattern")
    assert texts[3] == "unsupported in arithmetic: '2(3)'"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 \(\w+day, UTC\)", texts[4])
    assert texts[5] == "unknown time zone 'Mars/Olympus'"


def test_run_without_yes_in_a_pipe_denies_tools_and_says_so(cli: Cli) -> None:
    steps = cli.scripted(tool_call("calculator", expression="6*7"), "I could not calculate.")
    result = cli("run", "--tools", "demo", *steps, "What is 6*7?")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "I could not calculate.\n"
    assert "calculator denied: nobody can approve it here" in result.stderr
    assert "pass --yes to approve tools" in result.stderr


def test_run_reads_the_prompt_from_stdin(cli: Cli) -> None:
    result = cli("run", "--json", *cli.scripted("Got it"), input="a prompt from a pipe\n")

    assert result.returncode == 0, result.stderr
    user = next(e for e in json_lines(result.stdout) if e["type"] == "user.message")
    assert user["data"]["content"] == "a prompt from a pipe\n"


def test_unused_script_steps_are_noted(cli: Cli) -> None:
    result = cli("run", *cli.scripted("one", "two", "three"), "Hi")

    assert result.returncode == 0
    assert "2 step(s) of the --script file were not used" in result.stderr
    assert no_traceback(result)


def test_out8_run_output_schema_prints_the_result_as_json(cli: Cli) -> None:
    schema = cli.cwd / "city.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
                "required": ["city", "population"],
            }
        )
    )
    steps = cli.scripted(
        tool_call("final_result", city="Oslo"),
        tool_call("final_result", city="Oslo\u001b", population=7),
    )
    result = cli("run", "--output-schema", str(schema), *steps, "A city.")

    assert result.returncode == 0, result.stderr
    # One line of JSON on stdout, control characters escaped (L5); the calls on stderr.
    assert result.stdout == '{"city": "Oslo\\u001b", "population": 7}\n'
    assert json.loads(result.stdout) == {"city": "Oslo\x1b", "population": 7}
    assert "invalid_arguments" in result.stderr and no_traceback(result)


def test_out8_run_output_schema_refuses_a_bad_schema_and_fails_a_run_without_result(
    cli: Cli,
) -> None:
    bad = cli.cwd / "bad.json"
    bad.write_text('{"type": "nothing-real"}')
    refused = cli("run", "--output-schema", str(bad), *cli.scripted("hi"), "x")
    assert refused.returncode == 2 and "not a valid JSON Schema" in refused.stderr
    missing = cli("run", "--output-schema", "no-such.json", *cli.scripted("hi"), "x")
    assert missing.returncode == 2 and "cannot read --output-schema" in missing.stderr

    schema = cli.cwd / "int.json"
    schema.write_text('{"type": "integer"}')
    replies = cli.scripted("one", "two", "three")
    failed = cli("run", "--output-schema", str(schema), *replies, "A number.")
    assert failed.returncode == 1 and failed.stdout == ""
    assert "invalid_output" in failed.stderr and no_traceback(failed)
