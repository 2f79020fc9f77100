"""`session.workspace`: a session's plan and files, kept in its log (spec K16).

A write is an event that carries the text written (`session.plan_changed`,
`session.workspace_file_changed`), and making a directory, removing or renaming a path is one
too (`session.workspace_path_changed`), so the workspace is a fold of the log like everything
else a session knows: it lives in whichever store holds the session, is read by every runtime
that shares the store, is copied by a fork and deleted with the session. Paths are
slash-separated and relative; one that leaves the workspace (`../x`, `/etc/x`) is refused.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from trimtab._log import SessionLog
from trimtab._tools import valid_text
from trimtab.events import (
    Event,
    PlanChangedData,
    SessionCompactionCompleteEvent,
    SessionPlanChangedEvent,
    SessionWorkspaceFileChangedEvent,
    SessionWorkspacePathChangedEvent,
    WorkspaceFileChangedData,
    WorkspacePathChangedData,
)

__all__ = [
    "MAX_ENTRIES",
    "MAX_FILE_BYTES",
    "MAX_PATH",
    "Checkpoint",
    "PathInfo",
    "Workspace",
    "WorkspaceError",
]

MAX_FILE_BYTES = 1024 * 1024
"""The largest file (or plan) written, in UTF-8 bytes: every write is stored whole in the log."""

MAX_ENTRIES = 1000
"""Files and directories a workspace may hold."""

MAX_PATH = 1024
"""Characters of a path."""


class WorkspaceError(ValueError):
    """A workspace operation that cannot be done: a path outside the workspace, a file that
    does not exist, one too large. Nothing was changed."""


@dataclass(frozen=True, slots=True)
class PathInfo:
    """What `Workspace.stat` tells of a path."""

    is_file: bool
    size: int
    """UTF-8 bytes of a file; 0 for a directory."""
    created: datetime
    modified: datetime


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A compaction's summary, numbered from 1 in the log's order."""

    number: int
    title: str
    content: str


@dataclass(slots=True)
class _Entry:
    created: datetime
    modified: datetime
    content: str | None = None
    """A file's text; None for a directory."""


@dataclass(slots=True)
class _Tree:
    """The workspace as the log has it so far."""

    entries: dict[str, _Entry] = field(default_factory=dict)
    plan: str | None = None
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def apply(self, event: Event) -> None:
        at = event.timestamp
        match event:
            case SessionPlanChangedEvent():
                self.plan = event.data.content if event.data.operation != "delete" else None
            case SessionWorkspaceFileChangedEvent():
                self._parents(event.data.path, at)
                entry = self.entries.get(event.data.path)
                created = entry.created if entry is not None else at
                self.entries[event.data.path] = _Entry(created, at, event.data.content)
            case SessionWorkspacePathChangedEvent():
                self._change(event.data, at)
            case SessionCompactionCompleteEvent() if event.data.success:
                summary = event.data.summary_content or ""
                number = len(self.checkpoints) + 1
                title = next((line.strip("# ") for line in summary.splitlines() if line), "")
                title = title[:80] or f"Compaction {number}"
                self.checkpoints.append(Checkpoint(number, title, summary))
            case _:
                pass

    def _change(self, data: WorkspacePathChangedData, at: datetime) -> None:
        path = data.path
        match data.operation:
            case "create_directory":
                self._parents(path, at)
                self.entries.setdefault(path, _Entry(at, at))
            case "remove":
                for gone in self.under(path):
                    del self.entries[gone]
                self._touch(posixpath.dirname(path), at)
            case "rename" if data.destination is not None:
                self._parents(data.destination, at)
                for old in self.under(path):
                    new = data.destination + old[len(path) :]
                    self.entries[new] = self.entries.pop(old)
                self._touch(posixpath.dirname(path), at)

    def _parents(self, path: str, at: datetime) -> None:
        parent = posixpath.dirname(path)
        while parent:
            entry = self.entries.get(parent)
            if entry is None:
                self.entries[parent] = _Entry(at, at)
            else:
                entry.modified = at
            parent = posixpath.dirname(parent)

    def _touch(self, directory: str, at: datetime) -> None:
        if (entry := self.entries.get(directory)) is not None:
            entry.modified = at

    def under(self, path: str) -> list[str]:
        """`path` and every path inside it."""
        return [p for p in self.entries if p == path or p.startswith(path + "/")]

    def kind(self, path: str) -> str | None:
        """`file`, `directory`, or None when the workspace has no such path."""
        entry = self.entries.get(path)
        if entry is None:
            return None
        return "directory" if entry.content is None else "file"


