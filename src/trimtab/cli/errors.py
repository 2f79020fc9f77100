"""The one exception the command line shows to a person: a message, a hint, an exit code."""

from __future__ import annotations

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "CliError"]

EXIT_ERROR = 1
"""Something failed at run time: a `session.error`, an unknown session, an unreachable provider."""

EXIT_USAGE = 2
"""The command line, an environment variable or `trimtab.toml` asked for something invalid."""

EXIT_INTERRUPTED = 130
"""Ctrl-C, as shells report a SIGINT death (128 + 2)."""


class CliError(Exception):
    """A failure `trimtab.cli.main` prints as one line plus a hint, without a traceback.

    Args:
        message: What went wrong, on one line.
        hint: What the person can do about it, on one line.
        exit_code: `EXIT_ERROR` or `EXIT_USAGE`.
    """

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int = EXIT_ERROR):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
