"""The params and results of the Copilot plan and workspace RPCs (`session.plan.*`,
`session.workspaces.*`, spec K16).

A trimtab workspace lives in the session's log, not in a directory: the results leave out the
filesystem paths the protocol makes optional (`path`), as it does for a remote session.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ConfigDict

from trimtab.protocol.wire import SessionParams, Text, Wire

__all__ = [
    "CheckpointEntry",
    "CheckpointParams",
    "CheckpointResult",
    "CheckpointsResult",
    "DirectoryParams",
    "FileContentResult",
    "FileParams",
    "FilesResult",
    "PlanResult",
    "PlanUpdateParams",
    "RemoveParams",
    "RenameParams",
    "SqlTodosResult",
    "StatResult",
    "WorkspaceInfo",
    "WorkspaceMetadataParams",
    "WorkspaceResult",
    "WriteFileParams",
]


class PlanResult(Wire):
    """`session.plan.read`."""

    exists: bool
    content: str | None = None


class PlanUpdateParams(SessionParams):
    """`session.plan.update`: the plan's new text."""

    content: Text


class SqlTodosResult(Wire):
    """`session.plan.readSqlTodos` (and `...WithDependencies`): trimtab keeps no session
    database, so there are no rows, as the protocol answers without one."""

    rows: list[dict[str, Any]] = []
    dependencies: list[dict[str, Any]] = []


class WorkspaceInfo(Wire):
    """The session's workspace: its id is the session's. Its fields are snake_case on the
    wire too (the protocol's `Workspace` is the reference runtime's workspace file)."""

    model_config = ConfigDict(alias_generator=None)

    id: str
    name: str | None = None
    user_named: bool | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    summary_count: int = 0
    """The compactions' summaries (`listCheckpoints`)."""


class WorkspaceResult(Wire):
    """`session.workspaces.getWorkspace`, `.ensure`, `.updateMetadata`."""

    workspace: WorkspaceInfo


class WorkspaceMetadataParams(SessionParams):
    """`session.workspaces.updateMetadata`: `name` names the session (spec K2)."""

    name: Text | None = None


class FilesResult(Wire):
    """`session.workspaces.listFiles`."""

    files: list[str]


class FileParams(SessionParams):
    """A path relative to the workspace's files (`readFile`, `statFile`)."""

    path: str


class FileContentResult(Wire):
    content: str


class WriteFileParams(FileParams):
    """`session.workspaces.createFile`: create or replace."""

    content: str


class StatResult(Wire):
    """`session.workspaces.statFile`: times in milliseconds since the epoch."""

    is_file: bool
    is_directory: bool
    size: int
    birthtime_ms: float
    mtime_ms: float


class DirectoryParams(FileParams):
    """`session.workspaces.createDirectory`."""

    recursive: bool = False


class RemoveParams(FileParams):
    """`session.workspaces.removePath`."""

    recursive: bool = False
    force: bool = False


class RenameParams(SessionParams):
    """`session.workspaces.renamePath`."""

    source: str
    destination: str


class CheckpointEntry(Wire):
    number: int
    title: str
    filename: str
    """A name for it (`001-compaction.md`): the summary lives in the log, not in a file."""


class CheckpointsResult(Wire):
    """`session.workspaces.listCheckpoints`: the compactions' summaries, oldest first."""

    checkpoints: list[CheckpointEntry]


class CheckpointParams(SessionParams):
    """`session.workspaces.readCheckpoint`."""

    number: int


class CheckpointResult(Wire):
    """`session.workspaces.readCheckpoint`: None for a number the session has not."""

    content: str | None = None
