"""One suite, every backend: the semantics of the `Store` protocol.

Lease tests use real time with tiny TTLs. To stay robust on a loaded machine, a test only
ever relies on a lease having expired after sleeping past its TTL (sleeps never end early),
and uses long TTLs wherever a lease must still be live.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from datetime import UTC
from pathlib import Path

import pytest

from trimtab._errors import LeaseLostError, PruneError, SessionNotFoundError
from trimtab.events import (
    AssistantMessageData,
    AssistantMessageDeltaData,
    AssistantMessageDeltaEvent,
    AssistantMessageEvent,
    Event,
    EventAdapter,
    PrunedData,
    SessionConfigData,
    SessionPrunedEvent,
    SessionStartData,
    SessionStartEvent,
    ToolDefinition,
    ToolExecutionCompleteData,
    ToolExecutionCompleteEvent,
    ToolRequest,
    ToolResultContent,
    UserMessageData,
    UserMessageEvent,
)
from trimtab.store import Lease, MemoryStore, SqliteStore, Store

SHORT_TTL = 0.05
"""A lease that is surely expired after `sleep_past(SHORT_TTL)`."""

LONG_TTL = 60.0
"""A lease that surely outlives the test."""


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Each backend in turn, empty; SQLite in a directory that does not exist yet, and
    PostgreSQL in a fresh schema (`pg_dsn`)."""
    backend = open_backend(request, tmp_path)
    yield backend
    await backend.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """The backends that outlive the process (the memory store has no unknown outcomes)."""
    backend = open_backend(request, tmp_path)
    yield backend
    await backend.close()


def open_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "memory":
        return MemoryStore()
    if request.param == "sqlite":
        return SqliteStore(tmp_path / "not" / "yet" / "trimtab.db")
    dsn = request.getfixturevalue("pg_dsn")  # skips (or fails in CI) without a server
    from trimtab.store.postgres import PostgresStore

    return PostgresStore(dsn)


async def take(events: AsyncIterator[Event], count: int) -> list[Event]:
    """The next `count` events of a subscription; fails if they take over 5 s."""
    async with asyncio.timeout(5):
        return [await anext(events) for _ in range(count)]


async def drain(events: AsyncIterator[Event]) -> list[Event]:
    """Every event until the subscription ends; fails if it has not ended within 5 s."""
    async with asyncio.timeout(5):
        return [event async for event in events]


def user(content: str) -> UserMessageEvent:
    return UserMessageEvent(data=UserMessageData(content=content, source="user"))


def assistant(content: str) -> AssistantMessageEvent:
    return AssistantMessageEvent(data=AssistantMessageData(message_id="m", content=content))


def contents(events: list[Event]) -> list[str]:
    """The text of each user or assistant message, in order."""
    return [
        e.data.content for e in events if isinstance(e, UserMessageEvent | AssistantMessageEvent)
    ]


async def sleep_past(ttl: float) -> None:
    await asyncio.sleep(ttl * 2)


async def make(store: Store, *session_ids: str) -> None:
    for session_id in session_ids:
        await store.create(session_id)


# --- the log -----------------------------------------------------------------------------


async def test_new_session_has_an_empty_log(store: Store) -> None:
    await store.create("s")

    assert await store.read("s") == []
    assert (await store.get("s")).event_count == 0


async def test_append_returns_the_new_count_and_read_keeps_order(store: Store) -> None:
    await store.create("s")

    assert await store.append("s", [user("a"), assistant("b")], lease=None) == 2
    assert await store.append("s", [user("c")], lease=None) == 3

    assert contents(await store.read("s")) == ["a", "b", "c"]


async def test_read_after_returns_only_later_events(store: Store) -> None:
    await store.create("s")
    await store.append("s", [user("a"), user("b"), user("c")], lease=None)

    assert contents(await store.read("s", after=1)) == ["b", "c"]
    assert contents(await store.read("s", after=3)) == []


