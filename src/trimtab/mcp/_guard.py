"""Run a local MCP server so that it dies with the runtime that started it.

    python -I -S _guard.py RUNTIME_PID -- COMMAND [ARG...]

The runtime starts this script (standard library only, so it starts in some 20 ms and needs
no installed trimtab) in a session of its own; the script starts the server in a process
group of its own and waits for it. When the runtime dies, however it dies (`kill -9`
included), Linux sends this script SIGTERM (`prctl(PR_SET_PDEATHSIG)`; elsewhere it notices
that its parent changed within half a second); a SIGTERM or SIGHUP from the runtime means the
same. Then the server's whole group gets SIGTERM, and SIGKILL after a grace period: a server
that ignores the end of its stdin, or SIGTERM, or that started children of its own, leaves
nothing behind. When the server exits by itself, what is left of its group is killed, and the
script exits with the server's status.

The server gets the script's stdin, stdout and stderr; the script lets go of stdin and stdout
at once, so that the runtime reads the end of the server's output when the server exits.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

GRACE = 1.5
"""Seconds the server's group has after SIGTERM before SIGKILL. Shorter than the MCP SDK's
own 2 s between its SIGTERM and SIGKILL, so that this script is done first."""

_PR_SET_PDEATHSIG = 1


class _Stop(Exception):
    """The runtime died or asked the server to stop."""


def _on_signal(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    raise _Stop


def _tie_to_parent(parent: int) -> None:
    """Get SIGTERM when the parent dies: from the kernel on Linux, else from a watcher."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0:
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(pid: int) -> int:
    """SIGTERM to the server's group, SIGKILL after the grace period; the server's status."""
    _kill_group(pid, signal.SIGTERM)
    status: int | None = None
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline:
        if status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            status = os.waitstatus_to_exitcode(raw) if done else None
        if status is not None and _group_gone(pid):
            return status
        time.sleep(0.02)
    _kill_group(pid, signal.SIGKILL)
    if status is None:
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return status


def _let_go(pid: int) -> None:
    """Make sure the server leads its group, and keep none of its stdin and stdout."""
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child did it first (it may have exec'd since)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: _guard.py RUNTIME_PID -- COMMAND [ARG...]\n")
        return 2
    parent, command = int(argv[1]), argv[3:]
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _tie_to_parent(parent)
        if os.getppid() != parent:
            return 1  # the runtime died before it could be watched: start nothing
        pid = os.fork()
    except _Stop:
        return 1
    if pid == 0:
        try:
            os.setpgid(0, 0)
            for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL)
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"cannot start {command[0]!r}: {exc.strerror}\n".encode())
        os._exit(127)
    try:
        try:
            _let_go(pid)
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except _Stop:
            status = _stop(pid)
    finally:
        _kill_group(pid, signal.SIGKILL)  # whatever the server left in its group
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
