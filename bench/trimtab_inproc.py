"""trimtab in process: turns above the floor, pure overhead, memory, import time, the SQLite
append rate, and the cost of clear_context and of opening a session against history length.

One part per process, so that a measurement never inherits another's heap or caches:

    python bench/trimtab_inproc.py --part turns --base-url http://127.0.0.1:PORT/v1
    python bench/trimtab_inproc.py --part scripted|memory|rss|import|append|context|tracing
    python bench/trimtab_inproc.py --part rss --store sqlite|memory --sessions 1000

Each prints one JSON line (see `common.report`).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import common
from pydantic import BaseModel

from trimtab import Client, PermissionHandler, Session, ToolInvocation, define_tool
from trimtab._state import state_of
from trimtab.events import (
    AssistantMessageData,
    AssistantMessageEvent,
    AssistantTurnEndEvent,
    AssistantTurnStartEvent,
    AssistantUsageData,
    AssistantUsageEvent,
    ContextClearedData,
    Event,
    SessionConfigData,
    SessionContextClearedEvent,
    SessionStartData,
    SessionStartEvent,
    TurnData,
    UserMessageData,
    UserMessageEvent,
    new_id,
)
from trimtab.providers import ModelRequest
from trimtab.store import SqliteStore, Store
from trimtab.testing import ScriptedModel, ScriptStep, tool_call


class EchoArgs(BaseModel):
    text: str


def echo(params: EchoArgs) -> str:
    return common.echo(params.text)


def echo_tool() -> Any:
    return define_tool(
        "echo", description=common.TOOL_DESCRIPTION, params_type=EchoArgs, handler=echo
    )


def scripted_answer(request: ModelRequest) -> ScriptStep:
    """What the fake model server answers, without the HTTP (see `fake_model.py`)."""
    last = request.messages[-1]
    if last.role == "user" and "ECHO" in last.content:
        return tool_call("echo", {"text": "hi"})
    return "done"


def session_options(provider: Any) -> dict[str, Any]:
    return {
        "provider": provider,
        "model": common.MODEL,
        "system_message": common.SYSTEM,
        "tools": [echo_tool()],
        "on_permission_request": PermissionHandler.approve_all,
    }


class FreshSessions:
    """A session per run, opened before the clock starts (like a peer's fresh conversation).

    Opening a session is timed on its own: it is paid once per conversation, not per turn.
    """

    def __init__(self, client: Client, options: dict[str, Any]) -> None:
        self.client = client
        self.options = options
        self.ready: list[Session] = []
        self.open_ms: list[float] = []

    async def fill(self, count: int) -> None:
        for _ in range(count):
            started = time.perf_counter()
            self.ready.append(await self.client.create_session(**self.options))
            self.open_ms.append((time.perf_counter() - started) * 1000)

    def turn(self, prompt: str) -> common.Turn:
        async def run() -> object:
            session = self.ready.pop()
            return await session.send_and_wait(prompt)

        return run


async def turns_vs_floor(args: argparse.Namespace) -> dict[str, Any]:
    """The real OpenAI provider against the fake server, above the floor, per store.

    Two floors run interleaved with trimtab: the raw client used as documented, and the lean
    one that skips the client's per-message transform like trimtab's provider does.
    """
    provider = {"type": "openai", "base_url": args.base_url, "api_key": common.API_KEY}
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stores: dict[str, Any] = {"memory": "memory", "sqlite": Path(tmp) / "bench.db"}
        for name, store in stores.items():
            async with Client(store=store) as client:
                plain = FreshSessions(client, session_options(provider))
                tool = FreshSessions(client, session_options(provider))
                await plain.fill(args.runs + args.warmup)
                await tool.fill(args.runs + args.warmup)
                floor = common.Floor(args.base_url)
                lean = common.Floor(args.base_url, lean=True)
                try:
                    times = await common.interleaved(
                        {
                            "floor_plain": floor.turn(common.PLAIN_PROMPT),
                            "lean_plain": lean.turn(common.PLAIN_PROMPT),
                            "plain": plain.turn(common.PLAIN_PROMPT),
                            "floor_tool": floor.turn(common.TOOL_PROMPT),
                            "lean_tool": lean.turn(common.TOOL_PROMPT),
                            "tool": tool.turn(common.TOOL_PROMPT),
                        },
                        args.runs,
                        args.warmup,
                    )
                finally:
                    await floor.close()
                    await lean.close()
            rows[name] = {
                "plain": common.above(times["plain"], times["floor_plain"]),
                "tool": common.above(times["tool"], times["floor_tool"]),
                "plain_lean": common.above(times["plain"], times["lean_plain"]),
                "tool_lean": common.above(times["tool"], times["lean_tool"]),
                "open_session": common.summary(plain.open_ms + tool.open_ms),
            }
    return rows


async def scripted(args: argparse.Namespace) -> dict[str, Any]:
    """Pure runtime overhead: ScriptedModel, no HTTP, a fresh session per run."""
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stores: dict[str, Any] = {"memory": "memory", "sqlite": Path(tmp) / "bench.db"}
        for name, store in stores.items():
            model = ScriptedModel(then=scripted_answer)
            async with Client(store=store) as client:
                plain = FreshSessions(client, session_options(model))
                tool = FreshSessions(client, session_options(model))
                await plain.fill(args.runs + args.warmup)
                await tool.fill(args.runs + args.warmup)
                times = await common.interleaved(
                    {
                        "plain": plain.turn(common.PLAIN_PROMPT),
                        "tool": tool.turn(common.TOOL_PROMPT),
                    },
                    args.runs,
                    args.warmup,
                )
                model.requests.clear()
                await check_window(client, model)
            rows[name] = {
                "plain": common.summary(times["plain"]),
                "tool": common.summary(times["tool"]),
                "open_session": common.summary(plain.open_ms + tool.open_ms),
            }
    return rows


async def check_window(client: Client, model: ScriptedModel) -> None:
    """The live session's incremental window must equal the pure replay of its log."""
    session = await client.create_session(**session_options(model))
    for prompt in (common.PLAIN_PROMPT, common.TOOL_PROMPT, common.PLAIN_PROMPT):
        await session.send_and_wait(prompt)
    expected = state_of(await session.get_events()).window()
    if session.window() != expected:
        raise AssertionError(f"incremental window {session.window()} != replay {expected}")


async def memory(args: argparse.Namespace) -> dict[str, Any]:
    """Bytes per idle session (one plain turn done, then left alone), per store."""
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stores: dict[str, Any] = {"sqlite": Path(tmp) / "bench.db", "memory": "memory"}
        for name, store in stores.items():
            async with Client(store=store) as client:
                rows[name] = await common.bytes_per_session(idle_sessions(client), args.sessions)
    return rows


def idle_sessions(client: Client) -> Callable[[int], Awaitable[object]]:
    """Opens a session and runs one plain turn in it; the client keeps it open."""
    model = ScriptedModel(then=scripted_answer)
    options = session_options(model)

    async def open_idle(i: int) -> None:
        session = await client.create_session(**options)
        await session.send_and_wait(common.PLAIN_PROMPT)
        model.requests.clear()  # the fake model's record, not the session's

    return open_idle


async def rss(args: argparse.Namespace) -> dict[str, Any]:
    """RSS growth of one process opening `args.sessions` idle sessions on `args.store`
    (`sqlite` or `memory`), per session: read with `common.settled_rss`, after warm-up
    sessions have built what every session shares (schemas, pools, interned configuration)."""
    warmup = 100
    with tempfile.TemporaryDirectory() as tmp:
        store: Any = Path(tmp) / "bench.db" if args.store == "sqlite" else "memory"
        async with Client(store=store) as client:
            open_idle = idle_sessions(client)
            for i in range(warmup):
                await open_idle(i)
            before = common.settled_rss()
            started = time.perf_counter()
            for i in range(args.sessions):
                await open_idle(warmup + i)
            seconds = time.perf_counter() - started
            after = common.settled_rss()  # the client still holds every session open
    return {
        "store": args.store,
        "sessions": args.sessions,
        "rss_before": before,
        "rss_total": after,
        "rss_per_session": (after - before) / args.sessions,
        "seconds": seconds,
    }


def import_time() -> dict[str, Any]:
    loads = "import sys, trimtab; print(any(m.startswith('opentelemetry') for m in sys.modules))"
    check = subprocess.run([sys.executable, "-c", loads], capture_output=True, text=True)
    return {
        "import_trimtab_s": common.import_seconds("import trimtab"),
        "import_loads_opentelemetry": check.stdout.strip() == "True",
        "import_with_openai_provider_s": common.import_seconds(
            "import trimtab; from trimtab.providers import ProviderConfig, make_provider;"
            " make_provider(ProviderConfig(type='openai', base_url='http://x'))"
        ),
    }


# --- the store ------------------------------------------------------------------------------


async def sample_events() -> list[Event]:
    """The persisted events of one one-tool run, as the runtime writes them."""
    model = ScriptedModel(then=scripted_answer)
    async with Client(store="memory") as client:
        session = await client.create_session(**session_options(model))
        await session.send_and_wait(common.TOOL_PROMPT)
        return (await session.get_events())[1:]


async def append_rate(args: argparse.Namespace) -> dict[str, Any]:
    """SQLite appends: events/s with one durable commit per batch, for several batch sizes."""
    events = await sample_events()
    total = 2_000 if args.smoke else 20_000
    rows: dict[str, Any] = {"events_per_run": len(events)}
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "append.db")
        try:
            for batch in (1, 5, 50):
                session_id = f"append-{batch}"
                await store.create(session_id)
                lease = await store.acquire_lease(session_id, "bench", 600)
                # Fresh ids: an append of an id already in the log is taken for a retry.
                stream = [
                    events[i % len(events)].model_copy(update={"id": new_id()})
                    for i in range(total)
                ]
                started = time.perf_counter()
                for i in range(0, total, batch):
                    await store.append(session_id, stream[i : i + batch], lease=lease)
                elapsed = time.perf_counter() - started
                rows[f"batch_{batch}"] = {"events_per_s": total / elapsed, "events": total}
        finally:
            await store.close()
    return rows


