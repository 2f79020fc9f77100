"""A remote session's `send_and_wait` across processes on SQLite (issue 14, item 3; spec E5,
R1): the owner's ephemeral `session.idle` stays in its process there, so the follower must
tell the run's end from the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Recorder
from tests.store.processes import child, next_line
from trimtab import Client, SessionError
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
