"""Issue 36, a session's plan and workspace files (spec K16) through the official `copilot`
client against real `trimtab serve` subprocesses: written into the session's log, so they
survive a resume, are read by another server sharing the store and copied by a fork; and no
path leaves the workspace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from copilot import CopilotClient
from copilot._jsonrpc import JsonRpcError
from copilot.generated.rpc import (
    PlanUpdateRequest,
    SessionsForkRequest,
    WorkspacesCreateDirectoryRequest,
    WorkspacesCreateFileRequest,
    WorkspacesReadCheckpointRequest,
    WorkspacesReadFileRequest,
    WorkspacesRemovePathRequest,
    WorkspacesRenamePathRequest,
    WorkspacesSaveLargePasteRequest,
    WorkspacesStatFileRequest,
    WorkspacesUpdateMetadataRequest,
)
from copilot.generated.session_events import PlanChangedOperation, WorkspaceFileChangedOperation
from copilot.session import CopilotSession, PermissionHandler

from tests.server.conftest import (
    ServerProcess,
    StartServer,
    assistant,
    conversation,
    provider,
    user,
)
from tests.server.test_session_rpcs import Seen
from trimtab._compaction import COMPACTION_PROMPT
from trimtab._workspace import MAX_FILE_BYTES
from trimtab.testing import ReplayServer


async def connect(server: ServerProcess) -> CopilotClient:
    client = CopilotClient(connection=server.connection())
    await client.start()
    return client


@pytest.fixture
async def client(shared_server: ServerProcess) -> AsyncIterator[CopilotClient]:
    official = await connect(shared_server)
    yield official
    await official.force_stop()


@pytest.fixture
async def model() -> AsyncIterator[ReplayServer]:
    async with ReplayServer([]) as replay:
        yield replay


async def open_session(
    client: CopilotClient, model: ReplayServer, session_id: str | None = None
) -> CopilotSession:
    options: dict[str, Any] = {
        "provider": provider(model),
        "model": "test-model",
        "on_permission_request": PermissionHandler.approve_all,
    }
    if session_id is not None:
        return await client.resume_session(session_id, **options)
    return await client.create_session(**options)


async def test_k16_the_plan_is_written_read_deleted_and_kept_across_a_resume(
    client: CopilotClient, model: ReplayServer
) -> None:
    session = await open_session(client, model)
    changes = Seen(session, "session.plan_changed")
    initial = await session.rpc.plan.read()
    assert (initial.exists, initial.content) == (False, None)

    await session.rpc.plan.update(PlanUpdateRequest(content="# Plan\n\n- Step 1"))
    await session.rpc.plan.update(PlanUpdateRequest(content="# Plan\n\n- Step 1\n- Step 2"))
    read = await session.rpc.plan.read()
    assert (read.exists, read.content) == (True, "# Plan\n\n- Step 1\n- Step 2")
    await changes.wait_for(2)
    assert [c.data.operation for c in changes] == [
        PlanChangedOperation.CREATE,
        PlanChangedOperation.UPDATE,
    ]
    assert (await session.rpc.plan.read_sql_todos()).rows == []
    await session.disconnect()

    resumed = await open_session(client, model, session.session_id)
    assert (await resumed.rpc.plan.read()).content == "# Plan\n\n- Step 1\n- Step 2"
    await resumed.rpc.plan.delete()
    deleted = await resumed.rpc.plan.read()
    assert (deleted.exists, deleted.content) == (False, None)
    await resumed.rpc.plan.delete()  # nothing to delete: no error, nothing logged
    logged = [e.type.value for e in await resumed.get_events()]
    assert logged.count("session.plan_changed") == 3
    await resumed.disconnect()


async def test_k16_files_are_written_listed_read_and_stated(
    client: CopilotClient, model: ReplayServer
) -> None:
    session = await open_session(client, model)
    changes = Seen(session, "session.workspace_file_changed")
    assert (await session.rpc.workspaces.list_files()).files == []
    before = datetime.now(UTC).timestamp() * 1000

    await session.rpc.workspaces.create_file(
        WorkspacesCreateFileRequest(path="nested/subdir/notes.md", content="héllo 🚀")
    )
    await session.rpc.workspaces.create_file(WorkspacesCreateFileRequest(path="a.txt", content="1"))
    await session.rpc.workspaces.create_file(WorkspacesCreateFileRequest(path="a.txt", content="2"))
    listed = await session.rpc.workspaces.list_files()
    assert listed.files == ["a.txt", "nested/subdir/notes.md"]
    read = await session.rpc.workspaces.read_file(WorkspacesReadFileRequest(path="a.txt"))
    assert read.content == "2"
    await changes.wait_for(3)
    assert [(c.data.path, c.data.operation) for c in changes] == [
        ("nested/subdir/notes.md", WorkspaceFileChangedOperation.CREATE),
        ("a.txt", WorkspaceFileChangedOperation.CREATE),
        ("a.txt", WorkspaceFileChangedOperation.UPDATE),
    ]

    stat = await session.rpc.workspaces.stat_file(
        WorkspacesStatFileRequest(path="./nested/subdir/notes.md")
    )
    assert (stat.is_file, stat.is_directory, stat.size) == (True, False, len("héllo 🚀".encode()))
    assert before <= stat.birthtime_ms <= stat.mtime_ms
    directory = await session.rpc.workspaces.stat_file(WorkspacesStatFileRequest(path="nested"))
    assert (directory.is_file, directory.is_directory, directory.size) == (False, True, 0)

    workspace = await session.rpc.workspaces.get_workspace()
    assert workspace.workspace is not None and workspace.workspace.id == session.session_id
    assert workspace.path is None  # in the log, not in a directory of the server's
    paste = WorkspacesSaveLargePasteRequest(content="pasted\n" * 2000)
    assert (await session.rpc.workspaces.save_large_paste(paste)).saved is None
    renamed = await session.rpc.workspaces.update_metadata(
        WorkspacesUpdateMetadataRequest(name="Research")
    )
    assert renamed.workspace is not None
    assert (renamed.workspace.name, renamed.workspace.user_named) == ("Research", True)
    with pytest.raises(JsonRpcError, match="no such file in the workspace: missing.txt"):
        await session.rpc.workspaces.read_file(WorkspacesReadFileRequest(path="missing.txt"))
    with pytest.raises(JsonRpcError, match="is a directory"):
        await session.rpc.workspaces.read_file(WorkspacesReadFileRequest(path="nested"))
    await session.disconnect()


@pytest.mark.parametrize(
    "path",
    ["../escaped.txt", "../../escaped.txt", "nested/../../../escaped.txt", "/etc/passwd", ".."],
)
async def test_k16_a_path_outside_the_workspace_is_refused_and_changes_nothing(
    client: CopilotClient, model: ReplayServer, path: str
) -> None:
    session = await open_session(client, model)
    before = len(await session.get_events())
    workspaces = session.rpc.workspaces
    calls = [
        workspaces.create_file(WorkspacesCreateFileRequest(path=path, content="outside")),
        workspaces.read_file(WorkspacesReadFileRequest(path=path)),
        workspaces.stat_file(WorkspacesStatFileRequest(path=path)),
        workspaces.create_directory(WorkspacesCreateDirectoryRequest(path=path, recursive=True)),
        workspaces.remove_path(WorkspacesRemovePathRequest(path=path, force=True)),
        workspaces.rename_path(WorkspacesRenamePathRequest(source="a", destination=path)),
    ]
    for attempt in calls:
        with pytest.raises(JsonRpcError, match="outside the workspace files directory"):
            await attempt
    assert len(await session.get_events()) == before
    await session.disconnect()


async def test_k16_directories_are_made_removed_and_renamed(
    client: CopilotClient, model: ReplayServer
) -> None:
    session = await open_session(client, model)
    ws = session.rpc.workspaces
    with pytest.raises(JsonRpcError, match="no such directory in the workspace: a"):
        await ws.create_directory(WorkspacesCreateDirectoryRequest(path="a/b"))
    await ws.create_directory(WorkspacesCreateDirectoryRequest(path="a/b", recursive=True))
    await ws.create_directory(WorkspacesCreateDirectoryRequest(path="a/b", recursive=True))
    with pytest.raises(JsonRpcError, match="exists in the workspace already"):
        await ws.create_directory(WorkspacesCreateDirectoryRequest(path="a/b"))
    await ws.create_file(WorkspacesCreateFileRequest(path="a/b/f.txt", content="f"))
    with pytest.raises(JsonRpcError, match="is a file of the workspace, not a directory"):
        await ws.create_file(WorkspacesCreateFileRequest(path="a/b/f.txt/g", content="g"))

    await ws.rename_path(WorkspacesRenamePathRequest(source="a/b", destination="c/d"))
    assert (await ws.list_files()).files == ["c/d/f.txt"]
    with pytest.raises(JsonRpcError, match="cannot be moved inside itself"):
        await ws.rename_path(WorkspacesRenamePathRequest(source="c", destination="c/e"))
    with pytest.raises(JsonRpcError, match="exists in the workspace already"):
        await ws.rename_path(WorkspacesRenamePathRequest(source="c/d/f.txt", destination="a"))

    with pytest.raises(JsonRpcError, match="is not empty"):
        await ws.remove_path(WorkspacesRemovePathRequest(path="c"))
    await ws.remove_path(WorkspacesRemovePathRequest(path="c", recursive=True))
    assert (await ws.list_files()).files == []
    with pytest.raises(JsonRpcError, match="no such file or directory in the workspace: c"):
        await ws.remove_path(WorkspacesRemovePathRequest(path="c"))
    await ws.remove_path(WorkspacesRemovePathRequest(path="c", force=True))
    await ws.stat_file(WorkspacesStatFileRequest(path="a"))  # the rename left its parent
    await session.disconnect()


async def test_k16_a_file_larger_than_the_limit_is_refused(
    client: CopilotClient, model: ReplayServer
) -> None:
    session = await open_session(client, model)
    with pytest.raises(JsonRpcError, match=f"larger than {MAX_FILE_BYTES} bytes"):
        await session.rpc.workspaces.create_file(
            WorkspacesCreateFileRequest(path="big.txt", content="é" * (MAX_FILE_BYTES // 2 + 1))
        )
    assert (await session.rpc.workspaces.list_files()).files == []
    await session.disconnect()


async def test_k16_the_workspace_lives_in_the_store_another_server_and_a_fork_read_it(
    start_server: StartServer, tmp_path: Path, model: ReplayServer
) -> None:
    store = tmp_path / "shared.db"
    first = await connect(start_server(store))
    try:
        session = await open_session(first, model)
        await session.rpc.workspaces.create_file(
            WorkspacesCreateFileRequest(path="findings.md", content="- one")
        )
        await session.rpc.plan.update(PlanUpdateRequest(content="# Plan"))
        fork = await first.rpc.sessions.fork(SessionsForkRequest(session_id=session.session_id))
        await session.disconnect()
    finally:
        await first.force_stop()

    second = await connect(start_server(store))  # another process, the same store
    try:
        for session_id in (session.session_id, fork.session_id):
            reopened = await open_session(second, model, session_id)
            assert (await reopened.rpc.workspaces.list_files()).files == ["findings.md"]
            assert (await reopened.rpc.plan.read()).content == "# Plan"
            await reopened.disconnect()
    finally:
        await second.force_stop()


async def test_k16_checkpoints_are_the_summaries_of_the_compactions(
    client: CopilotClient,
) -> None:
    summary = "# Greetings\n\nThe user said hello twice."
    recorded = [
        conversation(user("First"), assistant("One.")),
        conversation(user("First"), assistant("One."), user("Second"), assistant("Two.")),
        conversation(
            {"role": "system", "content": COMPACTION_PROMPT},
            user("Conversation to summarise:\n\n[user] First"),
            assistant(summary),
        ),
    ]
    async with ReplayServer(recorded) as model:
        session = await open_session(client, model)
        ws = session.rpc.workspaces
        assert (await ws.list_checkpoints()).checkpoints == []
        await session.send_and_wait("First", timeout=30)
        await session.send_and_wait("Second", timeout=30)
        assert (await session.rpc.history.compact()).success
        [checkpoint] = (await ws.list_checkpoints()).checkpoints
        assert (checkpoint.number, checkpoint.title) == (1, "Greetings")
        read = await ws.read_checkpoint(WorkspacesReadCheckpointRequest(number=1))
        assert read.content == summary
        unknown = await ws.read_checkpoint(WorkspacesReadCheckpointRequest(number=2_147_483_647))
        assert unknown.content is None
        workspace = (await ws.get_workspace()).workspace
        assert workspace is not None and workspace.summary_count == 1
        await session.disconnect()


async def test_k16_writes_to_one_workspace_at_once_are_all_kept(
    client: CopilotClient, model: ReplayServer
) -> None:
    session = await open_session(client, model)
    await asyncio.gather(
        *(
            session.rpc.workspaces.create_file(
                WorkspacesCreateFileRequest(path=f"part-{i}.txt", content=str(i))
            )
            for i in range(20)
        )
    )
    files = (await session.rpc.workspaces.list_files()).files
    assert sorted(files) == sorted(f"part-{i}.txt" for i in range(20))
    await session.disconnect()
