"""Issue 18: a well-known third-party MCP server from the npm registry (pinned, installed by
`.ci/run`), driven through trimtab by the scripted model, and MCP servers configured by the
official Copilot Python client over `trimtab serve` (spec MCP1, MCP9)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from copilot import CopilotClient
from copilot.session import PermissionHandler as CopilotPermissions

from tests.mcp.conftest import DEMO, assert_no_orphans, require_everything, stdio
from tests.mcp.test_mcp_tools import open_session, outcomes
from tests.server.conftest import (
    StartServer,
    assistant,
    call,
    conversation,
    provider,
    tool,
    user,
)
from trimtab import Client
from trimtab.testing import ReplayServer, ScriptedModel, tool_call


def everything() -> dict[str, Any]:
    return {"type": "local", "command": "node", "args": [str(require_everything()), "stdio"]}


async def test_mcp1_the_npm_everything_server_through_the_scripted_model() -> None:
    model = ScriptedModel(
        [
            [
                tool_call("everything__get-sum", {"a": 19, "b": 23}, id="c1"),
                tool_call("everything__echo", {"message": "hi"}, id="c2"),
                tool_call("everything__get-tiny-image", {}, id="c3"),
            ],
            "done",
        ]
    )
    async with Client(store="memory") as client:
        session = await open_session(client, model, mcp_servers={"everything": everything()})
        reply = await session.send_and_wait("go")
        events = await session.get_events()
    assert reply is not None and reply.data.content == "done"
    done = {o[0]: o for o in outcomes(events)}
    assert done["everything__get-sum"][1:] == ("success", "The sum of 19 and 23 is 42.")
    assert done["everything__echo"][1:] == ("success", "Echo: hi")
    assert "[image: image/png," in done["everything__get-tiny-image"][2]
    names = {t.name for t in model.requests[0].tools}
    assert {"everything__get-sum", "everything__echo"} <= names


async def run_over_serve(
    start_server: StartServer,
    servers: dict[str, Any],
    name: str,
    arguments: dict[str, Any],
    result: str,
) -> list[Any]:
    """One run over `trimtab serve`, configured by the official client's `mcp_servers`."""
    recorded = conversation(
        user("Use the tool"),
        assistant(None, call("call_1", name, **arguments)),
        tool("call_1", result),
        assistant(f"It said {result}."),
    )
    asked: list[Any] = []

    def permission(request: Any, invocation: Any) -> Any:
        asked.append(request)
        return CopilotPermissions.approve_all(request, invocation)

    # Over TCP a client's MCP commands run only where the operator allows them (spec S12).
    server = start_server(None, "--allow-mcp-commands")
    client = CopilotClient(connection=server.connection())
    await client.start()
    try:
        async with ReplayServer([recorded]) as model:
            session = await client.create_session(
                provider=provider(model),  # type: ignore[arg-type]
                model="test-model",
                on_permission_request=permission,
                mcp_servers=servers,
            )
            reply = await session.send_and_wait("Use the tool")
            await session.disconnect()
    finally:
        await client.force_stop()
    assert reply is not None and getattr(reply.data, "content", None) == f"It said {result}."
    return asked


async def test_mcp9_the_official_client_configures_mcp_servers_over_serve(
    start_server: StartServer, pids: Path, tmp_path: Path
) -> None:
    servers = {
        "demo": {**stdio(DEMO, pids=pids), "working_directory": str(tmp_path), "timeout": 20_000}
    }
    asked = await run_over_serve(start_server, servers, "demo__add", {"a": 40, "b": 2}, "42")
    (request,) = asked
    assert request.kind == "mcp"
    assert (request.server_name, request.tool_name, request.read_only) == ("demo", "add", False)
    assert_no_orphans(pids, runtime_pid=None)


async def test_mcp9_the_npm_server_over_serve_with_the_official_client(
    start_server: StartServer,
) -> None:
    servers = {"everything": {**everything(), "tools": ["*"]}}
    asked = await run_over_serve(
        start_server, servers, "everything__get-sum", {"a": 2, "b": 3}, "The sum of 2 and 3 is 5."
    )
    assert [(r.kind, r.server_name, r.tool_name) for r in asked] == [
        ("mcp", "everything", "get-sum")
    ]
