"""`--timeout SECONDS` (issue 14, item 6; spec M1): how long a model call of `run` and `chat`
may wait for data, as a flag, `TRIMTAB_TIMEOUT` or `timeout` in trimtab.toml."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.cli.conftest import Cli


@pytest.fixture
def unanswering_url() -> Iterator[str]:
    """An OpenAI-style API root whose server takes connections (the kernel queues them) and
    never answers: a model server that hangs before sending its headers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def test_m1_run_timeout_ends_a_call_to_a_server_that_never_answers(
    cli: Cli, unanswering_url: str
) -> None:
    # Without the flag this would wait two minutes, past the runner's own 60 s limit.
    result = cli("run", "--base-url", unanswering_url, "--timeout", "1", "Hi")

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: timeout: the answer did not start within 1 s",
        "hint: the model did not answer in time: try a longer --timeout, or a smaller model",
    ]


def test_m1_timeout_comes_from_the_flag_the_environment_or_the_file(cli: Cli) -> None:
    def setting(*args: str, env: dict[str, str] | None = None) -> tuple[object, str]:
        result = cli("config", "--json", *args, env=env)
        assert result.returncode == 0, result.stderr
        found = json.loads(result.stdout)["settings"]["timeout"]
        return found["value"], found["source"]

    assert setting() == (None, "default")
    (cli.cwd / "trimtab.toml").write_text("timeout = 600\n")
    assert setting()[0] == 600
    assert setting(env={"TRIMTAB_TIMEOUT": "45"}) == (45, "TRIMTAB_TIMEOUT")
    assert setting("--timeout", "2.5", env={"TRIMTAB_TIMEOUT": "45"}) == (2.5, "--timeout")


def test_m1_timeout_must_be_a_positive_number(cli: Cli) -> None:
    for value in ("0", "-3"):
        result = cli("run", "--timeout", value, "Hi")
        assert result.returncode == 2
        assert "--timeout" in result.stderr
