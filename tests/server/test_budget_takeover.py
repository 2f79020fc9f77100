"""A run's budget after a takeover (issue 39; spec U3, R1): the server running the run is
killed mid-model-call, another server sharing the store (a SQLite file, or PostgreSQL) takes
the session over and goes on with the run, counting what the first one spent: the budget is
the log's, not a process's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pydantic import BaseModel

from tests.conftest import Recorder
from tests.server.conftest import ServerProcess, assistant, call, conversation, provider, tool, user
from tests.server.test_scaleout import (  # noqa: F401 (fixtures)
    TTL,
    backend,
    check_log,
    kill_9,
    servers,
    store,
    until,
)
from trimtab import PermissionHandler, define_tool
from trimtab.events import Budget
from trimtab.testing import ReplayServer


class TextArgs(BaseModel):
    text: str


async def test_u3_r1_a_runs_budget_holds_after_a_takeover(
    servers: Callable[[], ServerProcess],  # noqa: F811
) -> None:
    looping = conversation(
        user("go"),
        assistant(None, call("c1", "echo", text="a")),
        tool("c1", "a"),
        assistant(None, call("c2", "echo", text="b")),
        tool("c2", "b"),
        assistant("never asked for: the budget ends the run before"),
    )
    released = asyncio.Event()

    async def held_echo(params: TextArgs) -> str:
        await released.wait()  # until the test has set the model to stall its next answer
        return params.text

    approve = PermissionHandler.approve_all
    async with ReplayServer([looping]) as model:
        owner, other = servers(), servers()
        async with owner.remote() as first:
            echo = define_tool("echo", params_type=TextArgs, handler=held_echo)
            session = await first.create_session(
                provider=provider(model), tools=[echo], on_permission_request=approve
            )
            await session.send("go", budget=Budget(model_calls=2))
            await until(lambda: len(model.requests) == 1)
            model.stall_next(60)
            released.set()
            await until(lambda: len(model.requests) == 2)  # the second call hangs: kill
            kill_9(owner)

        async with other.remote() as second:
            echo = define_tool("echo", params_type=TextArgs, handler=lambda params: params.text)
            resumed = await second.resume_session(
                session.session_id,
                provider=provider(model),
                tools=[echo],
                on_permission_request=approve,
            )
            seen = Recorder(resumed)  # type: ignore[arg-type]
            await seen.wait_for("session.idle", timeout=TTL + 15)
            log = await resumed.get_events()

    check_log(log)
    # The cut call was made again by the new owner; its answer was the budget's second call.
    assert len(model.requests) == 3
    assert [e.type for e in log].count("assistant.usage") == 2
    error = log[-1]
    assert error.type == "session.error" and error.data.error_type == "budget_exceeded"
    assert "model_calls budget of 2" in error.data.message
    assert seen.types.count("session.idle") == 1