def _tree(events: Iterable[Event]) -> _Tree:
    tree = _Tree()
    for event in events:
        tree.apply(event)
    return tree


def relative(path: str) -> str:
    """`path` as the workspace keys it (normalised, slash-separated, relative).

    Raises:
        WorkspaceError: The path is empty, absolute, leaves the workspace, or is not text a
            path may hold.
    """
    if not isinstance(path, str) or not path.strip():
        raise WorkspaceError("a workspace path must be a non-empty string")
    if len(path) > MAX_PATH:
        raise WorkspaceError(f"a workspace path is at most {MAX_PATH} characters")
    if valid_text(path) != path or any(ord(c) < 32 or c == "\x7f" for c in path):
        raise WorkspaceError(f"workspace path {path!r} holds a control character")
    if "\\" in path:
        raise WorkspaceError(f"workspace path {path!r}: separate its parts with '/', not '\\'")
    normal = posixpath.normpath(path)
    if path.startswith("/") or normal == ".." or normal.startswith("../"):
        raise WorkspaceError(f"path {path!r} is outside the workspace files directory")
    if normal == ".":
        raise WorkspaceError(f"path {path!r} names the workspace files directory itself")
    return normal


def _text(what: str, content: str) -> str:
    if not isinstance(content, str):
        raise WorkspaceError(f"{what} must be a string")
    if valid_text(content) != content:
        raise WorkspaceError(f"{what} is not valid Unicode text (a lone surrogate)")
    if len(content) > MAX_FILE_BYTES // 4 and len(content.encode()) > MAX_FILE_BYTES:
        raise WorkspaceError(f"{what} is larger than {MAX_FILE_BYTES} bytes")
    return content


