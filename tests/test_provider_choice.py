"""Spec S6: `Client()` given no provider chooses one as the command line does (an API key, then
a running Ollama, then the embedded model), once per client, and says so in one line.

Each case runs a small program in a subprocess whose environment the test controls: keys set
or not, and `TRIMTAB_OLLAMA_URL` pointing at a fake Ollama or at a closed port (never at a real
Ollama on 11434)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_ollama import FakeOllama, ollama  # noqa: F401 (a fixture)
from tests.requirements import require_llama_cpp

ROOT = Path(__file__).resolve().parents[1]

NOTICE_END = "; pass provider= to choose another"

SHOW = """
import asyncio, json
from trimtab import Client

async def main() -> None:
    async with Client(store="memory") as client:
        first = await client.create_session()
        second = await client.create_session()
        print(json.dumps([[s.config.provider, s.config.model] for s in (first, second)]))

asyncio.run(main())
"""
"""Two sessions of one client, neither naming a provider: their logged providers and models."""


@pytest.fixture
def closed_url() -> Iterator[str]:
    """A local port bound but not listening: connecting to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _run(program: str, env: dict[str, str], *, setup: str = "") -> subprocess.CompletedProcess[str]:
    """`program` in a fresh interpreter whose environment holds no key but those of `env`."""
    clean = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("TRIMTAB_") and name not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    }
    src = str(ROOT / "src")
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [src, clean.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(setup) + textwrap.dedent(program)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**clean, **env},
        timeout=60,
    )


def _shown(result: subprocess.CompletedProcess[str]) -> list[list[Any]]:
    assert result.returncode == 0, result.stderr
    shown: list[list[Any]] = json.loads(result.stdout)
    return shown


def test_s6_keys_then_ollama_announced_once(ollama: FakeOllama) -> None:  # noqa: F811
    up = {"TRIMTAB_OLLAMA_URL": ollama.url}
    cases: list[tuple[dict[str, str], dict[str, Any], str | None, str]] = [
        (
            {"OPENAI_API_KEY": "sk-o", "ANTHROPIC_API_KEY": "sk-a", **up},
            {"type": "openai"},
            "gpt-4.1-mini",
            "using openai with model gpt-4.1-mini: OPENAI_API_KEY is set",
        ),
        (
            {"ANTHROPIC_API_KEY": "sk-a", **up},
            {"type": "anthropic"},
            "claude-sonnet-4-5",
            "using anthropic with model claude-sonnet-4-5: ANTHROPIC_API_KEY is set",
        ),
        (
            up,
            {"type": "openai", "baseUrl": f"{ollama.url}/v1"},
            "fake-model:1b",  # the first model the server has
            f"using ollama with model fake-model:1b: Ollama answers at {ollama.url}",
        ),
    ]
    for env, provider, model, notice in cases:
        probes = ollama.tags_requests
        result = _run(SHOW, env)
        first, second = _shown(result)
        assert first[0]["type"] == provider["type"], env
        assert {key: first[0].get(key) for key in provider} == provider, first
        assert first[1] == model
        assert second == first
        # One line, once per client, on stderr (Python's last-resort handler: no logging set).
        assert result.stderr == f"trimtab: {notice}{NOTICE_END}\n"
        # Ollama is asked once at most, and only when no key decided.
        assert ollama.tags_requests - probes == (1 if env is up else 0)


def test_s6_the_embedded_model_is_the_last_resort(closed_url: str) -> None:
    require_llama_cpp()  # without it, the next test's case: the choice fails in one line

    result = _run(SHOW, {"TRIMTAB_OLLAMA_URL": closed_url})

    assert (
        _shown(result) == [[{"type": "local", "maxRetries": 2, "wireApi": "completions"}, None]] * 2
    )
    assert result.stderr == (
        "trimtab: using the embedded model (local): found no OPENAI_API_KEY, ANTHROPIC_API_KEY"
        f" or running Ollama{NOTICE_END}\n"
    )


def test_s6_a_turn_with_the_ollama_it_found(ollama: FakeOllama) -> None:  # noqa: F811
    program = """
    import asyncio
    from trimtab import Client

    async def main() -> None:
        async with Client(store="memory") as client:
            session = await client.create_session()
            reply = await session.send_and_wait("Hi there")
            print(reply.data.content if reply else None)

    asyncio.run(main())
    """
    result = _run(program, {"TRIMTAB_OLLAMA_URL": ollama.url})

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello from Ollama\n"
    [request] = ollama.chat_requests
    assert request["model"] == "fake-model:1b"
    assert request["messages"][-1] == {"role": "user", "content": "Hi there"}


