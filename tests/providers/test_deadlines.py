"""Model calls are bounded (issue 14, item 6; spec M1), for every HTTP wire format.

A server that accepts the connection and never answers, or answers with headers and then
stalls, ends the call with `ProviderError("timeout")` within the call's deadline, retries
included: `stall_timeout` for a streamed call, `timeout` for an unstreamed one. The tests use
small values (and the defaults scaled down); the defaults themselves are checked against the
README without being waited for.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.fake_model import LocalServer
from trimtab._errors import ProviderError
from trimtab.providers import (
    Message,
    ModelRequest,
    Provider,
    ProviderConfig,
    _config,
    make_provider,
)
from trimtab.testing import Conversation, ConversationMessage, ReplayServer

README = Path(__file__).parents[2] / "README.md"

FAMILIES = ("chat", "responses", "anthropic")

DEADLINE = 1.0
"""The deadline the tests configure, in seconds."""

MARGIN = 1.0
"""How much later than its deadline a call may fail on a loaded machine. Under the deadline
again: a call whose retries each got the whole deadline would take three times as long."""

CONVERSATIONS = [
    Conversation(
        messages=[
            ConversationMessage(role="user", content="Say hello"),
            ConversationMessage(role="assistant", content="Hello there, how are you today?"),
        ]
    )
]


def provider(family: str, root_url: str, **options: Any) -> Provider:
    """A provider of `family` pointed at a server, with retries (the default, 2)."""
    config: dict[str, Any] = {"api_key": "test-key", **options}
    if family == "anthropic":
        config |= {"type": "anthropic", "base_url": root_url}
    else:
        wire_api = "responses" if family == "responses" else "completions"
        config |= {"type": "openai", "base_url": f"{root_url}/v1", "wire_api": wire_api}
    return make_provider(ProviderConfig.model_validate(config))


async def timed_out(model: Provider, *, stream: bool, bound: float) -> ProviderError:
    """The `timeout` error a call ends with; fails if the call waits longer than `bound` +
    `MARGIN` for its answer to start or, once it streams, for its next event (M1's bounds:
    the first event a process parses may pay one-time costs, such as building its models)."""
    request = ModelRequest(
        model="test-model", messages=(Message(role="user", content="Say hello"),), stream=stream
    )
    events = aiter(model.stream(request))
    try:
        with pytest.raises(ProviderError) as caught:
            while True:
                async with asyncio.timeout(bound + MARGIN):
                    await anext(events)
    finally:
        await model.aclose()
    assert (caught.value.error_type, caught.value.retryable) == ("timeout", True)
    return caught.value


class SilentServer(LocalServer):
    """Accepts connections, reads the requests, and never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        self.requests += 1
        await reader.read()  # until the client gives up and closes the connection


@pytest.fixture
async def silent() -> AsyncIterator[SilentServer]:
    async with SilentServer() as server:
        yield server


@pytest.fixture
async def replay() -> AsyncIterator[ReplayServer]:
    async with ReplayServer(CONVERSATIONS, chunk_size=4) as server:
        yield server


@pytest.fixture(scope="module", autouse=True)
def _first_calls_made() -> None:
    """One answered call per family and mode before any is timed. A process's first call of a
    family imports and builds its SDK's models, holding the event loop (0.9 s for Responses on
    a loaded 2-core machine, more under heavier load) where no deadline can fire: M1 allows
    that first call the cost, and these tests time the deadlines, not the imports."""

    async def call_each() -> None:
        async with ReplayServer(CONVERSATIONS, chunk_size=4) as server:
            for family in FAMILIES:
                for stream in (True, False):
                    model = provider(family, server.root_url)
                    message = Message(role="user", content="Say hello")
                    request = ModelRequest(model="test-model", messages=(message,), stream=stream)
                    try:
                        _ = [event async for event in model.stream(request)]
                    finally:
                        await model.aclose()

    asyncio.run(call_each())


# --- the defaults ---------------------------------------------------------------------------