async def test_events_round_trip_unchanged(store: Store) -> None:
    events: list[Event] = [
        SessionStartEvent(
            data=SessionStartData(
                session_id="s",
                config=SessionConfigData(
                    model="m", tools=[ToolDefinition(name="finish", is_terminal=True)]
                ),
            )
        ),
        user("héllo ✓\nwith a newline"),
        AssistantMessageEvent(
            parent_id="p",
            context_epoch=2,
            data=AssistantMessageData(
                message_id="m1",
                tool_requests=[
                    ToolRequest(tool_call_id="c1", name="add", arguments={"a": 1, "b": [2.5]}),
                    ToolRequest(tool_call_id="c2", name="raw", arguments="not json {"),
                ],
            ),
        ),
        ToolExecutionCompleteEvent(
            data=ToolExecutionCompleteData(
                tool_call_id="c1",
                success=True,
                outcome="success",
                result=ToolResultContent(content="3"),
            )
        ),
    ]
    await store.create("s")
    await store.append("s", events, lease=None)

    assert await store.read("s") == events


async def test_events_round_trip_byte_for_byte(store: Store) -> None:
    # Tool arguments keep their key order and odd characters: the window replays them.
    events: list[Event] = [
        user('nul \x00 and escapes \\ " \u2028 end'),
        AssistantMessageEvent(
            data=AssistantMessageData(
                message_id="m",
                tool_requests=[
                    ToolRequest(
                        tool_call_id="c", name="f", arguments={"zeta": 1.0, "alpha": 1e100, "m": {}}
                    )
                ],
            )
        ),
    ]
    await store.create("s")
    await store.append("s", events, lease=None)

    stored = await store.read("s")

    assert [EventAdapter.dump_json(e) for e in stored] == [
        EventAdapter.dump_json(e) for e in events
    ]


async def test_empty_append_returns_the_count_and_changes_nothing(store: Store) -> None:
    await store.create("s")
    await store.append("s", [user("a")], lease=None)
    before = await store.get("s")

    assert await store.append("s", [], lease=None) == 1
    assert await store.get("s") == before


async def test_concurrent_appends_keep_call_order(store: Store) -> None:
    await store.create("s")

    counts = await asyncio.gather(
        *(store.append("s", [user(str(n))], lease=None) for n in range(20))
    )

    assert counts == list(range(1, 21))
    assert contents(await store.read("s")) == [str(n) for n in range(20)]


async def test_ephemeral_event_is_refused_and_nothing_of_its_batch_is_stored(
    store: Store,
) -> None:
    await store.create("s")
    delta = AssistantMessageDeltaEvent(
        data=AssistantMessageDeltaData(message_id="m", delta_content="x")
    )

    with pytest.raises(ValueError, match="ephemeral"):
        await store.append("s", [user("a"), delta, user("b")], lease=None)

    assert await store.read("s") == []
    assert await store.append("s", [user("c")], lease=None) == 1


# --- sessions ----------------------------------------------------------------------------


async def test_duplicate_create_raises_value_error(store: Store) -> None:
    await store.create("s")
    await store.append("s", [user("a")], lease=None)

    with pytest.raises(ValueError, match="already exists"):
        await store.create("s")
    assert len(await store.read("s")) == 1


UNKNOWN_SESSION_CALLS: dict[str, Callable[[Store], Awaitable[object]]] = {
    "append": lambda s: s.append("nope", [user("a")], lease=None),
    "read": lambda s: s.read("nope"),
    "get": lambda s: s.get("nope"),
    "acquire_lease": lambda s: s.acquire_lease("nope", "w", LONG_TTL),
    "claim_lease": lambda s: s.claim_lease("nope", "w", 1, LONG_TTL),
    "enqueue_input": lambda s: s.enqueue_input("nope", "hi", "m1"),
    "pending_inputs": lambda s: s.pending_inputs("nope"),
    "discard_inputs": lambda s: s.discard_inputs("nope", ["m1"]),
    "rewrite_inputs": lambda s: s.rewrite_inputs("nope", [], [("hi", "m1")]),
}


@pytest.mark.parametrize("call", UNKNOWN_SESSION_CALLS.values(), ids=UNKNOWN_SESSION_CALLS.keys())
async def test_unknown_session_raises_session_not_found(
    store: Store, call: Callable[[Store], Awaitable[object]]
) -> None:
    await store.create("other")

    with pytest.raises(SessionNotFoundError):
        await call(store)


async def test_get_reports_count_times_and_no_owner(store: Store) -> None:
    await store.create("s")
    created = await store.get("s")
    await asyncio.sleep(0.01)
    await store.append("s", [user("a"), user("b")], lease=None)

    record = await store.get("s")

    assert record.session_id == "s"
    assert record.event_count == 2
    assert record.lease_owner is None
    assert record.created_at == created.created_at
    assert record.created_at.tzinfo is not None
    assert record.created_at.astimezone(UTC) < record.updated_at.astimezone(UTC)


