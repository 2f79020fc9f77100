"""Settings (flags > TRIMTAB_* > trimtab.toml > defaults), `trimtab config`, and the choice
of a provider when none is named. A fake Ollama server on a free port stands in for the real
one: tests never touch 127.0.0.1:11434."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.cli.conftest import Cli
from tests.fake_ollama import FakeOllama


def _selected(result: Any) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    selected: dict[str, Any] = json.loads(result.stdout)["selected"]
    return selected


def test_selection_order_keys_then_ollama_then_the_embedded_model(
    cli: Cli, ollama: FakeOllama, not_ollama: FakeOllama
) -> None:
    both_keys = {"OPENAI_API_KEY": "sk-o", "ANTHROPIC_API_KEY": "sk-a"}
    up: dict[str, str] = {"TRIMTAB_OLLAMA_URL": ollama.url}
    down: dict[str, str] = {}
    other = {"TRIMTAB_OLLAMA_URL": not_ollama.url}
    cases: list[tuple[dict[str, str], list[str], str, str | None]] = [
        ({**both_keys, **up}, [], "openai", "gpt-4.1-mini"),
        ({"ANTHROPIC_API_KEY": "sk-a", **up}, [], "anthropic", "claude-sonnet-4-5"),
        (up, [], "ollama", "fake-model:1b"),  # the first model the server has
        (down, [], "local", None),
        (other, [], "local", None),
        ({**both_keys, **up}, ["--provider", "ollama", "--model", "m"], "ollama", "m"),
        ({**both_keys, "TRIMTAB_PROVIDER": "anthropic"}, [], "anthropic", "claude-sonnet-4-5"),
        (down, ["--base-url", "http://127.0.0.1:9/v1"], "openai", "gpt-4.1-mini"),
    ]
    started = [cli.start("config", "--json", *flags, env=env) for env, flags, _, _ in cases]
    for process, (env, flags, name, model) in zip(started, cases, strict=True):
        selected = _selected(cli.finish(process))
        assert (selected["provider"], selected["model"]) == (name, model), (env, flags)


def test_an_automatic_choice_is_announced_and_ollama_is_used_end_to_end(
    cli: Cli, ollama: FakeOllama
) -> None:
    result = cli("run", "Hi there", env={"TRIMTAB_OLLAMA_URL": ollama.url})

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello from Ollama\n"
    assert result.stderr == (
        f"trimtab: using ollama with model fake-model:1b: Ollama answers at {ollama.url};"
        " choose another with --provider\n"
    )
    [request] = ollama.chat_requests
    assert request["model"] == "fake-model:1b" and request["stream"] is True
    assert request["messages"][-1] == {"role": "user", "content": "Hi there"}


def test_config_shows_each_value_and_where_it_comes_from(cli: Cli) -> None:
    (cli.cwd / "trimtab.toml").write_text(
        'provider = "openai"\nmodel = "from-file"\nsystem_message = "Be brief."\n'
        'script = "replies.json"\n'
    )
    env = {"TRIMTAB_MODEL": "from-env", "TRIMTAB_API_KEY": "sk-secret-value"}

    result = cli("config", "--json", "--provider", "ollama", env=env)

    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    settings = {name: (s["value"], s["source"]) for name, s in document["settings"].items()}
    toml = str(cli.cwd / "trimtab.toml")
    assert settings["provider"] == ("ollama", "--provider")
    assert settings["model"] == ("from-env", "TRIMTAB_MODEL")
    assert settings["system_message"] == ("Be brief.", toml)
    assert settings["script"] == (str(cli.cwd / "replies.json"), toml)  # relative to the file
    assert settings["api_key"] == ("(set)", "TRIMTAB_API_KEY")
    assert settings["store"] == (str(cli.home / "trimtab.db"), "default")
    assert document["configFile"] == toml

    text = cli("config", env=env).stdout
    assert "sk-secret-value" not in result.stdout + text
    assert re.search(r"^model +from-env +TRIMTAB_MODEL$", text, re.MULTILINE)
    assert f"config file  {toml}" in text


def test_a_config_file_in_trimtab_home_drives_a_run(cli: Cli) -> None:
    cli.home.mkdir()
    (cli.home / "replies.json").write_text(json.dumps(["Configured by file"]))
    (cli.home / "trimtab.toml").write_text('provider = "scripted"\nscript = "replies.json"\n')

    result = cli("run", "Hi")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Configured by file\n"
    assert result.stderr == ""  # a configured provider is not announced