def test_m1_the_default_bounds_are_the_documented_ones() -> None:
    config = ProviderConfig(type="openai")

    assert config.deadline(stream=True) == config.stall_seconds == 120.0
    assert config.deadline(stream=False) == 300.0
    assert _config.CONNECT_TIMEOUT == 10.0
    assert config.max_retries == 2
    providers = README.read_text(encoding="utf-8").split("### Providers", 1)[1]
    providers = " ".join(providers.split("### Stores", 1)[0].split())
    for documented in (
        r"`stall_timeout` \(default 120 s\)",
        r"`timeout` \(default 300 s\)",
        r"connect[^.]*10 s",
        r"`--timeout SECONDS`",
    ):
        assert re.search(documented, providers), documented


def test_m1_w3_a_bound_must_be_positive_and_finite() -> None:
    for options in (
        {"timeout": 0},
        {"stall_timeout": -1},
        {"timeout": float("nan")},
        {"stall_timeout": float("inf")},
    ):
        with pytest.raises(ValidationError):
            ProviderConfig(type="openai", **options)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "unstreamed"])
async def test_m1_with_the_defaults_scaled_down_a_silent_server_times_out_within_them(
    silent: SilentServer, monkeypatch: pytest.MonkeyPatch, family: str, stream: bool
) -> None:
    # The defaults, a hundredth of them: a config that sets neither bound gets these.
    monkeypatch.setattr(_config, "DEFAULT_STALL_TIMEOUT", 1.2)
    monkeypatch.setattr(_config, "DEFAULT_TIMEOUT", 3.0)

    await timed_out(provider(family, silent.root_url), stream=stream, bound=1.2 if stream else 3.0)


# --- a server that accepts and never answers ------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "unstreamed"])
async def test_m1_no_headers_ends_the_call_within_its_deadline_retries_included(
    silent: SilentServer, family: str, stream: bool
) -> None:
    # Only the call's own bound is small: the other one would let it wait far longer.
    bound = {"stall_timeout": DEADLINE} if stream else {"timeout": DEADLINE}
    other = {"timeout": 60.0} if stream else {"stall_timeout": 60.0}
    model = provider(family, silent.root_url, **bound, **other)

    error = await timed_out(model, stream=stream, bound=DEADLINE)

    assert silent.requests >= 1
    if not stream:
        assert "no answer within 1 s" in error.message or "timed out" in error.message


# --- headers, then nothing --------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("events", [0, 3], ids=["before-the-first-event", "mid-stream"])
async def test_m1_a_stream_that_stalls_after_its_headers_ends_within_the_stall_timeout(
    replay: ReplayServer, family: str, events: int
) -> None:
    replay.stall_next(30.0, after=events)

    model = provider(family, replay.root_url, stall_timeout=DEADLINE, timeout=60.0)

    await timed_out(model, stream=True, bound=DEADLINE)


@pytest.mark.parametrize("family", FAMILIES)
async def test_m1_an_unstreamed_answer_that_stalls_after_its_headers_ends_within_the_timeout(
    replay: ReplayServer, family: str
) -> None:
    replay.stall_next(30.0, times=3)  # every retry stalls too

    model = provider(family, replay.root_url, timeout=DEADLINE, stall_timeout=60.0)

    await timed_out(model, stream=False, bound=DEADLINE)


async def test_m1_a_slow_answer_inside_the_deadline_is_not_cut(replay: ReplayServer) -> None:
    replay.stall_next(0.3)  # headers, a pause, then the answer
    model = provider("chat", replay.root_url, timeout=DEADLINE)
    request = ModelRequest(
        model="test-model", messages=(Message(role="user", content="Say hello"),)
    )

    started = time.monotonic()
    events = [event async for event in model.stream(request)]
    await model.aclose()

    assert events[-1].kind == "response"
    assert time.monotonic() - started >= 0.3


