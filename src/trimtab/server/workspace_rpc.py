"""The Copilot plan and workspace RPCs (`session.plan.*`, `session.workspaces.*`, spec K16),
mapped onto `Session.workspace`: a session's plan and files, kept in its log."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from trimtab import Session, SessionNotFoundError
from trimtab.protocol.jsonrpc import Connection
from trimtab.protocol.wire import SessionParams
from trimtab.protocol.workspace_wire import (
    CheckpointEntry,
    CheckpointParams,
    CheckpointResult,
    CheckpointsResult,
    DirectoryParams,
    FileContentResult,
    FileParams,
    FilesResult,
    PlanResult,
    PlanUpdateParams,
    RemoveParams,
    RenameParams,
    SqlTodosResult,
    StatResult,
    WorkspaceInfo,
    WorkspaceMetadataParams,
    WorkspaceResult,
    WriteFileParams,
)
from trimtab.server.hub import SessionHub

__all__ = ["workspace_methods"]

Method = Callable[[dict[str, Any]], Awaitable[BaseModel | dict[str, Any] | str | None]]


def workspace_methods(hub: SessionHub, conn: Connection) -> dict[str, Method]:
    """The plan and workspace RPCs, for one connection."""
    rpc = _WorkspaceRpc(hub, conn)
    return {
        "session.plan.read": rpc.read_plan,
        "session.plan.update": rpc.update_plan,
        "session.plan.delete": rpc.delete_plan,
        "session.plan.readSqlTodos": rpc.sql_todos,
        "session.plan.readSqlTodosWithDependencies": rpc.sql_todos,
        "session.workspaces.getWorkspace": rpc.get_workspace,
        "session.workspaces.ensure": rpc.get_workspace,
        "session.workspaces.updateMetadata": rpc.update_metadata,
        "session.workspaces.listFiles": rpc.list_files,
        "session.workspaces.readFile": rpc.read_file,
        "session.workspaces.createFile": rpc.create_file,
        "session.workspaces.statFile": rpc.stat_file,
        "session.workspaces.createDirectory": rpc.create_directory,
        "session.workspaces.removePath": rpc.remove_path,
        "session.workspaces.renamePath": rpc.rename_path,
        "session.workspaces.listCheckpoints": rpc.list_checkpoints,
        "session.workspaces.readCheckpoint": rpc.read_checkpoint,
        "session.workspaces.saveLargePaste": rpc.save_large_paste,
    }


class _WorkspaceRpc:
    def __init__(self, hub: SessionHub, conn: Connection) -> None:
        self._hub = hub
        self._conn = conn

    def _session(self, params: SessionParams) -> Session:
        return self._hub.get(self._conn, params.session_id).session

    # --- the plan --------------------------------------------------------------------------

    async def read_plan(self, params: dict[str, Any]) -> PlanResult:
        plan = await self._session(SessionParams.model_validate(params)).workspace.read_plan()
        return PlanResult(exists=plan is not None, content=plan)

    async def update_plan(self, params: dict[str, Any]) -> dict[str, Any]:
        request = PlanUpdateParams.model_validate(params)
        await self._session(request).workspace.write_plan(request.content)
        return {}

    async def delete_plan(self, params: dict[str, Any]) -> dict[str, Any]:
        await self._session(SessionParams.model_validate(params)).workspace.delete_plan()
        return {}

    async def sql_todos(self, params: dict[str, Any]) -> SqlTodosResult:
        self._session(SessionParams.model_validate(params))  # open here, else refused
        return SqlTodosResult()

    # --- the workspace ---------------------------------------------------------------------

    async def get_workspace(self, params: dict[str, Any]) -> WorkspaceResult:
        return await self._workspace(self._session(SessionParams.model_validate(params)))

    async def update_metadata(self, params: dict[str, Any]) -> WorkspaceResult:
        request = WorkspaceMetadataParams.model_validate(params)
        session = self._session(request)
        if request.name is not None:
            await session.set_name(request.name)
        return await self._workspace(session)

    async def _workspace(self, session: Session) -> WorkspaceResult:
        try:
            record = await self._hub.client.get_session_record(session.session_id)
        except SessionNotFoundError:
            record = None
        checkpoints = await session.workspace.checkpoints()
        named = session.name is not None
        info = WorkspaceInfo(
            id=session.session_id,
            name=session.name,
            user_named=named and not session.named_automatically,
            created_at=record.created_at if record is not None else None,
            updated_at=record.updated_at if record is not None else None,
            summary_count=len(checkpoints),
        )
        return WorkspaceResult(workspace=info)

    async def list_files(self, params: dict[str, Any]) -> FilesResult:
        files = await self._session(SessionParams.model_validate(params)).workspace.files()
        return FilesResult(files=files)

    async def read_file(self, params: dict[str, Any]) -> FileContentResult:
        request = FileParams.model_validate(params)
        return FileContentResult(content=await self._session(request).workspace.read(request.path))

    async def create_file(self, params: dict[str, Any]) -> dict[str, Any]:
        request = WriteFileParams.model_validate(params)
        await self._session(request).workspace.write(request.path, request.content)
        return {}

    async def stat_file(self, params: dict[str, Any]) -> StatResult:
        request = FileParams.model_validate(params)
        info = await self._session(request).workspace.stat(request.path)
        return StatResult(
            is_file=info.is_file,
            is_directory=not info.is_file,
            size=info.size,
            birthtime_ms=info.created.timestamp() * 1000,
            mtime_ms=info.modified.timestamp() * 1000,
        )

    async def create_directory(self, params: dict[str, Any]) -> dict[str, Any]:
        request = DirectoryParams.model_validate(params)
        workspace = self._session(request).workspace
        await workspace.make_directory(request.path, parents=request.recursive)
        return {}

    async def remove_path(self, params: dict[str, Any]) -> dict[str, Any]:
        request = RemoveParams.model_validate(params)
        workspace = self._session(request).workspace
        await workspace.remove(request.path, recursive=request.recursive, missing_ok=request.force)
        return {}

    async def rename_path(self, params: dict[str, Any]) -> dict[str, Any]:
        request = RenameParams.model_validate(params)
        await self._session(request).workspace.rename(request.source, request.destination)
        return {}

    async def list_checkpoints(self, params: dict[str, Any]) -> CheckpointsResult:
        session = self._session(SessionParams.model_validate(params))
        entries = [
            CheckpointEntry(
                number=c.number, title=c.title, filename=f"{c.number:03d}-compaction.md"
            )
            for c in await session.workspace.checkpoints()
        ]
        return CheckpointsResult(checkpoints=entries)

    async def read_checkpoint(self, params: dict[str, Any]) -> CheckpointResult:
        request = CheckpointParams.model_validate(params)
        checkpoints = await self._session(request).workspace.checkpoints()
        found = next((c for c in checkpoints if c.number == request.number), None)
        return CheckpointResult(content=found.content if found is not None else None)

    async def save_large_paste(self, params: dict[str, Any]) -> dict[str, Any]:
        # Its answer names a file on the server's disk, which a workspace in the log has
        # not: "no workspace to save it in", on which a client sends the paste as it is.
        self._session(SessionParams.model_validate(params))
        return {}
