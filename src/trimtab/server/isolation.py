"""What a server keeps from the processes that run as its user (spec S17).

A local MCP server starts with a clean environment (`trimtab.mcp`), but as the server's own
user it could still read the server's: `/proc/<pid>/environ` (API keys, the connection
token) and `/proc/<pid>/mem` are readable by every process of the same user, and so is a
debugger's attach. An undumpable process (`prctl(PR_SET_DUMPABLE, 0)`, Linux) has those files
owned by root and refuses `ptrace` to its user's other processes; the commands it starts are
dumpable again once they `exec`, so nothing else changes for them. What the server's user can
read on disk (its store, its token and key files) stays readable to them: the same user is
the same user.
"""

from __future__ import annotations

import ctypes
import logging
import sys

__all__ = ["undumpable"]

log = logging.getLogger("trimtab.server")

_PR_SET_DUMPABLE = 4


def undumpable() -> bool:
    """Make this process undumpable, on Linux; whether it is now.

    It also means no core dump of the server, and no debugger attached as its user (root
    still can).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
            return True
        error = ctypes.get_errno()
    except (OSError, AttributeError) as exc:
        error = getattr(exc, "errno", None) or 0
    log.warning(
        "cannot make the server undumpable (errno %d): processes of its user, the MCP"
        " servers it starts among them, can read its environment",
        error,
    )
    return False
