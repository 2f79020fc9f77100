"""The README's opening claims and the docs it cites (issue 15, item 16): the cost figures of
the "Why trimtab" table are those of docs/performance.md, and every section of
docs/scale-out.md that the code cites exists."""

from __future__ import annotations

import re
from pathlib import Path

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
