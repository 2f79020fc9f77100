"""A remote session's `send_and_wait` across processes on SQLite (issue 14, item 3; spec E5,
R1): the owner's ephemeral `session.idle` stays in its process there, so the follower must
tell the run's end from the log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Recorder
from tests.store.processes import child, next_line
from trimtab import Client, PermissionHandler, SessionError
from trimtab.testing import ScriptedModel

# Owns one session on a SQLite file with a model that answers each prompt by name (and fails
# on "fail"), and holds it until its stdin closes.
OWNER = """
import asyncio, sys
from trimtab import Client, ProviderError
from trimtab.testing import ScriptedModel

def answer(request):
    prompt = request.messages[-1].content
    if prompt == "fail":
        return ProviderError("rate_limit", "the owner's model refused", status_code=429)
    return f"the owner answers {prompt}"

async def main(path, session_id):
    async with Client(store=path, poll_interval=0.05) as client:
        await client.create_session(session_id=session_id, provider=ScriptedModel(then=answer))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_e5_r1_remote_send_and_wait_on_sqlite_returns_when_the_owner_process_ends_the_run(
    tmp_path: Path,
) -> None:
    """Before the follower told a run's end from the log, this waited forever: the owner's
    idle never crossed processes on SQLite."""
    db = tmp_path / "shared.db"
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    async with child(script, str(db), "owned") as owner, Client(store=db) as other:
        model = ScriptedModel()  # never called: the owner runs the session
        remote = await other.resume_session("owned", provider=model)
        seen = Recorder(remote)
        assert remote.is_remote

        reply = await remote.send_and_wait("hello", timeout=20)
        assert reply is not None and reply.data.content == "the owner answers hello"
        await seen.wait_for("session.idle")

        with pytest.raises(SessionError, match="the owner's model refused"):
            await remote.send_and_wait("fail", timeout=20)
        await seen.wait_for("session.idle", 2)

        reply = await remote.send_and_wait("again", timeout=20)
        assert reply is not None and reply.data.content == "the owner answers again"
        await seen.wait_for("session.idle", 3)

        assert remote.is_remote and model.requests == []
        # One idle per run, each after its run's last stored event.
        runs = [t for t in seen.types if t in ("user.message", "session.error", "session.idle")]
        assert runs == [
            "user.message",
            "session.idle",
            "user.message",
            "session.error",
            "session.idle",
            "user.message",
            "session.idle",
        ]
        assert owner.stdin is not None
        owner.stdin.write(b"\n")
        assert await next_line(owner) == "done"


# Owns a session whose tool handler blocks the event loop past the lease's ttl (no renewal),
# then prints what the session delivered, as JSON: (type, error type) pairs.
LAPSING_OWNER = """
import asyncio, json, sys, time
from trimtab import Client, PermissionHandler, define_tool
from trimtab.testing import ScriptedModel, tool_call

async def blocker(params):
    print("blocking", flush=True)
    time.sleep(2.0)  # the event loop stops: the lease lapses
    return "blocked"

async def main(path):
    async with Client(store=path, lease_ttl=0.5, poll_interval=0.05) as client:
        session = await client.create_session(
            session_id="lapsing",
            provider=ScriptedModel([tool_call("blocker")], then=lambda request: "extra"),
            tools=[define_tool("blocker", handler=blocker)],
            on_permission_request=PermissionHandler.approve_all,
        )
        seen = []
        session.on(lambda event: seen.append(
            (event.type, getattr(event.data, "error_type", None))
        ))
        print("ready", flush=True)
        try:
            await asyncio.wait_for(session.send_and_wait("go"), 20)
        except Exception:
            pass
        await asyncio.sleep(1.0)
        print(json.dumps(seen), flush=True)

asyncio.run(main(sys.argv[1]))
"""


async def test_e1_a_runtime_that_loses_its_lease_mid_run_delivers_one_idle_last(
    tmp_path: Path,
) -> None:
    """Before, the old owner delivered the run's end and idle as it followed the new owner's
    log, then its own `lease_lost` error and a second idle."""
    db = tmp_path / "shared.db"
    script = tmp_path / "owner.py"
    script.write_text(LAPSING_OWNER)
    async with child(script, str(db)) as owner:
        assert await next_line(owner) == "blocking"
        async with Client(store=db, lease_ttl=0.5, poll_interval=0.05) as taker:
            await taker.resume_session(
                "lapsing",
                provider=ScriptedModel(then=lambda request: "taken over"),
                on_permission_request=PermissionHandler.approve_all,
            )
            delivered = json.loads(await next_line(owner, timeout=30))
    types = [kind for kind, _ in delivered]
    assert types.count("session.idle") == 1 and types[-1] == "session.idle", types
