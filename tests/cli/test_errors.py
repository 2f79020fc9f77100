"""Failures as a person meets them: one line, a hint, an exit code, no traceback."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from typing import Any

from tests.cli.conftest import SRC, Cli, no_traceback
from tests.requirements import unmet

BAD_USAGE = [
    (
        ["run", "--provider", "bogus", "Hi"],
        "error: invalid value 'bogus' for --provider: expected one of openai, anthropic,"
        " ollama, local",
    ),
    (["run", "--tools", "all", "Hi"], "error: invalid value 'all' for --tools:"),
    (["run", "--frobnicate", "Hi"], "error: No such option"),
    (["sessions", "frob"], "error: No such command"),
    (["run", "--provider", "scripted", "Hi"], "error: the scripted provider needs a script"),
    (["run"], "error: the prompt is empty"),
]


def test_bad_usage_exits_2_with_one_line_and_a_hint(cli: Cli) -> None:
    results = cli.many(*(args for args, _ in BAD_USAGE))
    for (args, message), result in zip(BAD_USAGE, results, strict=True):
        lines = result.stderr.splitlines()
        assert result.returncode == 2, args
        assert len(lines) == 2 and lines[0].startswith(message), (args, result.stderr)
        assert lines[1].startswith("hint: "), args
        assert no_traceback(result), args


def test_a_bad_environment_variable_is_named(cli: Cli) -> None:
    result = cli("run", "Hi", env={"TRIMTAB_PROVIDER": "nope"})

    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (
        "error: invalid value 'nope' for TRIMTAB_PROVIDER: expected one of openai, anthropic,"
        " ollama, local"
    )


def test_a_bad_config_file_is_named(cli: Cli) -> None:
    (cli.cwd / "trimtab.toml").write_text('modle = "gpt"\n')

    result = cli("config")

    assert result.returncode == 2
    assert f"error: {cli.cwd / 'trimtab.toml'}: unknown setting 'modle'" in result.stderr
    assert (
        "hint: known settings: api_key, base_url, debug, max_turns, mcp_servers," in result.stderr
    )


def test_an_embedded_model_that_cannot_run_is_one_line_with_a_hint(cli: Cli) -> None:
    result = cli("run", "--provider", "local", "--model", str(cli.cwd / "missing.gguf"), "Hi")

    # Without llama-cpp-python the provider cannot start; with it, the weights are missing.
    # The CLI runs this checkout's sources, so its install hint names the checkout.
    assert result.returncode == 1
    error, hint = result.stderr.splitlines()
    assert error in (
        "error: cannot use provider local: provider type 'local' needs llama-cpp-python:"
        f" pip install -e '{SRC.parent}[local]'",
        f"error: provider_unavailable: model file not found: {cli.cwd / 'missing.gguf'}",
    )
    assert hint.startswith("hint: ") and "--provider" in hint
    assert result.stdout == ""


def test_a_store_that_cannot_be_opened_is_one_line(cli: Cli) -> None:
    (cli.cwd / "file").write_text("")
    store = cli.cwd / "file" / "trimtab.db"

    result = cli("run", "--store", str(store), *cli.scripted("Hello"), "Hi")

    assert result.returncode == 1
    assert result.stderr.startswith(f"error: cannot open the session store {store}: ")
    assert result.stderr.splitlines()[1] == "hint: check --store, TRIMTAB_STORE or TRIMTAB_HOME"


def test_unexpected_errors_hide_the_traceback_unless_debug(cli: Cli) -> None:
    run = cli("run", "--json", *cli.scripted("Hi"), "Hi")
    session_id = json.loads(run.stdout.splitlines()[0])["data"]["sessionId"]
    # A log row no event model accepts: an error the CLI cannot foresee.
    with sqlite3.connect(cli.home / "trimtab.db") as db:
        db.execute('UPDATE events SET body = \'{"type": "no.such_event"}\'')

    plain, debug = cli.many(
        ["sessions", "events", session_id], ["sessions", "events", session_id, "--debug"]
    )
    assert plain.returncode == 1
    assert plain.stderr.startswith("error: unexpected ValidationError: ")
    assert plain.stderr.splitlines()[-1] == "hint: run again with --debug to see the traceback"
    assert no_traceback(plain)

    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr


def test_entry_points_python_m_the_installed_script_and_serve(cli: Cli) -> None:
    version, serve_help = cli.many(["--version"], ["serve", "--help"])
    assert version.stdout.startswith("trimtab, version ")
    # `trimtab serve` hands its arguments to the server's own parser.
    assert serve_help.returncode == 0 and serve_help.stdout.startswith("Usage: trimtab serve")
    script = shutil.which("trimtab")
    if script is None:
        unmet("the trimtab script is not installed (pip install -e .)")
    installed = subprocess.run(
        [script, "--version"], capture_output=True, text=True, env=cli.env, check=True
    )
    assert installed.stdout == version.stdout


def test_input_that_is_not_utf8_or_too_large_is_a_usage_error(cli: Cli) -> None:
    # Read with a limit (a pipe from /dev/zero would fill the memory) and decoded strictly.
    (cli.cwd / "trimtab.toml").write_bytes(b'model = "\xff"\n')
    config = cli("config")
    (cli.cwd / "trimtab.toml").unlink()
    script = cli.cwd / "s.json"
    script.write_bytes(b'["hi \xff"]')
    results: list[subprocess.CompletedProcess[Any]] = [
        config,
        subprocess.run(
            [sys.executable, "-m", "trimtab", "run", "-"],
            input=b"hi \xff",
            capture_output=True,
            cwd=cli.cwd,
            env=cli.env,
            timeout=60,
        ),
        cli("run", "--provider", "scripted", "--script", str(script), "hi"),
    ]
    with open("/dev/zero", "rb") as zero:
        results.append(
            subprocess.run(
                [sys.executable, "-m", "trimtab", "run", "-"],
                stdin=zero,
                capture_output=True,
                cwd=cli.cwd,
                env=cli.env,
                timeout=60,
            )
        )
    for result in results:
        stderr = result.stderr if isinstance(result.stderr, str) else result.stderr.decode()
        assert result.returncode == 2, stderr
        assert "not UTF-8 text" in stderr or "larger than 16 MiB" in stderr, stderr
        assert "Traceback" not in stderr
