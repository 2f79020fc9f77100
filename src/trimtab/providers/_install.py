"""How to install what a provider is missing, from where this trimtab was installed.

trimtab is installed from its checkout (`pip install '.[local]'`), so an extra's hint must name
that checkout rather than a package index: the directory of the imported sources when they are
a checkout's (an editable install, or `PYTHONPATH=src`), else the directory pip recorded when
it installed them (`direct_url.json`). Only without either does the hint name PyPI.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["install_command"]


def install_command(extra: str) -> str:
    """The `pip install` command that adds `extra` (`local`, `anthropic`, ...) to trimtab."""
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "pyproject.toml").is_file():
        return f"pip install -e '{checkout}[{extra}]'"
    source = _installed_from()
    if source is not None:
        return f"pip install '{source}[{extra}]'"
    return f"pip install 'trimtab[{extra}]'"


def _installed_from() -> str | None:
    """The local directory pip installed trimtab from, if it recorded one."""
    try:
        recorded = importlib.metadata.distribution("trimtab").read_text("direct_url.json")
        url = json.loads(recorded or "null")["url"]
    except (importlib.metadata.PackageNotFoundError, ValueError, TypeError, KeyError):
        return None
    parts = urlsplit(str(url))
    return unquote(parts.path) if parts.scheme == "file" else None