async def test_list_orders_by_most_recent_update(store: Store) -> None:
    assert await store.list_sessions() == []
    for session_id in ("a", "b", "c"):
        await store.create(session_id)
        await asyncio.sleep(0.01)
    await store.append("a", [user("x")], lease=None)

    records = await store.list_sessions()

    assert [r.session_id for r in records] == ["a", "c", "b"]
    assert records[0] == await store.get("a")


async def test_delete_removes_the_session_its_log_and_its_inputs(store: Store) -> None:
    await make(store, "s", "keep")
    await store.append("s", [user("a")], lease=None)
    await store.enqueue_input("s", "queued", "m1")
    await store.append("keep", [user("k")], lease=None)

    assert await store.delete("s") is True

    with pytest.raises(SessionNotFoundError):
        await store.get("s")
    assert [r.session_id for r in await store.list_sessions()] == ["keep"]
    await store.create("s")
    assert await store.read("s") == []
    assert await store.pending_inputs("s") == []
    assert contents(await store.read("keep")) == ["k"]


async def test_delete_unknown_session_returns_false(store: Store) -> None:
    assert await store.delete("nope") is False


async def test_summary_is_the_first_non_blank_user_message(store: Store) -> None:
    await store.create("s")
    start = SessionStartEvent(data=SessionStartData(session_id="s"))
    await store.append("s", [start], lease=None)
    assert (await store.get("s")).summary is None

    await store.append(
        "s", [assistant("hello"), user(" \n"), user("first"), user("second")], lease=None
    )
    await store.append("s", [user("third")], lease=None)

    assert (await store.get("s")).summary == "first"


async def test_summary_is_one_line_and_shortened(store: Store) -> None:
    await store.create("s")
    await store.append("s", [user("  line one\n\tline   two " + "x" * 200)], lease=None)

    summary = (await store.get("s")).summary

    assert summary is not None
    assert len(summary) <= 80
    assert summary.startswith("line one line two xxx")
    assert summary.endswith("…")


async def test_s16_the_owner_is_the_start_events_and_listed(store: Store) -> None:
    owned = SessionStartEvent(data=SessionStartData(session_id="a", owner="alice"))
    await store.create("a", [owned])
    await store.create("none", [SessionStartEvent(data=SessionStartData(session_id="none"))])
    await store.create("empty")
    # Appended later, a start event (a log's copy, say) names nobody's session.
    await store.append("empty", [owned], lease=None)

    owners = {record.session_id: record.owner for record in await store.list_sessions()}
    assert owners == {"a": "alice", "none": None, "empty": None}
    assert (await store.get("a")).owner == "alice"


async def test_closed_store_refuses_calls(store: Store) -> None:
    await store.create("s")
    await store.close()

    with pytest.raises(RuntimeError, match="closed"):
        await store.read("s")
    await store.close()  # closing twice is harmless


# --- leases (spec R1) --------------------------------------------------------------------


async def test_r1_lease_is_refused_while_another_owner_holds_it(store: Store) -> None:
    await store.create("s")
    lease = await store.acquire_lease("s", "w1", LONG_TTL)

    assert lease == Lease(session_id="s", owner="w1", token=1)
    assert await store.acquire_lease("s", "w2", LONG_TTL) is None
    assert (await store.get("s")).lease_owner == "w1"


async def test_r1_fenced_append_is_rejected_after_takeover_of_expired_lease(
    store: Store,
) -> None:
    await store.create("s")
    stale = await store.acquire_lease("s", "w1", SHORT_TTL)
    assert stale is not None
    assert await store.append("s", [user("by w1")], lease=stale) == 1
    await sleep_past(SHORT_TTL)

    fresh = await store.acquire_lease("s", "w2", LONG_TTL)

    assert fresh is not None
    assert fresh.token == stale.token + 1
    with pytest.raises(LeaseLostError):
        await store.append("s", [user("stale 1"), user("stale 2")], lease=stale)
    assert await store.append("s", [user("by w2")], lease=fresh) == 2
    assert contents(await store.read("s")) == ["by w1", "by w2"]


async def test_r1_fenced_append_is_rejected_once_the_lease_expired(store: Store) -> None:
    await store.create("s")
    lease = await store.acquire_lease("s", "w1", SHORT_TTL)
    assert lease is not None
    await sleep_past(SHORT_TTL)

    with pytest.raises(LeaseLostError):
        await store.append("s", [user("late")], lease=lease)
    assert await store.read("s") == []


