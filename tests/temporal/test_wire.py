"""The Copilot wire on an engine (spec EN1, EN6): `trimtab serve --engine` driven by the
official Copilot client, unchanged, while a worker runs the loop. The client's tools and
permission decisions reach the run through the server, the log and the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

pytest.importorskip("copilot", reason="needs the dev extra: the official Copilot client")

from tests.server.conftest import (  # noqa: E402 (after the skip: it imports the client)
    ServerProcess,
    assistant,
    call,
    conversation,
    provider,
    request_messages,
    tool,
    user,
)
from tests.server.drivers import Ctx, OfficialDriver, ToolSpec  # noqa: E402
from tests.temporal.conftest import StartWorker  # noqa: E402
from trimtab.testing import ReplayServer  # noqa: E402

pytestmark = pytest.mark.usefixtures("temporal_server")


class TextArgs(BaseModel):
    text: str


async def echo(params: TextArgs, ctx: Ctx) -> str:
    return params.text.upper()


ECHO_CONVERSATION = conversation(
    user("Use echo on hello"),
    assistant(None, call("call_1", "echo", text="hello")),
    tool("call_1", "HELLO"),
    assistant("The tool said HELLO."),
)


@pytest.fixture
def engine_server(pg_dsn: str, temporal_server: str, task_queue: str, tmp_path: Path) -> Any:
    """`trimtab serve --engine` on the test's task queue and store."""
    url = f"temporal://{temporal_server}/default?task_queue={task_queue}"
    server = ServerProcess(pg_dsn, "--engine", url, log=tmp_path / "server.log")
    yield server, server.connection()  # with the server's token
    assert server.stop() == 0, server.log.read_text()


@pytest.mark.parametrize("permission", [True, False], ids=["asked", "skipped"])
async def test_en6_the_official_client_runs_its_tool_for_a_run_on_the_engine(
    pg_dsn: str, engine: Any, engine_server: Any, start_worker: StartWorker, permission: bool
) -> None:
    server, connection = engine_server
    async with ReplayServer([ECHO_CONVERSATION]) as model:
        await start_worker(pg_dsn, provider=provider(model))
        driver = OfficialDriver("official-tcp", connection)
        await driver.start()
        try:
            spec = ToolSpec("echo", TextArgs, echo, skip_permission=not permission)
            session = await driver.open(provider(model), tools=[spec])
            reply = await session.send_and_wait("Use echo on hello", timeout=30)
        finally:
            await driver.stop()

    assert reply == "The tool said HELLO."
    assert await _attempts(engine, session.session_id) >= 1  # the worker ran it
    assert request_messages(model, 1)[-1] == ("tool", "HELLO")
    types = session.types()
    assert types.count("external_tool.requested") == 1
    assert types.count("permission.requested") == (1 if permission else 0)
    assert types[-1] == "session.idle" and types.count("session.idle") == 1
    assert session.of("tool.execution_complete")[0]["data"]["success"] is True


async def test_en1_a_plain_reply_reaches_the_official_client(
    pg_dsn: str, engine: Any, engine_server: Any, start_worker: StartWorker
) -> None:
    server, connection = engine_server
    async with ReplayServer([conversation(user("Say hello"), assistant("Hello there!"))]) as model:
        await start_worker(pg_dsn, provider=provider(model))
        driver = OfficialDriver("official-tcp", connection)
        await driver.start()
        try:
            session = await driver.open(provider(model))
            reply = await session.send_and_wait("Say hello", timeout=30)
            logged = await session.logged()
        finally:
            await driver.stop()

    assert reply == "Hello there!"
    assert await _attempts(engine, session.session_id) >= 1  # the worker ran it
    assert [e["type"] for e in logged if e["type"] == "assistant.message"] == ["assistant.message"]
    sent = session.of("user.message")[0]["data"]["messageId"]
    assert session.of("assistant.message")[0]["data"]["originatingMessageId"] == sent


async def _attempts(engine: Any, session_id: str) -> int:
    """The attempts the session's workflow completed: the server ran none of its runs."""
    from trimtab.temporal._workflow import workflow_id

    history = await engine.client.get_workflow_handle(workflow_id(session_id)).fetch_history()
    completed: int = history.to_json().count("EVENT_TYPE_ACTIVITY_TASK_COMPLETED")
    return completed
