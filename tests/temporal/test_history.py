"""What Temporal keeps of a session (spec EN1, EN7): ids, fences and counters, never a
message; a long session's workflow history stays bounded, continuing as new between runs."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.temporal.conftest import StartWorker
from trimtab import Client
from trimtab.store import MemoryStore
from trimtab.testing import ScriptedModel

pytestmark = pytest.mark.usefixtures("temporal_server")

RUNS = 1000

HISTORY_EVENTS = 2_500
"""The most events a session's current workflow history holds: it continues as new every
`ROLLOVER_RUNS` (200) attempts, of 11 events each, between runs."""

HISTORY_BYTES = 512 * 1024
"""The most bytes it holds (Temporal refuses a history past 50 MiB, and warns at 10)."""


async def test_en7_the_workflow_history_of_a_1000_run_session_stays_bounded(
    engine: Any, start_worker: StartWorker
) -> None:
    from trimtab.temporal._workflow import ROLLOVER_RUNS, workflow_id

    store = MemoryStore()  # shared by the client and the worker, both in this process
    secret = "a prompt Temporal must never see"
    model = ScriptedModel(then=lambda request: "an answer Temporal must never see")
    await start_worker(store, provider=model)
    async with Client(store=store, engine=engine) as client:
        session = await client.create_session(provider=model)
        started = time.perf_counter()
        for n in range(RUNS):
            await session.send_and_wait(f"{secret} {n}", timeout=30)
        took = time.perf_counter() - started
        latest = engine.client.get_workflow_handle(workflow_id(session.session_id))
        described = await latest.describe()
        current = engine.client.get_workflow_handle(described.id, run_id=described.run_id)
        history = await current.fetch_history()

    log = await store.read(session.session_id)
    assert sum(event.type == "user.message" for event in log) == RUNS
    events = len(history.events)
    size = sum(event.ByteSize() for event in history.events)
    print(f"{RUNS} runs in {took:.1f} s; current history: {events} events, {size} bytes")
    assert events <= HISTORY_EVENTS and size <= HISTORY_BYTES
    # It continued as new, carrying its counters: the fence goes on growing.
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id
    (carried,) = started.input.payloads
    counters = json.loads(carried.data)
    assert counters["runs"] >= ROLLOVER_RUNS and counters["fence"] == counters["runs"] + 1
    text = history.to_json()
    assert secret not in text and "never see" not in text  # no message in the history