def synthetic_log(turns: int, clear_before_last: int | None) -> list[Event]:
    """A plausible log: a start, then `turns` plain turns of five events each; with
    `clear_before_last`, a committed clear that many turns before the end."""
    config = SessionConfigData(model=common.MODEL, system_message=common.SYSTEM, provider={})
    events: list[Event] = [
        SessionStartEvent(
            data=SessionStartData(session_id="x", selected_model=common.MODEL, config=config)
        )
    ]
    for turn in range(turns):
        if clear_before_last is not None and turn == turns - clear_before_last:
            data = ContextClearedData(messages_cleared=2 * turn, initial_message="Go on.")
            events.append(SessionContextClearedEvent(data=data))
        turn_data = TurnData(turn_id=str(turn), model=common.MODEL)
        events += [
            UserMessageEvent(
                data=UserMessageData(content=f"Question {turn}?", message_id=f"m{turn}")
            ),
            AssistantTurnStartEvent(data=turn_data),
            AssistantMessageEvent(
                data=AssistantMessageData(message_id=f"a{turn}", content=f"Answer {turn}.")
            ),
            AssistantUsageEvent(
                data=AssistantUsageData(model=common.MODEL, input_tokens=20, output_tokens=5)
            ),
            AssistantTurnEndEvent(data=turn_data),
        ]
    return events


