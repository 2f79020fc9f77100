"""Determinism (spec EN8): the session workflow of this commit replays every history recorded
by earlier code (`tests/temporal/histories`, written by `record_histories.py`), so that a
change that would break the sessions running through a release fails here first."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.temporal.conftest import require_temporalio

HISTORIES = Path(__file__).parent / "histories"

REPLAY_TIMEOUT = 30.0
"""Seconds one replay may take (they take milliseconds: a replay that waits for a workflow
task its history lacks would wait for ever)."""


async def test_en8_the_workflow_replays_the_histories_recorded_by_earlier_code() -> None:
    require_temporalio()
    from temporalio.client import WorkflowHistory
    from temporalio.worker import Replayer
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    from trimtab.temporal._workflow import SessionWorkflow

    files = sorted(HISTORIES.glob("*.json"))
    assert len(files) >= 9, "the recorded histories are missing"
    replayer = Replayer(
        workflows=[SessionWorkflow],
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules("trimtab")
        ),
    )
    failures: dict[str, str] = {}
    for path in files:
        history = WorkflowHistory.from_json(path.stem, path.read_text())
        replaying = replayer.replay_workflow(history, raise_on_replay_failure=False)
        result = await asyncio.wait_for(replaying, REPLAY_TIMEOUT)
        if result.replay_failure is not None:
            failures[path.name] = str(result.replay_failure)

    assert failures == {}


@pytest.mark.parametrize(
    "name", ["taken_over", "fence_behind", "aborted_running", "given_up", "rolled_over"]
)
def test_en8_the_recorded_histories_hold_the_paths_they_guard(name: str) -> None:
    """Each recorded history still goes through the path it was recorded for."""
    text = (HISTORIES / f"{name}-0.json").read_text()
    marks = {
        "taken_over": "EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT",
        "fence_behind": "FenceBehind",
        "aborted_running": "EVENT_TYPE_ACTIVITY_TASK_CANCELED",
        "given_up": "EVENT_TYPE_TIMER_FIRED",
        "rolled_over": "EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW",
    }
    assert marks[name] in text