async def test_r1_lease_of_another_session_does_not_fence(store: Store) -> None:
    await make(store, "s", "t")
    await store.acquire_lease("s", "w1", LONG_TTL)
    other = await store.acquire_lease("t", "w1", LONG_TTL)
    assert other is not None

    with pytest.raises(LeaseLostError):
        await store.append("s", [user("x")], lease=other)


async def test_unfenced_append_ignores_leases(store: Store) -> None:
    await store.create("s")
    await store.acquire_lease("s", "w1", LONG_TTL)

    assert await store.append("s", [user("x")], lease=None) == 1


async def test_reacquiring_own_live_lease_keeps_the_token_and_extends_it(store: Store) -> None:
    await store.create("s")
    first = await store.acquire_lease("s", "w1", 0.2)

    again = await store.acquire_lease("s", "w1", LONG_TTL)
    await sleep_past(0.2)

    assert again == first
    assert await store.acquire_lease("s", "w2", LONG_TTL) is None
    assert await store.append("s", [user("still mine")], lease=first) == 1


async def test_reacquiring_own_expired_lease_gets_a_new_token(store: Store) -> None:
    await store.create("s")
    first = await store.acquire_lease("s", "w1", SHORT_TTL)
    assert first is not None
    await sleep_past(SHORT_TTL)

    again = await store.acquire_lease("s", "w1", LONG_TTL)

    assert again is not None
    assert again.token == first.token + 1
    with pytest.raises(LeaseLostError):
        await store.append("s", [user("old")], lease=first)


async def test_en3_a_claim_with_a_greater_fence_takes_a_live_lease_and_fences_its_holder(
    store: Store,
) -> None:
    await store.create("s")
    held = await store.acquire_lease("s", "w1", LONG_TTL)
    assert held is not None and held.token == 1

    claimed = await store.claim_lease("s", "engine:a", 5, LONG_TTL)

    assert claimed == Lease(session_id="s", owner="engine:a", token=5)
    assert (await store.get("s")).lease_owner == "engine:a"
    with pytest.raises(LeaseLostError):
        await store.append("s", [user("stale")], lease=held)
    assert await store.append("s", [user("by a")], lease=claimed) == 1


async def test_en3_a_claim_behind_the_session_token_is_refused_with_that_token(
    store: Store,
) -> None:
    await store.create("s")
    later = await store.claim_lease("s", "engine:b", 7, LONG_TTL)
    assert isinstance(later, Lease)

    # An earlier attempt whose claim arrives late, and one of the same fence by another.
    assert await store.claim_lease("s", "engine:a", 6, LONG_TTL) == 7
    assert await store.claim_lease("s", "engine:c", 7, LONG_TTL) == 7
    # The same claim repeated (its first answer was lost) is the same lease.
    assert await store.claim_lease("s", "engine:b", 7, LONG_TTL) == later
    assert await store.append("s", [user("by b")], lease=later) == 1


async def test_renew_extends_every_live_lease_of_the_owner(store: Store) -> None:
    await make(store, "s1", "s2", "s3")
    lease = await store.acquire_lease("s2", "w1", 0.3)
    await store.acquire_lease("s1", "w1", 0.3)
    await store.acquire_lease("s3", "w2", 0.3)

    assert await store.renew_leases("w1", LONG_TTL) == ["s1", "s2"]
    await sleep_past(0.3)

    assert [r.lease_owner for r in await store.list_sessions() if r.session_id != "s3"] == [
        "w1",
        "w1",
    ]
    assert (await store.get("s3")).lease_owner is None
    assert await store.append("s2", [user("x")], lease=lease) == 1


async def test_renew_skips_expired_leases(store: Store) -> None:
    await store.create("s")
    lease = await store.acquire_lease("s", "w1", SHORT_TTL)
    await sleep_past(SHORT_TTL)

    assert await store.renew_leases("w1", LONG_TTL) == []
    with pytest.raises(LeaseLostError):
        await store.append("s", [user("x")], lease=lease)


async def test_release_frees_the_lease_and_the_next_gets_a_new_token(store: Store) -> None:
    await store.create("s")
    released = await store.acquire_lease("s", "w1", LONG_TTL)
    assert released is not None

    await store.release_lease(released)

    assert (await store.get("s")).lease_owner is None
    assert await store.renew_leases("w1", LONG_TTL) == []
    taken = await store.acquire_lease("s", "w2", LONG_TTL)
    assert taken is not None
    assert taken.token == released.token + 1
    with pytest.raises(LeaseLostError):
        await store.append("s", [user("x")], lease=released)


