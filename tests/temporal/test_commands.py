"""`trimtab worker` and `trimtab serve --engine`: bad flags are refused before anything runs
(spec EN1, EN2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.temporal.conftest import free_port, require_temporalio


def _trimtab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trimtab", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--tools", "nothing_here_module:TOOLS"], "--tools 'nothing_here_module:TOOLS'"),
        (["--tools", "json"], "expected module:attribute"),
        (["--tools", "json:dumps"], "not a Tool or a list of them"),
        (["--provider", "nonsense"], "--provider"),
    ],
    ids=["missing module", "no attribute", "not a tool", "bad provider"],
)
def test_en2_a_worker_refuses_bad_flags(args: list[str], said: str, tmp_path: Path) -> None:
    require_temporalio()
    engine = f"temporal://127.0.0.1:{free_port()}"
    done = _trimtab("worker", "--engine", engine, "--store", str(tmp_path / "s.db"), *args)
    assert done.returncode == 2
    assert said in done.stderr


def test_en2_a_worker_whose_engine_is_unreachable_says_so(tmp_path: Path) -> None:
    require_temporalio()
    engine = f"temporal://127.0.0.1:{free_port()}"
    done = _trimtab("worker", "--engine", engine, "--store", str(tmp_path / "s.db"))
    assert done.returncode == 1
    assert "cannot start the worker" in done.stderr


@pytest.mark.parametrize("engine", ["http://127.0.0.1:7233", "temporal://no-port"])
def test_en1_serve_refuses_an_engine_url_it_cannot_use(engine: str, tmp_path: Path) -> None:
    done = _trimtab("serve", "--store", str(tmp_path / "s.db"), "--engine", engine)
    assert done.returncode == 2
    assert "engine" in done.stderr


def test_en1_serve_with_an_unreachable_engine_fails_to_start(tmp_path: Path) -> None:
    require_temporalio()
    engine = f"temporal://127.0.0.1:{free_port()}"
    done = _trimtab("serve", "--store", str(tmp_path / "s.db"), "--engine", engine)
    assert done.returncode == 1
    assert "cannot reach the engine" in done.stderr