class Workspace:
    """The session's plan and files (`session.workspace`), read from and written to its log.

    Reads work on a remote session too (they read the store); writes need the session open
    here and run by this runtime, as every write of its log does.
    """

    __slots__ = ("_log", "_writer")

    def __init__(self, log: SessionLog, writer: Callable[[], SessionLog]) -> None:
        self._log = log
        self._writer = writer

    async def _read(self) -> _Tree:
        return _tree(await self._log.store.read(self._log.session_id))

    # --- the plan ------------------------------------------------------------------------

    async def read_plan(self) -> str | None:
        """The plan's text, None when the session has none."""
        return (await self._read()).plan

    async def write_plan(self, content: str) -> None:
        """Replace the plan (`session.plan_changed`, `create` or `update`)."""
        content = _text("the plan", content)
        log = self._writer()
        async with log.exclusive():
            operation = "create" if (await self._read()).plan is None else "update"
            data = PlanChangedData(operation=operation, content=content)
            await log.emit_unlocked((SessionPlanChangedEvent(data=data),))

    async def delete_plan(self) -> bool:
        """Delete the plan; False when there was none (nothing is logged then)."""
        log = self._writer()
        async with log.exclusive():
            if (await self._read()).plan is None:
                return False
            data = PlanChangedData(operation="delete")
            await log.emit_unlocked((SessionPlanChangedEvent(data=data),))
        return True

    # --- files ---------------------------------------------------------------------------

    async def files(self) -> list[str]:
        """Every file's path, sorted (directories are not listed)."""
        tree = await self._read()
        return sorted(p for p, entry in tree.entries.items() if entry.content is not None)

    async def read(self, path: str) -> str:
        """A file's text."""
        key = relative(path)
        entry = (await self._read()).entries.get(key)
        if entry is None:
            raise WorkspaceError(f"no such file in the workspace: {key}")
        if entry.content is None:
            raise WorkspaceError(f"{key} is a directory of the workspace, not a file")
        return entry.content

    async def stat(self, path: str) -> PathInfo:
        """Whether `path` is a file or a directory, its size and times."""
        key = relative(path)
        entry = (await self._read()).entries.get(key)
        if entry is None:
            raise WorkspaceError(f"no such file or directory in the workspace: {key}")
        size = len(entry.content.encode()) if entry.content is not None else 0
        return PathInfo(entry.content is not None, size, entry.created, entry.modified)

    async def write(self, path: str, content: str) -> bool:
        """Create or replace a file, making its missing directories; True when it is new."""
        key = relative(path)
        content = _text(f"workspace file {key}", content)
        log = self._writer()
        async with log.exclusive():
            tree = await self._read()
            kind = tree.kind(key)
            if kind == "directory":
                raise WorkspaceError(f"{key} is a directory of the workspace, not a file")
            self._check_parents(tree, key)
            if kind is None:
                self._check_room(tree, key)
            data = WorkspaceFileChangedData(
                operation="create" if kind is None else "update", path=key, content=content
            )
            await log.emit_unlocked((SessionWorkspaceFileChangedEvent(data=data),))
        return kind is None

    async def make_directory(self, path: str, *, parents: bool = False) -> None:
        """Make a directory; with `parents`, its missing parents too, and one that exists
        already is no error (as `mkdir -p`)."""
        key = relative(path)
        log = self._writer()
        async with log.exclusive():
            tree = await self._read()
            match tree.kind(key):
                case "file":
                    raise WorkspaceError(f"{key} is a file of the workspace")
                case "directory":
                    if parents:
                        return
                    raise WorkspaceError(f"{key} exists in the workspace already")
            parent = posixpath.dirname(key)
            if parent and tree.kind(parent) is None and not parents:
                raise WorkspaceError(f"no such directory in the workspace: {parent}")
            self._check_parents(tree, key)
            self._check_room(tree, key)
            data = WorkspacePathChangedData(operation="create_directory", path=key)
            await log.emit_unlocked((SessionWorkspacePathChangedEvent(data=data),))

    async def remove(self, path: str, *, recursive: bool = False, missing_ok: bool = False) -> bool:
        """Remove a file, or a directory (with what it holds only when `recursive`); False
        when there was no such path and `missing_ok`."""
        key = relative(path)
        log = self._writer()
        async with log.exclusive():
            tree = await self._read()
            kind = tree.kind(key)
            if kind is None:
                if missing_ok:
                    return False
                raise WorkspaceError(f"no such file or directory in the workspace: {key}")
            if kind == "directory" and len(tree.under(key)) > 1 and not recursive:
                raise WorkspaceError(f"directory {key} of the workspace is not empty")
            data = WorkspacePathChangedData(operation="remove", path=key)
            await log.emit_unlocked((SessionWorkspacePathChangedEvent(data=data),))
        return True

    async def rename(self, source: str, destination: str) -> None:
        """Move a file or a directory (with what it holds) to a path that does not exist,
        making its missing directories."""
        old, new = relative(source), relative(destination)
        log = self._writer()
        async with log.exclusive():
            tree = await self._read()
            if tree.kind(old) is None:
                raise WorkspaceError(f"no such file or directory in the workspace: {old}")
            if tree.kind(new) is not None:
                raise WorkspaceError(f"{new} exists in the workspace already")
            if new.startswith(old + "/"):
                raise WorkspaceError(f"{old} cannot be moved inside itself ({new})")
            self._check_parents(tree, new)
            data = WorkspacePathChangedData(operation="rename", path=old, destination=new)
            await log.emit_unlocked((SessionWorkspacePathChangedEvent(data=data),))

    async def checkpoints(self) -> list[Checkpoint]:
        """The summaries of the session's compactions, oldest first."""
        return (await self._read()).checkpoints

    @staticmethod
    def _check_parents(tree: _Tree, key: str) -> None:
        parent = posixpath.dirname(key)
        while parent:
            if tree.kind(parent) == "file":
                raise WorkspaceError(f"{parent} is a file of the workspace, not a directory")
            parent = posixpath.dirname(parent)

    @staticmethod
    def _check_room(tree: _Tree, key: str) -> None:
        new = 1
        parent = posixpath.dirname(key)
        while parent:
            new += parent not in tree.entries
            parent = posixpath.dirname(parent)
        if len(tree.entries) + new > MAX_ENTRIES:
            raise WorkspaceError(f"the workspace holds at most {MAX_ENTRIES} files and directories")