async def test_release_of_a_lost_lease_is_a_no_op(store: Store) -> None:
    await store.create("s")
    lost = await store.acquire_lease("s", "w1", SHORT_TTL)
    assert lost is not None
    await sleep_past(SHORT_TTL)
    current = await store.acquire_lease("s", "w2", LONG_TTL)
    assert current is not None

    await store.release_lease(lost)
    await store.release_lease(Lease(session_id="gone", owner="w1", token=1))

    assert (await store.get("s")).lease_owner == "w2"
    assert await store.append("s", [user("x")], lease=current) == 1


async def test_get_reports_only_a_live_lease_owner(store: Store) -> None:
    await store.create("s")
    await store.acquire_lease("s", "w1", SHORT_TTL)
    await sleep_past(SHORT_TTL)

    assert (await store.get("s")).lease_owner is None
    assert (await store.list_sessions())[0].lease_owner is None


# --- input queue (spec R1: a send to a remote session is queued for the owner) -----------


def message(content: str, message_id: str) -> UserMessageEvent:
    return UserMessageEvent(
        data=UserMessageData(content=content, message_id=message_id, source="user")
    )


async def test_r1_inputs_stay_pending_in_fifo_order_until_their_message_is_stored(
    store: Store,
) -> None:
    await make(store, "s", "t")
    for n in range(3):
        await store.enqueue_input("s", f"prompt {n}", f"m{n}")
    await store.enqueue_input("t", "elsewhere", "mt")

    pending = [("prompt 0", "m0"), ("prompt 1", "m1"), ("prompt 2", "m2")]
    assert await store.pending_inputs("s") == pending
    assert await store.pending_inputs("s") == pending  # reading takes nothing

    await store.append("s", [message("prompt 0", "m0"), assistant("a")], lease=None)
    await store.append("s", [message("prompt 2", "m2")], lease=None)
    assert await store.pending_inputs("s") == [("prompt 1", "m1")]
    await store.enqueue_input("s", "later", "m3")
    assert await store.pending_inputs("s") == [("prompt 1", "m1"), ("later", "m3")]
    assert await store.pending_inputs("t") == [("elsewhere", "mt")]


async def test_r1_the_sessions_with_pending_inputs_are_read_at_once(store: Store) -> None:
    await make(store, "s", "t", "u")
    assert await store.sessions_with_inputs() == set()
    await store.enqueue_input("s", "one", "m1")
    await store.enqueue_input("t", "two", "m2")
    assert await store.sessions_with_inputs() == {"s", "t"}

    await store.append("s", [message("one", "m1")], lease=None)  # claimed: no longer pending
    await store.discard_inputs("t", ["m2"])
    assert await store.sessions_with_inputs() == set()


async def test_r1_queuing_the_same_message_again_is_a_no_op(store: Store) -> None:
    await store.create("s")

    await store.enqueue_input("s", "once", "m1")
    await store.enqueue_input("s", "once", "m1")  # a retried send

    assert await store.pending_inputs("s") == [("once", "m1")]


async def test_k9_discarding_removes_pending_inputs_only_never_a_claimed_one(
    store: Store,
) -> None:
    await make(store, "s", "t")
    for n in range(4):
        await store.enqueue_input("s", f"prompt {n}", f"m{n}")
    await store.enqueue_input("t", "elsewhere", "m1")
    await store.append("s", [message("prompt 0", "m0")], lease=None)  # claimed: its run began

    removed = await store.discard_inputs("s", ["m2", "m0", "m1", "unknown", "m2"])

    assert removed == ["m2", "m1"]
    assert await store.pending_inputs("s") == [("prompt 3", "m3")]
    assert await store.pending_inputs("t") == [("elsewhere", "m1")]
    assert await store.discard_inputs("s", []) == []


