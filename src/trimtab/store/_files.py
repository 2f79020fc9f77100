"""Files and directories trimtab creates for its data: private to their owner.

Conversations are private, so every directory trimtab creates is 0700 and every file 0600,
whatever the umask (which can only take bits away from a mode, never add any, but a umask
such as 0o277 would leave the owner without access). Directories and files that exist already
are left as they are: their mode was chosen by whoever made them.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["private_directory", "private_file"]

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
