"""The directory the built-in tools work in, and the only one their file tools may touch.

A path the model names is taken relative to the root (an absolute one as it is), its
symbolic links are resolved, and it must then lie under the root's own resolved path
(spec B2). The check runs twice: before the call is asked about (so that nobody is asked to
approve a path that will be refused) and again right before the file is used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Outside", "WorkingDirectory"]


class Outside(Exception):
    """The path lies outside the working directory (or cannot be a path at all)."""


@dataclass(frozen=True, slots=True)
class WorkingDirectory:
    """The built-in tools' working directory."""

    root: Path
    """As given, made absolute: what results show (the client's spelling of it)."""
    real: Path
    """With its symbolic links resolved: what paths are checked against."""

    @classmethod
    def at(cls, root: str | os.PathLike[str]) -> WorkingDirectory:
        """The directory at `root`, an existing directory.

        Raises:
            ValueError: `root` is not an existing directory.
        """
        given = Path(os.path.abspath(root))
        real = Path(os.path.realpath(given))
        if not real.is_dir():
            raise ValueError(f"the built-in tools' root {str(given)!r} is not a directory")
        return cls(given, real)

    def shown(self, path: str) -> str:
        """`path` as results show it: absolute, normalised, its links not resolved."""
        return os.path.normpath(os.path.join(self.root, path))

    def resolve(self, path: str) -> Path:
        """The real path `path` names, if it lies under the root.

        A link loop is left unresolved (using it then fails with `ELOOP`).

        Raises:
            Outside: It lies outside the root, or is not a path (empty, a NUL character).
        """
        if not path or "\x00" in path:
            raise Outside("The path is empty or holds a NUL character.")
        shown = self.shown(path)
        real = Path(os.path.realpath(shown))
        if real != self.real and self.real not in real.parents:
            raise Outside(
                f"Path {shown} is outside the working directory {self.root}: "
                "the built-in tools may only use files under it."
            )
        return real
