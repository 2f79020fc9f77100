"""A stalled model ends the run, not only the call (issue 14, item 6; spec M1, E1): a session
whose model server never sends its headers, or sends them and then nothing, ends the run with
a stored `session.error {error_type: "timeout"}` and one `session.idle` within the provider's
bound, retries included. The bounds are scaled down through the provider's config (their
defaults are checked against the README in tests/providers/test_deadlines.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.conftest import Recorder
from tests.fake_model import FakeModel
from tests.server.conftest import assistant, conversation, user
from trimtab import Client, SessionError
from trimtab.testing import ReplayServer

DEADLINE = 1.0
"""The provider's `stall_timeout` and `timeout` here, in seconds."""

MARGIN = 2.0
"""How much later than `DEADLINE` the run may end on a loaded machine (the error and the idle
come at once after the call's end; retries are inside the deadline)."""


@pytest.fixture(params=["no-headers", "headers-then-nothing"])
async def stalled(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The API root of a model server that stalls, each of its answers (retries included)."""
    if request.param == "no-headers":
        async with FakeModel(delay=60) as silent:
            yield silent.base_url
    else:
        hi = conversation(user("Say hi"), assistant("Hi there, how are you today?"))
        async with ReplayServer([hi]) as replay:
            replay.stall_next(60, times=3)
            yield replay.base_url


@pytest.mark.parametrize("streaming", [True, False], ids=["streamed", "unstreamed"])
async def test_m1_a_session_whose_model_stalls_ends_the_run_in_a_timeout_and_one_idle(
    stalled: str, streaming: bool
) -> None:
    """Before provider deadlines, the run waited 600 s (streamed) or 1,801 s (unstreamed)."""
    provider = {
        "type": "openai",
        "base_url": stalled,
        "api_key": "test-key",
        "stall_timeout": DEADLINE,
        "timeout": DEADLINE,
    }
    async with Client(store="memory") as client:
        session = await client.create_session(provider=provider, streaming=streaming)
        seen = Recorder(session)
        started = time.monotonic()
        with pytest.raises(SessionError, match="timeout"):
            async with asyncio.timeout(DEADLINE + MARGIN):
                await session.send_and_wait("Say hi")
        took = time.monotonic() - started
        await seen.wait_for("session.idle")
        log = await session.get_events()

    assert took < DEADLINE + MARGIN
    assert seen.types.count("session.idle") == 1
    assert seen.types[-2:] == ["session.error", "session.idle"]
    error = log[-1]
    assert error.type == "session.error" and not error.ephemeral
    assert (error.data.error_type, error.data.retryable) == ("timeout", True)
    # The user's message stays; the run's turn is closed before the error (spec section 4).
    assert [e.type for e in log[-4:]] == [
        "user.message",
        "assistant.turn_start",
        "assistant.turn_end",
        "session.error",
    ]