async def test_k18_an_edit_of_the_queue_moves_rewords_and_adds_inputs_at_once(
    store: Store,
) -> None:
    await make(store, "s", "t")
    for n in range(3):
        await store.enqueue_input("s", f"prompt {n}", f"m{n}")
    await store.enqueue_input("t", "elsewhere", "mt")
    edit = [("new", "n1"), ("prompt 2", "m2"), ("prompt 0", "m0"), ("reworded ✓ \x00", "m1")]

    assert await store.rewrite_inputs("s", ["m0", "m1", "m2"], edit)

    assert await store.pending_inputs("s") == edit
    assert await store.pending_inputs("t") == [("elsewhere", "mt")]
    # An input queued after the edit comes after the edited ones; a claim finds a moved one.
    await store.enqueue_input("s", "later", "m3")
    await store.append("s", [message("prompt 2", "m2")], lease=None)
    assert await store.pending_inputs("s") == [*edit[:1], *edit[2:], ("later", "m3")]
    assert await store.sessions_with_inputs() == {"s", "t"}


async def test_k18_an_edit_of_a_queue_that_changed_meanwhile_changes_nothing(
    store: Store,
) -> None:
    await store.create("s")
    for n in range(3):
        await store.enqueue_input("s", f"prompt {n}", f"m{n}")
    await store.append("s", [message("prompt 0", "m0")], lease=None)  # its run began
    before = await store.pending_inputs("s")

    # The edit was made from the queue as it was: m0, now claimed, is no longer waiting.
    moved = [("prompt 2", "m2"), ("prompt 1", "m1"), ("prompt 0", "m0")]
    assert not await store.rewrite_inputs("s", ["m0", "m1", "m2"], moved)
    assert not await store.rewrite_inputs("s", ["m2", "m1"], moved[:2])  # another order

    assert await store.pending_inputs("s") == before
    assert await store.rewrite_inputs("s", ["m1", "m2"], moved[:2])
    assert await store.pending_inputs("s") == moved[:2]


async def test_k18_an_edit_never_drops_or_doubles_an_input(store: Store) -> None:
    await store.create("s")
    for n, prompt in enumerate(["zero", "one", "two"]):
        await store.enqueue_input("s", prompt, f"m{n}")
    await store.append("s", [message("zero", "m0")], lease=None)  # claimed
    before = await store.pending_inputs("s")

    with pytest.raises(ValueError, match="drop"):
        await store.rewrite_inputs("s", ["m1", "m2"], [("two", "m2")])
    with pytest.raises(ValueError, match="twice"):
        await store.rewrite_inputs("s", ["m1", "m2"], [("one", "m1"), ("two", "m2")] * 2)
    if not isinstance(store, MemoryStore):  # its ids are never reused: it keeps no claimed ones
        with pytest.raises(ValueError, match="queued before"):
            await store.rewrite_inputs("s", ["m1", "m2"], [*before, ("again", "m0")])

    assert await store.pending_inputs("s") == before


async def test_inputs_keep_their_text_unchanged(store: Store) -> None:
    await store.create("s")
    prompt = 'nul \x00, quotes " \\ and ✓\n'

    await store.enqueue_input("s", prompt, "m1")

    assert await store.pending_inputs("s") == [(prompt, "m1")]


async def test_a_retried_append_is_not_stored_again(store: Store) -> None:
    await store.create("s")
    batch: list[Event] = [user("a"), assistant("b")]

    assert await store.append("s", batch, lease=None) == 2
    assert await store.append("s", batch, lease=None) == 2  # the outcome was unknown: retry

    assert contents(await store.read("s")) == ["a", "b"]
    assert await store.append("s", [user("c")], lease=None) == 3


async def test_a_batch_repeating_a_stored_event_after_its_first_is_refused(
    database: Store,
) -> None:
    await database.create("s")
    stored = user("a")
    await database.append("s", [stored, user("b")], lease=None)
    await database.append("s", [user("c")], lease=None)

    with pytest.raises(ValueError, match="already in"):
        await database.append("s", [user("d"), stored], lease=None)
    # An older batch again, not only the latest: still a retry, stored once.
    assert await database.append("s", [stored, user("b")], lease=None) == 3
    assert contents(await database.read("s")) == ["a", "b", "c"]


# --- subscriptions (catch up from the log, then live) -------------------------------------


async def test_subscribe_catches_up_after_the_cursor_then_follows_appends(store: Store) -> None:
    await store.create("s")
    await store.append("s", [user("a"), user("b")], lease=None)

    async with aclosing(store.subscribe("s", after=1)) as events:
        assert contents(await take(events, 1)) == ["b"]
        later = asyncio.create_task(take(events, 3))
        await asyncio.sleep(0.05)
        await store.append("s", [user("c"), user("d")], lease=None)
        await store.append("s", [user("e")], lease=None)

        assert contents(await later) == ["c", "d", "e"]


