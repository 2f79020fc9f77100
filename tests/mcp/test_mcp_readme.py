"""Issue 18: the README's MCP example runs as written, and is examples/03_mcp_tools.py."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.mcp.conftest import REPO


def test_issue18_the_readme_mcp_example_runs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## MCP servers", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    example = (REPO / "examples" / "03_mcp_tools.py").read_text(encoding="utf-8")
    assert example.endswith(code)
    src = str(REPO / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "tools: ['math__add', 'math__shout']\nreply: 17 + 25 = 42\n"
