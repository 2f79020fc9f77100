"""Files and directories trimtab creates for its data: private to their owner.

Conversations are private, so every directory trimtab creates is 0700 and every file 0600,
whatever the umask (which can only take bits away from a mode, never add any, but a umask
such as 0o277 would leave the owner without access). Directories and files that exist already
are left as they are: their mode was chosen by whoever made them. A token is stricter
(`TokenFile`): its directory must be private already, or it is not written.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import tempfile
from pathlib import Path

__all__ = ["TokenFile", "private_directory", "private_file"]

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def private_directory(path: Path) -> None:
    """Create `path` and its missing parents, each with mode 0700."""
    missing = []
    for directory in (path, *path.parents):
        if directory.exists():
            break
        missing.append(directory)
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIRECTORY_MODE)
        except FileExistsError:
            continue  # made meanwhile by another process: not ours
        os.chmod(directory, DIRECTORY_MODE)


def private_file(path: Path) -> None:
    """Create `path` empty with mode 0600, unless it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)
    os.chmod(path, FILE_MODE)


class TokenFile:
    """A token a server made, kept in `<directory>/<port>.token` while it serves, so that
    its user can find it again (`trimtab serve`'s in `$TRIMTAB_HOME/serve`, spec S10;
    `trimtab inspect`'s in `$TRIMTAB_HOME/inspect`, spec L9).

    The file holds the token alone (no newline), which is what `COPILOT_CONNECTION_TOKEN`,
    `RuntimeConnection.for_uri(..., connection_token=)` and an `Authorization: Bearer`
    header take. It is 0600 in a 0700 directory of the server's user; a directory that
    other accounts may open, or that is not the user's, is refused rather than used.

    Args:
        directory: Where the file goes; made (0700) if missing.
    """

    def __init__(self, directory: Path) -> None:
        self.token = secrets.token_urlsafe(32)
        self._directory = directory
        self.path: Path | None = None
        """Where the token is, once written."""

    def write(self, port: int) -> Path:
        """Write the token for the server listening on `port`; its file's path.

        Raises:
            OSError: The directory cannot be made or written, or is open to others.
        """
        directory = self._directory
        private_directory(directory)
        _check_private_directory(directory)
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".token-")  # 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(self.token)
            self.path = directory / f"{port}.token"
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return self.path

    def remove(self) -> None:
        """Remove the file, unless another server wrote its own token there since."""
        if self.path is None:
            return
        try:
            if self.path.read_text(encoding="utf-8") == self.token:
                self.path.unlink()
        except OSError:
            pass  # gone already, or never readable: nothing of ours to remove


def _check_private_directory(directory: Path) -> None:
    if sys.platform == "win32":
        return
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"{directory} is not a directory of this user's that only it can open"
            f" (mode {stat.S_IMODE(info.st_mode):o}): a token written there would not be"
            f" private; chmod 700 it, or set TRIMTAB_HOME elsewhere"
        )