async def test_subscribe_from_beyond_the_end_waits_for_later_events(store: Store) -> None:
    await store.create("s")
    await store.append("s", [user("a")], lease=None)

    async with aclosing(store.subscribe("s", after=2)) as events:
        later = asyncio.create_task(take(events, 1))
        await store.append("s", [user("b")], lease=None)
        await store.append("s", [user("c")], lease=None)

        assert contents(await later) == ["c"]


async def test_subscribers_see_every_event_once_in_order(store: Store) -> None:
    await store.create("s")
    source = store

    async with (
        aclosing(source.subscribe("s")) as first,
        aclosing(source.subscribe("s")) as second,
    ):
        readers = [asyncio.create_task(take(events, 30)) for events in (first, second)]
        for batch in range(10):
            await store.append("s", [user(f"{batch}.{n}") for n in range(3)], lease=None)

        expected = [f"{batch}.{n}" for batch in range(10) for n in range(3)]
        assert [contents(await reader) for reader in readers] == [expected, expected]


async def test_subscribe_to_an_unknown_session_raises(store: Store) -> None:
    async with aclosing(store.subscribe("nope")) as events:
        with pytest.raises(SessionNotFoundError):
            await anext(events)


async def test_subscription_fails_when_its_session_is_deleted(store: Store) -> None:
    await make(store, "s")

    async with aclosing(store.subscribe("s")) as events:
        reader = asyncio.create_task(drain(events))
        await asyncio.sleep(0.05)
        await store.delete("s")

        with pytest.raises(SessionNotFoundError):
            await reader


async def test_subscription_ends_when_the_store_closes(store: Store) -> None:
    await store.create("s")
    await store.append("s", [user("a")], lease=None)

    async with aclosing(store.subscribe("s")) as events:
        reader = asyncio.create_task(drain(events))
        await asyncio.sleep(0.05)
        await store.close()

        assert contents(await reader) == ["a"]
    with pytest.raises(RuntimeError, match="closed"):
        await anext(store.subscribe("s"))


def delta(text: str) -> AssistantMessageDeltaEvent:
    return AssistantMessageDeltaEvent(
        data=AssistantMessageDeltaData(message_id="m", delta_content=text)
    )


def labels(events: list[Event]) -> list[str]:
    """Each message's text; a delta's as `~text`."""
    return [
        f"~{e.data.delta_content}"
        if isinstance(e, AssistantMessageDeltaEvent)
        else contents([e])[0]
        for e in events
    ]


async def test_published_ephemeral_events_come_in_their_place_and_are_not_stored(
    store: Store,
) -> None:
    await store.create("s")
    await store.append("s", [user("a")], lease=None)

    async with aclosing(store.subscribe("s")) as events:
        assert labels(await take(events, 1)) == ["a"]
        reader = asyncio.create_task(take(events, 5))
        await store.append("s", [user("b")], lease=None)
        await store.publish("s", delta("1"), after=2)
        await store.publish("s", delta("2"), after=2)
        await store.append("s", [assistant("c")], lease=None)
        await store.publish("s", delta("3"), after=3)

        # Whenever the subscriber reads the log, a delta never overtakes an event stored
        # before it was published, nor lets one stored after it go first.
        assert labels(await reader) == ["b", "~1", "~2", "c", "~3"]
    assert contents(await store.read("s")) == ["a", "b", "c"]


async def test_e6_a_subscription_hears_every_event_published_once_it_is_ready(
    store: Store,
) -> None:
    await store.create("s")
    await store.append("s", [user("a")], lease=None)
    ready = asyncio.Event()

    async with aclosing(store.subscribe("s", after=1, ready=ready)) as events:
        reader = asyncio.create_task(take(events, 2))
        async with asyncio.timeout(5):
            await ready.wait()
        # At once: no turn of the event loop for a subscription still getting ready.
        await store.publish("s", delta("1"), after=1)
        await store.append("s", [user("b")], lease=None)

        assert labels(await reader) == ["~1", "b"]


async def test_publishing_without_subscribers_is_harmless(store: Store) -> None:
    await store.create("s")

    await store.publish("s", delta("lost"), after=0)

    async with aclosing(store.subscribe("s")) as events:
        reader = asyncio.create_task(take(events, 1))
        await store.append("s", [user("a")], lease=None)
        assert labels(await reader) == ["a"]


