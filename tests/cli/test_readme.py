"""The README's opening claims and the docs it cites (issue 15, item 16): the cost figures of
the "Why trimtab" table are those of docs/performance.md, and every section of
docs/scale-out.md that the code cites exists. And the newcomer's first hour (issue 33): the
Quickstart runs offline as written."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.requirements import require_llama_cpp, require_weights
from trimtab._state import state_of
from trimtab.events import Event, SessionContextClearedEvent
from trimtab.store import open_store

ROOT = Path(__file__).resolve().parents[2]


def _row(markdown: str, label: str) -> str:
    [line] = [line for line in markdown.splitlines() if line.startswith(f"| {label}")]
    return line


def test_issue15_16_the_why_table_quotes_docs_performance() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    performance = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    costs = _row(readme, "Cost of a turn above the raw `openai` client")
    for label in ("trimtab (sqlite store)", "OpenAI Agents SDK", "Pydantic AI", "LangGraph"):
        measured = _row(performance, label).split("|")
        plain, tool = (cell.split("/")[0].strip() for cell in measured[2:4])
        sign = "" if plain.startswith("-") else "+"
        assert f"{sign}{plain} / {'' if tool.startswith('-') else '+'}{tool} ms" in costs, label
    server = _row(performance, "plain turn over JSON-RPC vs the Copilot CLI (stdio)")
    ours, theirs = re.findall(r"(\d+\.\d+)", server.split("|")[3])[:2]
    assert f"{theirs} ms per plain turn over stdio, against {ours} ms" in costs


def test_issue15_16_every_cited_section_of_the_scale_out_doc_exists() -> None:
    doc = (ROOT / "docs" / "scale-out.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", doc, flags=re.MULTILINE))
    cited: set[str] = set()
    for path in [*ROOT.glob("src/**/*.py"), ROOT / ".ci" / "start-postgres.sh"]:
        text = path.read_text(encoding="utf-8")
        cited |= set(re.findall(r"scale-out\.md,? (?:section )?(\d+(?:\.\d+)?)", text))
    assert cited, "the code cites sections of docs/scale-out.md"
    assert cited <= headings, cited - headings


# --- issue 33: the Quickstart runs offline as written -------------------------------------------


def _require_embedded_model() -> None:
    """The Quickstart runs against the embedded model: its engine and default weights (CI
    installs both, as the README's set-up does)."""
    require_llama_cpp()
    require_weights()


def _section(markdown: str, heading: str) -> str:
    """The first Python block after `heading`."""
    return markdown.split(heading, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_issue33_the_quickstart_runs_offline_with_the_provider_the_client_picks(
    tmp_path: Path,
) -> None:
    _require_embedded_model()
    code = _section((ROOT / "README.md").read_text(encoding="utf-8"), "## Quickstart")
    assert "provider=" not in code  # as written: nothing names a provider
    with socket.socket() as closed:  # bound, not listening: no Ollama answers there
        closed.bind(("127.0.0.1", 0))
        env = {
            **{
                name: value
                for name, value in os.environ.items()
                if not name.startswith("TRIMTAB_")
                and name not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
            },
            "TRIMTAB_HOME": str(tmp_path / "home"),
            "TRIMTAB_OLLAMA_URL": f"http://127.0.0.1:{closed.getsockname()[1]}",
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
            ),
        }
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        "trimtab: using the embedded model (local): found no OPENAI_API_KEY, ANTHROPIC_API_KEY"
        " or running Ollama; pass provider= to choose another\n"
    )
    assert result.stdout.startswith("cleared: messages_cleared=2 initial_message=")
    # What the README says of the run, read from the log the Quickstart left in the default store.
    events = asyncio.run(_events(tmp_path / "home" / "trimtab.db"))
    types = [event.type for event in events]
    first, second = (i for i, kind in enumerate(types) if kind == "assistant.turn_start")
    assert first < types.index("session.context_cleared") < second
    [cleared] = [e for e in events if isinstance(e, SessionContextClearedEvent)]
    # The second request held only the system message and the seed.
    seen = [(m.role, m.content) for m in state_of(events[:second]).window()]
    assert seen == [
        ("system", "You are a helpful assistant."),
        ("user", cleared.data.initial_message),
    ]


async def _events(path: Path) -> list[Event]:
    store = open_store(path)
    try:
        [record] = await store.list_sessions()
        return await store.read(record.session_id)
    finally:
        await store.close()


def test_issue33_install_commands_install_trimtab_from_its_checkout() -> None:
    # trimtab is not on a package index: `pip install 'trimtab[extra]'` would fail.
    for path in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("examples/*.py")]:
        for command in re.findall(r"pip install[^`\n]*", path.read_text(encoding="utf-8")):
            assert "trimtab[" not in command, f"{path.name}: {command}"


def test_issue33_the_tracing_examples_command_installs_the_sdk_it_imports() -> None:
    example = (ROOT / "examples" / "04_tracing.py").read_text(encoding="utf-8")
    assert "from opentelemetry.sdk" in example
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    [paragraph] = [p for p in readme.split("\n\n") if "python examples/04_tracing.py" in p]
    [command] = re.findall(r"`(pip install [^`]*python examples/04_tracing\.py)`", paragraph)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    named = set(command.split()) | {
        requirement.split(">")[0].split("=")[0]
        for extra in re.findall(r"'\.\[([a-z,]+)\]'", command)
        for name in extra.split(",")
        for requirement in extras[name]
    }
    assert {"opentelemetry-api", "opentelemetry-sdk"} <= named, command
    assert command in example  # the example's own docstring says the same
