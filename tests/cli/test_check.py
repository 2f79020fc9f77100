"""`scripts/check`, the contributor's command (issue 15, item 15): its test run says why each
skipped test was skipped, and its benchmark smoke reports figures without judging them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_issue15_15_the_check_script_shows_skip_reasons(tmp_path: Path) -> None:
    script = (ROOT / "scripts" / "check").read_text()
    [pytest_line] = [line for line in script.splitlines() if line.startswith("python -m pytest")]
    command = pytest_line.split("#")[0].replace('"$@"', "test_skip.py")
    command = command.replace("python ", f"{sys.executable} ", 1)
    (tmp_path / "test_skip.py").write_text(
        "import pytest\n\n\n@pytest.mark.skip(reason='needs a PostgreSQL server')\n"
        "def test_x() -> None:\n    pass\n"
    )
    done = subprocess.run(
        ["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"SKIPPED \[1\] test_skip.py:\d+: needs a PostgreSQL server", done.stdout)


def test_issue15_15_a_smoke_run_reports_figures_but_no_verdict() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import report
    finally:
        sys.path.remove(str(ROOT / "bench"))
    results = {
        "command": "python bench/run.py --smoke",
        "date": "2026-12-01",
        "machine": "2 cores",
        "runs": 20,
        "errors": {},
        "import": {"import_trimtab_s": 0.9},  # over the 0.3 s budget
    }
    full = report.render({**results, "smoke": False})
    smoke = report.render({**results, "smoke": True})
    assert "| `import trimtab` | ≤ 0.3 s | 0.900 s | **no** |" in full
    assert "| `import trimtab` | ≤ 0.3 s | 0.900 s |" in smoke
    assert "**no**" not in smoke and "holds" not in smoke
