"""`session.sendAndWait` on a server that does not own the session (issue 14, item 3; spec E5,
R1): two `trimtab serve` processes on one SQLite file, the official client connected to the
one that does not run the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from copilot import CopilotClient
from copilot.generated.session_events import AssistantMessageData
from copilot.session import PermissionHandler

from tests.server.conftest import ServerProcess, assistant, conversation, provider, user
from trimtab.store import open_store
from trimtab.testing import ReplayServer

TWO_RUNS = conversation(user("Say hi"), assistant("Hi!"), user("Say bye"), assistant("Bye!"))


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    db = tmp_path / "shared.db"
    servers = [ServerProcess(db, log=tmp_path / f"server-{n}.log") for n in range(2)]
    yield servers[0], servers[1]
    for server in servers:
        server.stop()


async def test_e5_r1_send_and_wait_on_a_server_that_does_not_own_the_session_returns(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """Before the follower told a run's end from the log, the non-owner's `sendAndWait`
    never answered: the owner's idle did not cross processes on SQLite."""
    owner_server = two_servers[0]
    clients = [CopilotClient(connection=server.connection()) for server in two_servers]
    async with ReplayServer([TWO_RUNS]) as model:
        options: dict[str, Any] = {
            "provider": provider(model),
            "model": "test-model",
            "on_permission_request": PermissionHandler.approve_all,
        }
        try:
            for client in clients:
                await client.start()
            owned = await clients[0].create_session(session_id="owned", **options)
            remote = await clients[1].resume_session("owned", **options)
            store = open_store(owner_server.store)
            lease_owner = (await store.get("owned")).lease_owner
            await store.close()
            # host:pid:nonce of the runtime holding the lease: the first server runs the session.
            assert lease_owner is not None
            assert lease_owner.split(":")[1] == str(owner_server.process.pid)
            seen: list[dict[str, object]] = []
            remote.on(lambda event: seen.append(event.to_dict()))

            # The official client returns once the `completionEventId` event has arrived too.
            replies = []
            for prompt in ("Say hi", "Say bye"):
                reply = await remote.send_and_wait(prompt, timeout=20)
                assert reply is not None and isinstance(reply.data, AssistantMessageData)
                replies.append(reply.data.content)
            events = await owned.get_events()
        finally:
            for client in clients:
                await client.force_stop()

    assert replies == ["Hi!", "Bye!"]
    assert len(model.requests) == 2  # each run made by the owner, once
    types = [e["type"] for e in seen]
    assert types.count("session.idle") == 2
    assert [e.type.value for e in events].count("user.message") == 2
