"""The suite's own rules (issue 33), checked on a small inner run of pytest with this suite's
conftest: a test that leaves a process running errors, and the process is killed; a command
the `cli` fixture started ends with the test, even a failed one; a missing requirement skips
with its reason and is recorded for CI's second run, or fails where every requirement must be
met; a platform's limit stays a plain skip."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.leftovers import descendants
from tests.requirements import REQUIRE_ALL_VARIABLE, UNMET_FILE_VARIABLE

ROOT = Path(__file__).resolve().parents[1]


def inner_pytest(
    tmp_path: Path, *options: str, env: dict[str, str] | None = None, **files: str
) -> subprocess.CompletedProcess[str]:
    """Run pytest on `files` (name: source) in `tmp_path`, with the project's settings and this
    suite's root conftest."""
    for name, source in files.items():
        (tmp_path / f"{name}.py").write_text(source)
    variables = {
        k: v for k, v in os.environ.items() if k not in (REQUIRE_ALL_VARIABLE, UNMET_FILE_VARIABLE)
    }
    settings = ["-c", str(ROOT / "pyproject.toml"), f"--rootdir={tmp_path}", "-o", "addopts="]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *settings,
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
        ]
        + ["-rs", *options]
        + [str(tmp_path / f"{name}.py") for name in files],
        cwd=ROOT,  # `tests` importable
        env={**variables, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def running(marker: str) -> list[str]:
    """The commands of every process on the machine whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in command and state != "Z":
            found.append(command)
    return found


def test_a_test_that_leaves_a_process_running_errors_and_the_process_is_killed(
    tmp_path: Path,
) -> None:
    marker = f"leftover-{uuid.uuid4().hex}"
    source = (
        "import subprocess, sys\n\n\n"
        "def test_leaks():\n"
        f"    code = 'import time; time.sleep(300)'\n"
        f"    subprocess.Popen([sys.executable, '-c', code, '{marker}'])\n"
    )
    done = inner_pytest(tmp_path, test_leaky=source)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed, 1 error" in done.stdout
    assert "the test left processes running (now killed): pid " in done.stdout
    assert marker in done.stdout
    assert running(marker) == []


def test_a_failed_test_ends_the_commands_the_cli_fixture_started(tmp_path: Path) -> None:
    marker = f"slow-{uuid.uuid4().hex}"
    source = (
        "def test_fails_half_way(cli):\n"
        f"    cli.start('run', *cli.scripted({{'reply': 'slow', 'delay': 300}}), '{marker}')\n"
        "    assert False, 'half-way'\n"
    )
    # A session-scoped fixture's process (the Temporal dev server) is ours until the run ends.
    ours = {process.key for process in descendants()}
    done = inner_pytest(tmp_path, "-p", "tests.cli.conftest", test_cli=source)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in done.stdout and "AssertionError: half-way" in done.stdout
    assert "left processes running" not in done.stdout  # the fixture ended it, not the net
    assert running(marker) == []
    assert [process for process in descendants() if process.key not in ours] == []


def test_a_test_that_times_out_fails_and_its_commands_end(tmp_path: Path) -> None:
    marker = f"hung-{uuid.uuid4().hex}"
    source = (
        "def test_hangs(cli):\n"
        "    script = cli.scripted({'reply': 'slow', 'delay': 300})\n"
        f"    slow = cli.start('run', *script, '{marker}')\n"
        "    slow.wait()\n"
    )
    done = inner_pytest(tmp_path, "-p", "tests.cli.conftest", "--timeout=5", test_hung=source)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in done.stdout and "Failed: Timeout" in done.stdout
    assert "left processes running" not in done.stdout  # the fixture ended it, not the net
    assert running(marker) == []


MISSING = "needs a thing: apt-get install thing"
REQUIRES = (
    "import pytest\n\n"
    "from tests.requirements import unmet\n\n\n"
    "def test_needs_a_thing():\n"
    f"    unmet({MISSING!r})\n\n\n"
    "def test_on_another_platform():\n"
    "    pytest.skip('not on this platform')\n"
)
MODULE = (
    f"from tests.requirements import unmet\n\nunmet({MISSING!r})\n\n\ndef test_x():\n    pass\n"
)


def test_a_missing_requirement_skips_with_its_reason_and_is_recorded(tmp_path: Path) -> None:
    record = tmp_path / "unmet.tsv"
    done = inner_pytest(
        tmp_path,
        env={UNMET_FILE_VARIABLE: str(record)},
        test_requires=REQUIRES,
        test_module=MODULE,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 skipped" in done.stdout and f": {MISSING}" in done.stdout
    lines = sorted(line.split("\t") for line in record.read_text().splitlines())
    assert lines == [
        ["test_module.py", MISSING],  # skipped at import: the module's node id
        ["test_requires.py::test_needs_a_thing", MISSING],
    ]


def test_where_every_requirement_must_be_met_a_missing_one_fails(tmp_path: Path) -> None:
    done = inner_pytest(
        tmp_path,
        "--continue-on-collection-errors",  # an unmet module is an error, stopping the run
        env={REQUIRE_ALL_VARIABLE: "1"},
        test_requires=REQUIRES,
        test_module=MODULE,
    )

    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 skipped, 1 error" in done.stdout
    assert f"{MISSING} ({REQUIRE_ALL_VARIABLE} is set)" in done.stdout
    assert "not on this platform" in done.stdout  # a platform's limit is still a skip