# --- what the stall timeout measures ----------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
async def test_m1_the_consumers_time_between_events_is_no_stall(
    replay: ReplayServer, family: str
) -> None:
    # The stream waits for its consumer (the session's handlers) between events: only the
    # waits for the server count against `stall_timeout`.
    model = provider(family, replay.root_url, stall_timeout=0.2)
    request = ModelRequest(
        model="test-model", messages=(Message(role="user", content="Say hello"),), stream=True
    )
    kinds = []
    async for event in model.stream(request):
        kinds.append(event.kind)
        await asyncio.sleep(0.3)  # longer than the stall timeout, between two events
    await model.aclose()
    assert kinds[-1] == "response" and len(kinds) > 2


@pytest.mark.parametrize("family", FAMILIES)
async def test_m1_an_abort_during_a_wait_is_a_cancellation_not_a_timeout(
    replay: ReplayServer, family: str
) -> None:
    replay.stall_next(30.0, after=2)
    model = provider(family, replay.root_url, stall_timeout=DEADLINE)
    request = ModelRequest(
        model="test-model", messages=(Message(role="user", content="Say hello"),), stream=True
    )

    async def consume() -> None:
        async for _ in model.stream(request):
            pass

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(DEADLINE / 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await model.aclose()
    # The task's cancellation was its own: nothing of the stall watch was left on it.
    assert task.cancelled()


async def test_m1_a_stall_after_many_events_still_ends_the_stream(
    replay: ReplayServer,
) -> None:
    # The watch is armed once per stall timeout, not per event: a stream that ran long
    # before stalling is caught as fast as one that stalls at once.
    replay.stall_next(30.0, after=6)
    model = provider("chat", replay.root_url, stall_timeout=DEADLINE, timeout=60.0)
    started = time.monotonic()
    await timed_out(model, stream=True, bound=DEADLINE)
    assert time.monotonic() - started < DEADLINE + MARGIN + 1


async def test_m1_a_stall_leaves_the_task_as_it_found_it(replay: ReplayServer) -> None:
    # The stall is the watch's own cancellation, taken back: a timeout the caller sets later
    # in the same task still reads as a timeout, not as a cancellation.
    replay.stall_next(30.0, after=2)
    model = provider("chat", replay.root_url, stall_timeout=0.3, timeout=60.0)
    await timed_out(model, stream=True, bound=0.3)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await asyncio.sleep(1)


# --- retries within the deadline --------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "unstreamed"])
async def test_m1_a_retry_whose_wait_outlasts_the_deadline_is_not_waited_for(
    replay: ReplayServer, family: str, stream: bool
) -> None:
    # The server asks for 30 s; the call has 2 in all: it fails at once with the server's
    # answer (which says how long to wait), not with a timeout 2 s later.
    replay.fail_next(429, retry_after=30, times=3)
    model = provider(family, replay.root_url, timeout=2.0, stall_timeout=2.0, max_retries=2)
    request = ModelRequest(
        model="test-model", messages=(Message(role="user", content="Say hello"),), stream=stream
    )
    started = time.monotonic()
    try:
        with pytest.raises(ProviderError) as caught:
            async for _ in model.stream(request):
                pass
    finally:
        await model.aclose()

    assert time.monotonic() - started < 1.5
    error = caught.value
    assert (error.error_type, error.retryable, error.retry_after) == ("rate_limit", True, 30)
    assert len(replay.received) == 1


@pytest.mark.parametrize("family", FAMILIES)
async def test_m1_a_retry_whose_wait_fits_the_deadline_is_made(
    replay: ReplayServer, family: str
) -> None:
    replay.fail_next(429, retry_after=0.2)
    model = provider(family, replay.root_url, timeout=5.0, max_retries=1)
    request = ModelRequest(
        model="test-model", messages=(Message(role="user", content="Say hello"),)
    )
    try:
        events = [event async for event in model.stream(request)]
    finally:
        await model.aclose()

    assert events[-1].kind == "response"
    first, second = replay.received
    assert second.at - first.at >= 0.2