async def open_cost(store: Store, events: list[Event], repeats: int) -> dict[str, Any]:
    """Median time of `resume_session` on a log of `events`, in a fresh Client each time."""
    session_id = f"open-{len(events)}-{id(events)}"
    await store.create(session_id)
    for i in range(0, len(events), 500):
        await store.append(session_id, events[i : i + 500], lease=None)
    model = ScriptedModel(then=scripted_answer)
    times = []
    window = 0
    for _ in range(repeats):
        async with Client(store=store) as client:
            started = time.perf_counter()
            session = await client.resume_session(session_id, provider=model)
            times.append((time.perf_counter() - started) * 1000)
            window = len(session.window())
            await session.disconnect()
    return {"events": len(events), "window_messages": window, "ms": statistics.median(times)}


class ClearArgs(BaseModel):
    prompt: str


async def clear_cost(store: Store, turns: int, repeats: int) -> dict[str, Any]:
    """The cost of `clear_context` against the window's length: the call itself (staging)
    and the whole clearing run (tool turn, commit, seeded run), in a session whose window
    holds `turns` plain turns."""
    staged_ms: list[float] = []
    clear_started: list[float] = []

    async def clear(params: ClearArgs, invocation: ToolInvocation) -> str:
        started = time.perf_counter()
        clear_started.append(started)
        result = await invocation.session.history.clear_context(params.prompt)
        staged_ms.append((time.perf_counter() - started) * 1000)
        return f"cleared {result.messages_cleared}"

    run_ms: list[float] = []
    after_ms: list[float] = []
    for _ in range(repeats):
        session_id = f"clear-{turns}-{len(run_ms)}"
        await store.create(session_id)
        await store.append(session_id, synthetic_log(turns, None), lease=None)
        model = ScriptedModel(then=lambda _request: "fresh")
        async with Client(store=store) as client:
            tool = define_tool(
                "clear_context", params_type=ClearArgs, handler=clear, is_terminal=True
            )
            session = await client.resume_session(
                session_id,
                provider=model,
                tools=[tool],
                on_permission_request=PermissionHandler.approve_all,
            )
            model.add(tool_call("clear_context", {"prompt": "Start over."}), "fresh")
            started = time.perf_counter()
            await session.send_and_wait("Clear the context.")
            ended = time.perf_counter()
            run_ms.append((ended - started) * 1000)
            after_ms.append((ended - clear_started[-1]) * 1000)
            assert len(session.window()) == 3, session.window()  # system, seed, reply
    return {
        "window_messages": 2 * turns,
        "clear_call_ms": statistics.median(staged_ms),
        "clearing_run_ms": statistics.median(run_ms),
        "from_clear_to_reply_ms": statistics.median(after_ms),
    }