def test_s6_without_llama_cpp_the_embedded_model_fails_in_one_clear_line(closed_url: str) -> None:
    result = _run(
        SHOW,
        {"TRIMTAB_OLLAMA_URL": closed_url},
        setup="import sys\n"
        + ("sys.modules['llama_cpp'] = None  # as if llama-cpp-python were not installed\n"),
    )

    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "trimtab: using the embedded model (local): found no OPENAI_API_KEY, ANTHROPIC_API_KEY"
        f" or running Ollama{NOTICE_END}"
    )
    assert lines[-1] == (
        f"ImportError: provider type 'local' needs llama-cpp-python: pip install -e '{ROOT}[local]'"
    )


def test_s6_a_named_provider_is_used_and_nothing_is_chosen_or_announced(
    ollama: FakeOllama,  # noqa: F811
) -> None:
    program = """
    import asyncio, json
    from trimtab import Client
    from trimtab.testing import ScriptedModel

    GIVEN = {"type": "openai", "base_url": "http://127.0.0.1:9/v1"}

    async def main() -> None:
        shown = []
        async with Client(store="memory", provider=GIVEN) as client:
            shown.append((await client.create_session()).config.provider)
        async with Client(store="memory") as client:
            session = await client.create_session(provider=ScriptedModel())
            shown.append(session.config.provider)
        async with Client(store="memory", provider=None) as client:
            try:
                await client.create_session()
            except ValueError as exc:
                shown.append(str(exc))
        print(json.dumps(shown))

    asyncio.run(main())
    """
    env = {"OPENAI_API_KEY": "sk-o", "TRIMTAB_OLLAMA_URL": ollama.url}
    result = _run(program, env)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {"type": "openai", "baseUrl": "http://127.0.0.1:9/v1", "wireApi": "completions",
         "maxRetries": 2},
        {"type": "scripted"},
        "no provider: pass provider={...} to create_session or to Client()",
    ]  # fmt: skip
    assert result.stderr == ""
    assert ollama.tags_requests == 0


def test_s6_a_resumed_session_keeps_the_provider_its_log_names(
    ollama: FakeOllama,  # noqa: F811
    tmp_path: Path,
) -> None:
    program = f"""
    import asyncio, json
    from trimtab import Client

    STORE = {str(tmp_path / "trimtab.db")!r}

    async def main() -> None:
        async with Client(store=STORE, provider=None) as client:
            created = await client.create_session(
                provider={{"type": "openai", "base_url": "http://127.0.0.1:9/v1"}}, model="m"
            )
            await created.disconnect()
        async with Client(store=STORE) as client:
            resumed = await client.resume_session(created.session_id)
            print(json.dumps([resumed.config.provider["baseUrl"], resumed.config.model]))

    asyncio.run(main())
    """
    result = _run(program, {"OPENAI_API_KEY": "sk-o", "TRIMTAB_OLLAMA_URL": ollama.url})

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["http://127.0.0.1:9/v1", "m"]
    assert result.stderr == ""  # nothing was chosen


def test_s6_the_notice_goes_through_logging(closed_url: str) -> None:
    env = {"OPENAI_API_KEY": "sk-o", "TRIMTAB_OLLAMA_URL": closed_url}
    silenced = _run(
        SHOW, env, setup="import logging\nlogging.getLogger('trimtab').setLevel(logging.ERROR)\n"
    )
    _shown(silenced)
    assert silenced.stderr == ""

    configured = _run(
        SHOW,
        env,
        setup="import logging\nlogging.basicConfig(format='%(levelname)s %(name)s: %(message)s')\n",
    )
    _shown(configured)
    assert configured.stderr == (
        "WARNING trimtab: trimtab: using openai with model gpt-4.1-mini: OPENAI_API_KEY is set"
        f"{NOTICE_END}\n"
    )


def test_s6_an_invalid_ollama_url_is_a_clear_error() -> None:
    result = _run(SHOW, {"TRIMTAB_OLLAMA_URL": "localhost:11434"})

    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "ValueError: TRIMTAB_OLLAMA_URL='localhost:11434' is not an http:// or https:// URL,"
        " such as http://127.0.0.1:11434"
    )
