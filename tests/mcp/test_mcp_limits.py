"""Issue 34: what a hostile or broken MCP server sends costs the session little (spec MCP11,
MCP12). `servers/faulty.py` is the server, a real subprocess; the model is scripted."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.mcp.conftest import FAULTY, assert_no_orphans, started, stdio
from tests.mcp.test_mcp_tools import open_session, outcomes
from trimtab import Client
from trimtab.events import SessionWarningEvent
from trimtab.mcp._answers import MAX_CONTENTS
from trimtab.mcp._stdio import MAX_MESSAGE_BYTES
from trimtab.testing import ScriptedModel, tool_call


@contextmanager
def peak_growth() -> Iterator[list[int]]:
    """Yields a list that gets the peak of Python's allocations above their start, in bytes."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    peak: list[int] = []
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()


async def test_mcp11_a_tool_whose_schema_no_provider_takes_is_left_out_alone(
    pids: Path,
) -> None:
    # The server lists `ok`, `also` and three tools whose inputSchema is a string, a schema
    # of type "string", and not JSON Schema at all: only those three are left out.
    model = ScriptedModel(
        [tool_call("bad__ok"), tool_call("bad__also"), tool_call("bad__not_an_object"), "done"]
    )
    async with Client(store="memory") as client:
        servers = {"bad": stdio(FAULTY, "schemas", pids=pids, defer="never")}
        session = await open_session(client, model, mcp_servers=servers)
        await session.send_and_wait("go")
        events = await session.get_events()
    assert outcomes(events) == [
        ("bad__ok", "success", "fine"),
        ("bad__also", "success", "also"),
        ("bad__not_an_object", "failure", "Tool 'bad__not_an_object' does not exist."),
    ]
    assert {tool.name for tool in model.requests[0].tools} == {"bad__ok", "bad__also"}
    warnings = [e.data for e in events if isinstance(e, SessionWarningEvent)]
    assert {w.warning_type for w in warnings} == {"mcp"}
    assert [w.message for w in warnings] == [
        "MCP server 'bad': tool 'not_an_object' is left out: its inputSchema is not a JSON object",
        "MCP server 'bad': tool 'of_type_string' is left out: its inputSchema's type is "
        '"string", not "object"',
        "MCP server 'bad': tool 'not_json_schema' is left out: its inputSchema is not valid "
        "JSON Schema (5 is not valid under any of the given schemas)",
    ]
    assert len(started(pids)) == 1  # the server did not stop, nor was it restarted
    assert_no_orphans(pids)


async def huge_call(pids: Path, arguments: dict[str, Any]) -> tuple[list[Any], int]:
    """Call `huge` with `arguments`, then `ok`: the outcomes, and the peak memory growth of
    the turn that called `huge`."""
    model = ScriptedModel([tool_call("bad__huge", arguments), "read", tool_call("bad__ok"), "ok"])
    async with Client(store="memory") as client:
        servers = {"bad": stdio(FAULTY, "huge", pids=pids)}
        session = await open_session(client, model, mcp_servers=servers)
        with peak_growth() as peak:
            await session.send_and_wait("call huge")
        reply = await session.send_and_wait("call ok")
        events = await session.get_events()
    assert reply is not None and reply.data.content == "ok"  # the session went on
    return outcomes(events), peak[0]


@pytest.mark.parametrize("items", [1, 500_000], ids=["one text", "many contents"])
async def test_mcp12_a_message_over_the_limit_fails_the_call_and_is_never_held_whole(
    pids: Path, items: int
) -> None:
    done, peak = await huge_call(pids, {"chars": 50_000_000, "items": items})
    assert done == [
        (
            "bad__huge",
            "failure",
            "MCP server 'bad' sent a message longer than 8 MiB (the most trimtab reads) during "
            "the call; it was stopped and restarts on next use.",
        ),
        ("bad__ok", "success", "fine"),
    ]
    assert len(started(pids)) == 2  # stopped, then started again for `ok`
    assert peak < 4 * MAX_MESSAGE_BYTES, f"{peak / 2**20:.0f} MiB"
    assert_no_orphans(pids)


async def test_mcp12_contents_past_the_first_thousand_are_cut_before_the_sdk_reads_them(
    pids: Path,
) -> None:
    # 250,000 empty texts: a 6.5 MB line, under the limit, that the SDK would make some
    # 500 MB of models of.
    done, peak = await huge_call(pids, {"chars": 0, "items": 250_000})
    text = "\n" * (MAX_CONTENTS - 1) + f"\n[... {250_000 - MAX_CONTENTS} more contents cut]"
    assert done == [("bad__huge", "success", text), ("bad__ok", "success", "fine")]
    assert len(started(pids)) == 1
    assert peak < 10 * MAX_MESSAGE_BYTES, f"{peak / 2**20:.0f} MiB"
    assert_no_orphans(pids)