async def turn_cost(store: Store, turns: int, runs: int) -> dict[str, Any]:
    """A plain turn (ScriptedModel) in a session whose window already holds `turns` turns."""
    session_id = f"history-{turns}"
    await store.create(session_id)
    await store.append(session_id, synthetic_log(turns, None), lease=None)
    model = ScriptedModel(then=scripted_answer)
    times = []
    async with Client(store=store) as client:
        session = await client.resume_session(session_id, provider=model)
        for _ in range(runs):
            started = time.perf_counter()
            await session.send_and_wait(common.PLAIN_PROMPT)
            times.append((time.perf_counter() - started) * 1000)
            model.requests.clear()
    return {"window_messages": 2 * turns, **common.summary(times)}


async def context(args: argparse.Namespace) -> dict[str, Any]:
    sizes = (20, 200) if args.smoke else (20, 200, 2_000)
    repeats = 3 if args.smoke else 5
    rows: dict[str, Any] = {"open": [], "open_no_base": [], "clear": [], "turn": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "context.db")
        try:
            for turns in sizes:
                # The log's last clear is two turns before its end: the window is tiny.
                rows["open"].append(await open_cost(store, synthetic_log(turns, 2), repeats))
                rows["open_no_base"].append(
                    await open_cost(store, synthetic_log(turns, None), repeats)
                )
                rows["clear"].append(await clear_cost(store, turns, repeats))
                rows["turn"].append(await turn_cost(store, turns, 10 if args.smoke else 50))
        finally:
            await store.close()
    return rows


# --- tracing ------------------------------------------------------------------------------


async def tracing(args: argparse.Namespace) -> dict[str, Any]:
    """A turn's cost with tracing off and on (ScriptedModel, memory store, no HTTP): first
    while the process has not loaded OpenTelemetry, then with the API (no SDK: the global
    provider is the API's no-op) and with the SDK exporting to an exporter that drops spans."""
    clients = {"off": Client(store="memory", tracing=False), "on": Client(store="memory")}
    rows: dict[str, Any] = {"not loaded": await _tracing_turns(clients, args)}
    if any(name.startswith("opentelemetry") for name in sys.modules):
        raise AssertionError("a traced run loaded OpenTelemetry on its own")
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            SimpleSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
    except ImportError:
        rows["sdk"] = "not installed: pip install opentelemetry-sdk"
        return rows

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(Drop()))
    clients = {
        "off": Client(store="memory", tracing=False),
        "on, API without SDK": Client(store="memory"),
        "on, SDK (spans dropped)": Client(store="memory", tracer_provider=sdk),
    }
    rows["loaded"] = await _tracing_turns(clients, args)
    sdk.shutdown()
    return rows


async def _tracing_turns(clients: dict[str, Client], args: argparse.Namespace) -> dict[str, Any]:
    turns: dict[str, common.Turn] = {}
    for name, client in clients.items():
        await client.start()
        for kind, prompt in (("plain", common.PLAIN_PROMPT), ("tool", common.TOOL_PROMPT)):
            fresh = FreshSessions(client, session_options(ScriptedModel(then=scripted_answer)))
            await fresh.fill(args.runs + args.warmup)
            turns[f"{name}|{kind}"] = fresh.turn(prompt)
    times = await common.interleaved(turns, args.runs, args.warmup)
    for client in clients.values():
        await client.stop()
    rows: dict[str, Any] = {}
    for key, samples in times.items():
        name, kind = key.split("|")
        rows.setdefault(name, {})[kind] = common.summary(samples)
    return rows


PARTS: dict[str, Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "turns": turns_vs_floor,
    "scripted": scripted,
    "memory": memory,
    "rss": rss,
    "append": append_rate,
    "context": context,
    "tracing": tracing,
}


async def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", choices=[*PARTS, "import"], required=True)
    parser.add_argument("--base-url", help="the fake model server's /v1 root (part turns)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--store", choices=["sqlite", "memory"], default="sqlite")
    parser.add_argument("--smoke", action="store_true", help="small sizes, for CI")
    args = parser.parse_args()
    if args.part == "import":
        return import_time()
    if args.part == "turns" and not args.base_url:
        sys.exit("--part turns needs --base-url")
    return await PARTS[args.part](args)


if __name__ == "__main__":
    common.run_worker(main)
