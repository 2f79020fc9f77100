"""The one exception the command line shows to a person: a message, a hint, an exit code."""

from __future__ import annotations

from typing import BinaryIO

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "MAX_INPUT_BYTES",
    "CliError",
    "read_input",
]

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


MAX_INPUT_BYTES = 16 * 1024 * 1024
"""The most a prompt, script or config file the CLI reads may hold."""


def read_input(source: BinaryIO, what: str) -> str:
    """The UTF-8 text of `source`, read up to `MAX_INPUT_BYTES` (a pipe from /dev/zero must
    not fill the memory), else a usage error naming `what`."""
    data = source.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise CliError(
            f"{what} is larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB",
            hint="pass a shorter one",
            exit_code=EXIT_USAGE,
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(
            f"{what} is not UTF-8 text: {exc.reason} at byte {exc.start}",
            hint="save it as UTF-8",
            exit_code=EXIT_USAGE,
        ) from None