async def test_snapshots_are_kept_per_session_and_go_with_it(store: Store) -> None:
    await store.create("s")
    assert await store.load_snapshot("s") is None
    await store.save_snapshot("s", 3, '{"a": 1}')
    await store.save_snapshot("s", 5, '{"b": "\\u00e9"}')
    assert await store.load_snapshot("s") == (5, '{"b": "\\u00e9"}')
    with pytest.raises(SessionNotFoundError):
        await store.save_snapshot("nope", 1, "{}")
    with pytest.raises(SessionNotFoundError):
        await store.load_snapshot("nope")
    await store.delete("s")
    await store.create("s")
    assert await store.load_snapshot("s") is None


# --- retention (spec X8) -------------------------------------------------------------------


def marker(replaced: Event, position: int) -> SessionPrunedEvent:
    """A prune's marker for the event at `position`, as the runtime makes one."""
    data = PrunedData(events_pruned=position - 1, position=position, state={"any": "state"})
    return SessionPrunedEvent(id=replaced.id, data=data)


async def seven(store: Store) -> list[Event]:
    await store.create("s")
    events: list[Event] = [user(str(n)) for n in range(1, 8)]
    await store.append("s", events, lease=None)
    return events


async def test_x8_prune_replaces_the_events_before_its_position_and_keeps_positions(
    store: Store,
) -> None:
    events = await seven(store)
    assert await store.prune("s", marker(events[3], 4), lease=None) == 3

    pruned = await store.read("s")
    assert [e.id for e in pruned] == [events[0].id, events[3].id, *[e.id for e in events[4:]]]
    assert isinstance(pruned[1], SessionPrunedEvent) and pruned[1].data.position == 4
    assert [e.id for e in await store.read("s", after=2)] == [e.id for e in pruned[1:]]
    assert [e.id for e in await store.read("s", after=4)] == [e.id for e in events[4:]]
    assert (await store.get("s")).event_count == 7
    assert await store.append("s", [user("8")], lease=None) == 8
    assert contents(await store.read("s", after=7)) == ["8"]

    # Again, further on: the first marker is among what goes.
    later = await store.read("s")
    assert await store.prune("s", marker(later[3], 6), lease=None) == 3
    assert [e.id for e in await store.read("s")] == [
        events[0].id,
        events[5].id,
        events[6].id,
        later[-1].id,
    ]
    assert (await store.get("s")).event_count == 8


async def test_x8_prune_made_for_another_log_is_refused(store: Store) -> None:
    events = await seven(store)
    for wrong in (marker(events[2], 4), marker(events[0], 1), marker(events[6], 9)):
        with pytest.raises(PruneError) as refused:
            await store.prune("s", wrong, lease=None)
        assert refused.value.code == "log_changed"
    assert [e.id for e in await store.read("s")] == [e.id for e in events]
    with pytest.raises(SessionNotFoundError):
        await store.prune("nobody", marker(events[3], 4), lease=None)


async def test_x8_prune_is_fenced_by_the_lease(store: Store) -> None:
    events = await seven(store)
    lease = await store.acquire_lease("s", "a", LONG_TTL)
    assert lease is not None
    with pytest.raises(PruneError) as refused:
        await store.prune("s", marker(events[3], 4), lease=None)
    assert refused.value.code == "session_open"
    stale = Lease(session_id="s", owner="a", token=lease.token - 1)
    with pytest.raises(LeaseLostError):
        await store.prune("s", marker(events[3], 4), lease=stale)
    assert len(await store.read("s")) == 7
    assert await store.prune("s", marker(events[3], 4), lease=lease) == 3


async def test_x8_prune_waits_for_a_subscription_behind_it(store: Store) -> None:
    events = await seven(store)
    async with aclosing(store.subscribe("s")) as behind:
        await take(behind, 2)  # it has not read past event 4
        with pytest.raises(PruneError) as refused:
            await store.prune("s", marker(events[3], 4), lease=None)
        assert refused.value.code == "follower_behind"
        await take(behind, 5)
        assert await store.prune("s", marker(events[3], 4), lease=None) == 3
        later = asyncio.create_task(take(behind, 1))
        await store.append("s", [user("8")], lease=None)
        assert contents(await later) == ["8"]
    # One that starts behind the cut reads the marker, then what follows it.
    async with aclosing(store.subscribe("s", after=2)) as late:
        read = await take(late, 5)
    assert [e.type for e in read][:1] == ["session.pruned"] and contents(read) == [
        "5",
        "6",
        "7",
        "8",
    ]
