"""Markdown tables, and the budget check, from `run.py`'s results.

`write` replaces what lies between the `<!-- bench:begin -->` and `<!-- bench:end -->`
markers of a markdown file, so the hand-written text around the tables survives a re-run.
The scale-out table has markers of its own (`<!-- bench:scaleout:begin -->` ...), so that
`run.py --only scaleout --write` refreshes it alone; each block is rewritten only by a run
that measured something for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
SCALEOUT_BEGIN, SCALEOUT_END = "<!-- bench:scaleout:begin -->", "<!-- bench:scaleout:end -->"
KB, MB = 1024, 1024 * 1024

QUOTED = {
    "copilot": "plain ~83 ms, one-tool ~140 ms, ~1 s to start, RSS 173 MB after start, "
    "~310 MB after 81 turns",
    "agents": "+5 / +11–17 ms, 80 KB per session, 4.1 s import",
    "pydantic-ai": "+6–15 / +19–30 ms, 3 KB, 2.7 s",
    "langgraph": "+3–7 / +11–19 ms, 8 KB, 3.7 s",
}
"""The issue's figures for the peers, measured elsewhere on a machine like ours."""
PEER_LABELS = {
    "agents": "OpenAI Agents SDK",
    "pydantic-ai": "Pydantic AI",
    "langgraph": "LangGraph",
}


Section = Callable[[dict[str, Any]], list[str]]


def _ms(value: float) -> str:
    return f"{value:.2f}"


def _pair(stats: dict[str, Any]) -> str:
    return f"{_ms(stats['median'])} / {_ms(stats['p90'])}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _header(results: dict[str, Any]) -> list[str]:
    return [
        f"Measured on {results['date']} with `{results['command']}`",
        f"({results['machine']}; median / p90 of {results['runs']} timed runs after warm-up,"
        " in ms unless marked).",
        "",
    ]


def _sections(results: dict[str, Any], sections: Sequence[Section]) -> list[str]:
    lines: list[str] = []
    for section in sections:
        part = section(results)
        if part:
            lines += [*part, ""]
    return lines


def render(results: dict[str, Any]) -> str:
    lines = _header(results) + _sections(results, (*MAIN[:-1], _scaleout, MAIN[-1]))
    return "\n".join(lines).rstrip() + "\n"


def render_scaleout(results: dict[str, Any]) -> str:
    """The scale-out block: its own header (its run may not be the main tables' run)."""
    if not results.get("scaleout"):
        return ""
    lines = [
        f"Measured on {results['date']} with `{results['command']}` ({results['machine']}).",
        "",
        *_scaleout(results),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _replace(text: str, begin: str, end: str, body: str) -> str:
    if begin not in text or end not in text:
        text = text.rstrip() + f"\n\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{begin}\n{body}{end}{tail}"


def write(path: Path, results: dict[str, Any]) -> None:
    text = path.read_text() if path.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    # The errors alone (e.g. a skipped scale-out) do not replace tables measured before.
    if _sections(results, MAIN[:-1]):
        body = "\n".join(_header(results) + _sections(results, MAIN)).rstrip() + "\n"
        text = _replace(text, BEGIN, END, body)
    if scaleout := render_scaleout(results):
        text = _replace(text, SCALEOUT_BEGIN, SCALEOUT_END, scaleout)
    path.write_text(text)


# --- sections ---------------------------------------------------------------------------------


def _budget(results: dict[str, Any]) -> list[str]:
    rows: list[list[str]] = []
    turns = results.get("turns", {}).get("sqlite")
    peers = results.get("peers", {})
    if turns:
        for kind, limit in (("plain", 2.0), ("tool", 5.0)):
            ours = turns[kind]["median"]
            best_peer = min((p[kind]["median"] for p in peers.values()), default=None)
            below = best_peer is None or ours < best_peer
            peer_text = f"; best peer +{_ms(best_peer)}" if best_peer is not None else ""
            rows.append(
                [
                    f"{kind} turn above the raw client (SQLite store)",
                    f"≤ {limit:g} ms, below every peer",
                    f"{ours:+.2f} ms{peer_text}",
                    _yes(ours <= limit and below),
                ]
            )
    if "import" in results:
        seconds = results["import"]["import_trimtab_s"]
        rows.append(["`import trimtab`", "≤ 0.3 s", f"{seconds:.3f} s", _yes(seconds <= 0.3)])
        if "import_loads_opentelemetry" in results["import"]:
            loads = results["import"]["import_loads_opentelemetry"]
            measured = "yes" if loads else "no"
            rows.append(["`import trimtab` loads OpenTelemetry", "no", measured, _yes(not loads)])
    if tracing := results.get("tracing", {}).get("not loaded"):
        extra = tracing["on"]["plain"]["median"] - tracing["off"]["plain"]["median"]
        rows.append(
            [
                "plain turn, tracing on (OpenTelemetry not loaded) vs off",
                "≤ 0.05 ms",
                f"{extra:+.3f} ms",
                _yes(extra <= 0.05),
            ]
        )
    if "memory" in results:
        per = results["memory"]["sqlite"]["traced"]
        rows.append(
            [
                "memory per idle session (SQLite store)",
                "≤ 3 KB",
                f"{per / KB:.2f} KB",
                _yes(per <= 3 * KB),
            ]
        )
    if idle := results.get("idle", {}).get("sqlite"):
        per = idle["rss_per_session"]
        rows.append(
            [
                f"RSS per idle session, growth over {idle['sessions']:,} (SQLite store)",
                "≤ 2.5 KB",
                f"{per / KB:.2f} KB",
                _yes(per <= 2.5 * KB),
            ]
        )
    if "rss" in results:
        rss = results["rss"]
        rows.append(
            [
                f"{rss['sessions']:,} idle sessions in one process (SQLite store)",
                "< 500 MB",
                f"{rss['rss_total'] / MB:.0f} MB RSS",
                _yes(rss["rss_total"] < 500 * MB),
            ]
        )
    server = results.get("server", {})
    ours, cli = server.get("trimtab stdio"), server.get("copilot stdio")
    if ours and cli:
        ratio = ours["plain"]["median"] / cli["plain"]["median"]
        rows.append(
            [
                "plain turn over JSON-RPC vs the Copilot CLI (stdio)",
                "≤ 1/10",
                f"{_ms(ours['plain']['median'])} vs {_ms(cli['plain']['median'])} ms"
                f" (1/{1 / ratio:.0f})",
                _yes(ratio <= 0.1),
            ]
        )
    if ours:
        rows.append(
            [
                "server ready to accept `connect`",
                "≤ 0.2 s",
                f"{ours['ready_s']:.3f} s",
                _yes(ours["ready_s"] <= 0.2),
            ]
        )
        curve = ours["rss_curve"]
        after_first = curve[0][1] if curve else ours["rss_session"]
        growth = ours["rss_end"] - after_first
        rows.append(
            [
                "server RSS, flat across turns",
                "≤ 45 MB, flat",
                f"{ours['rss_start'] / MB:.1f} MB at start, {after_first / MB:.1f} MB after "
                f"turn 1, {ours['rss_end'] / MB:.1f} MB after {ours['turns']} "
                f"(+{growth / MB:.1f} MB)",
                _yes(ours["rss_end"] <= 45 * MB and growth <= 2 * MB),
            ]
        )
    context = results.get("context")
    if context:
        clear = context["clear"]
        small, large = clear[0], clear[-1]
        ratio = large["from_clear_to_reply_ms"] / small["from_clear_to_reply_ms"]
        rows.append(
            [
                "`clear_context` cost vs history length",
                "independent",
                f"{_ms(small['from_clear_to_reply_ms'])} ms at {small['window_messages']} "
                f"messages, {_ms(large['from_clear_to_reply_ms'])} ms at "
                f"{large['window_messages']}",
                _yes(ratio < 1.5),
            ]
        )
        opened = context["open"]
        small, large = opened[0], opened[-1]
        ratio = large["ms"] / small["ms"]
        rows.append(
            [
                f"open a session with a {large['events']:,}-event log",
                "O(window)",
                f"{_ms(large['ms'])} ms vs {_ms(small['ms'])} ms for {small['events']} events "
                f"(same {large['window_messages']}-message window)",
                _yes(ratio < 3),
            ]
        )
    if "append" in results:
        rate = results["append"]["batch_5"]["events_per_s"]
        rows.append(
            [
                "SQLite append, one durable commit per run step (5 events)",
                "≥ 20k events/s",
                f"{rate / 1000:.1f}k events/s",
                _yes(rate >= 20_000),
            ]
        )
    rows += _scale_rows(results)
    if not rows:
        return []
    if results.get("smoke"):
        # A smoke run's few samples on a busy CI machine say nothing about the budget: its
        # figures are shown, the verdict is left to full runs.
        note = "Smoke run: figures only; the budget is judged on full runs."
        table = _table(["line", "target", "measured"], [row[:3] for row in rows])
        return ["### Budget", "", note, "", *table]
    return ["### Budget", "", *_table(["line", "target", "measured", "holds"], rows)]


def _scale_rows(results: dict[str, Any]) -> list[list[str]]:
    """The budget's lines for many sessions, streaming and the embedded model."""
    rows: list[list[str]] = []
    many = results.get("many")
    if many:
        server = many["burst_plain"]["server_cpu_ms_per_turn"]
        alone = many["in_process"]["plain"]["cpu_ms_per_turn"]
        sessions = many["sessions"]
        rows.append(
            [
                f"server CPU per plain turn, {sessions:,} sessions over JSON-RPC",
                "≤ 2× in process, one at a time",
                f"{_ms(server)} vs {_ms(alone)} ms ({server / alone:.2f}×)",
                _yes(server <= 2 * alone),
            ]
        )
        for kind in ("plain", "tool"):
            paced = many[f"paced_{kind}"]
            p99 = paced["turn_ms"]["p99"]
            rows.append(
                [
                    f"{kind} turn p99 above the model at half the burst rate"
                    f" ({paced['rate']:.0f} turns/s)",
                    "≤ 50 ms",
                    f"{p99:.1f} ms",
                    _yes(p99 <= 50),
                ]
            )
        limit = 45 * MB + 56 * KB * sessions
        rss = max(many["server_rss_end"], many["server_rss_after_bursts"])
        rows.append(
            [
                f"server RSS with {sessions:,} sessions",
                f"≤ 45 MB + 56 KB per session ({limit / MB:.0f} MB)",
                f"{rss / MB:.0f} MB",
                _yes(rss <= limit),
            ]
        )
    streaming = results.get("streaming")
    if streaming:
        p99 = streaming["in_process"]["arrival_to_handler_ms"]["p99"]
        rows.append(
            ["delta: provider's bytes → `on()` handler, p99", "≤ 0.3 ms", f"{p99:.3f} ms"]
            + [_yes(p99 <= 0.3)]
        )
        rpc = streaming["json_rpc"]
        client = "official" if rpc.get("official") else "lean"
        p99 = rpc[client]["stamp_to_event_ms"]["p99"]
        rows.append(
            [
                f"delta: provider's bytes → JSON-RPC client's event ({client} client), p99",
                "≤ 2 ms",
                f"{p99:.3f} ms",
                _yes(p99 <= 2),
            ]
        )
    pg = results.get("postgres")
    if pg:
        commits = max(pg[kind]["commits_per_step"] for kind in ("plain", "tool"))
        rows.append(
            [
                "PostgreSQL: durable commits per run step (plain, one-tool)",
                "≤ 1",
                " / ".join(f"{pg[kind]['commits_per_step']:g}" for kind in ("plain", "tool")),
                _yes(commits <= 1),
            ]
        )
        streaming = pg["streaming"]["per_turn"]
        rows.append(
            [
                f"PostgreSQL: NOTIFY round trips of a streaming turn ({pg['chunks']} deltas)",
                "fewer than the deltas (coalesced)",
                f"{streaming.get('notify', 0):.1f}",
                _yes(streaming.get("notify", 0) < pg["chunks"]),
            ]
        )
        cpu = pg["plain"]["cpu_ms_per_turn"]
        memory = pg.get("memory_cpu_ms_per_turn", {}).get("plain")
        reference = f" (memory store: {_ms(memory)} ms)" if memory is not None else ""
        rows.append(
            [
                "PostgreSQL: trimtab's CPU per plain turn (in process)",
                "≤ 1.5 ms",
                f"{_ms(cpu)} ms{reference}",
                _yes(cpu <= 1.5),
            ]
        )
    local = results.get("local")
    if local:
        for kind, turns in local["conversation"].items():
            if len(turns) < 10:
                continue
            second, last = turns[1]["read_ms"], turns[-1]["read_ms"]
            rows.append(
                [
                    f"embedded model ({kind}): prompt processing, turn {len(turns)} vs turn 2",
                    "≤ 1.5×",
                    f"{last:.0f} vs {second:.0f} ms ({last / second:.2f}×)",
                    _yes(last <= 1.5 * second),
                ]
            )
        ttft = local["ttft"]
        rows.append(
            [
                "embedded model: time to first token vs raw llama-cpp-python (same cache)",
                "≤ 1.2×",
                f"{ttft['ours_ms']:.0f} vs {ttft['raw_ms']:.0f} ms ({ttft['ratio']:.2f}×)",
                _yes(ttft["ratio"] <= 1.2),
            ]
        )
        loads = local["load"]["loads_for_two_providers"]
        rows.append(["embedded model: loads per process", "1", str(loads), _yes(loads == 1)])
    return rows


def _many(results: dict[str, Any]) -> list[str]:
    many = results.get("many")
    if not many:
        return []
    alone = many["in_process"]
    rows = []
    for kind in ("plain", "tool"):
        burst, paced = many[f"burst_{kind}"], many[f"paced_{kind}"]
        rows.append(
            [
                kind,
                f"{burst['turns_per_s']:.0f}",
                f"{burst['server_cores']:.2f}",
                _ms(burst["server_cpu_ms_per_turn"]),
                f"{burst['turns_per_server_core_s']:.0f}",
                _ms(alone[kind]["cpu_ms_per_turn"]),
                f"{paced['rate']:.0f}",
                f"{paced['turn_ms']['p50']:.1f} / {paced['turn_ms']['p99']:.1f}",
                _ms(paced["server_cpu_ms_per_turn"]),
            ]
        )
    header = [
        "turn",
        "burst turns/s",
        "server cores",
        "server CPU ms per turn",
        "turns/s per server core",
        "in process, one at a time: CPU ms per turn",
        "paced turns/s",
        "paced turn p50 / p99 (ms)",
        "paced server CPU ms per turn",
    ]
    rss = ", ".join(
        f"{many[key] / MB:.0f} MB {label}"
        for key, label in (
            ("server_rss_start", "at start"),
            ("server_rss_created", "with the sessions created"),
            ("server_rss_end", "at the end"),
        )
    )
    notes = [
        "",
        f"One `trimtab serve` process ({many['store']}, TCP), {many['sessions']:,} sessions over"
        f" {many['connections']} connections of a lean JSON-RPC load client, each session"
        " declaring a client-side tool; the fake model answers at once. Burst: every session"
        f" runs {many['turns_per_session']} plain turns back to back, all at once, then one"
        " one-tool turn each (the client approves and runs the tool). Paced: turns arrive at"
        " half the burst's rate on idle sessions; a turn is `session.sendAndWait` to its answer,"
        " so its latency is above the model (its HTTP round trip included). In process: the"
        " same turns through `trimtab.Client` in a process of its own, one at a time. CPU from"
        f" /proc. Server RSS: {rss}.",
    ]
    return ["### Many sessions on one server", "", *_table(header, rows), *notes]


def _streaming(results: dict[str, Any]) -> list[str]:
    data = results.get("streaming")
    if not data:
        return []
    inproc, rpc = data["in_process"], data["json_rpc"]

    def stats(values: dict[str, Any]) -> list[str]:
        return [f"{values[key]:.3f}" for key in ("p50", "p99", "max")] + [str(values["n"])]

    rows = [
        ["provider's bytes → `on()` handler", *stats(inproc["arrival_to_handler_ms"])],
        ["fake model's write → `on()` handler", *stats(inproc["stamp_to_handler_ms"])],
        ["fake model's write → lean JSON-RPC client", *stats(rpc["lean"]["stamp_to_event_ms"])],
    ]
    if rpc.get("official"):
        rows.append(
            [
                "fake model's write → official Copilot client's handler",
                *stats(rpc["official"]["stamp_to_event_ms"]),
            ]
        )
    notes = [
        "",
        f"{data['turns']} streaming turns of {data['chunks']} deltas, {data['gap_ms']:g} ms"
        " apart, each stamped by the fake model with the machine's monotonic clock when written."
        " In process the delta's arrival is when `recv` on the socket to the model returned it;"
        " over JSON-RPC (`trimtab serve`, TCP) it is measured from the stamp, so the model's"
        " loopback hop to the server is included.",
    ]
    header = ["delta latency (ms)", "p50", "p99", "max", "deltas"]
    return ["### Streaming latency", "", *_table(header, rows), *notes]


def _postgres(results: dict[str, Any]) -> list[str]:
    data = results.get("postgres")
    if not data:
        return []
    rows = []
    for kind in ("plain", "tool", "streaming"):
        part = data[kind]
        turn = part["per_turn"]
        rows.append(
            [
                kind if kind != "streaming" else f"streaming ({data['chunks']} deltas)",
                str(part["steps_per_turn"]),
                f"{turn.get('round_trips', 0):.1f}",
                f"{turn.get('writes', 0):.1f}",
                f"{turn.get('notify', 0):.1f}",
                f"{turn.get('other', 0):.1f}",
                f"{turn.get('transactions', 0):.1f}",
                f"{turn.get('commits', 0):.1f} ({part['commits_per_step']:g} per step)",
                f"{turn.get('async_commits', 0):.1f}",
                _ms(part["cpu_ms_per_turn"]),
            ]
        )
    header = [
        "turn",
        "steps",
        "round trips",
        "writes",
        "NOTIFY alone",
        "other statements",
        "transactions",
        "durable commits",
        "asynchronous commits",
        "trimtab CPU ms per turn",
    ]
    settings = data.get("postgres", {})
    notes = [
        "",
        f"Per turn, mean of {data['plain']['turns']} turns (after 5 untimed ones) of a"
        " `trimtab.Client` session in process on a fresh PostgreSQL"
        f" {settings.get('server_version', '?').split()[0]} database"
        f" (fsync={settings.get('fsync', '?')},"
        f" synchronous_commit={settings.get('synchronous_commit', '?')}); statements counted"
        " by wrapping psycopg over as many turns again (the wrappers cost CPU of their own,"
        " so not while CPU is timed): every statement is a round trip, a transaction two"
        " more; a write in autocommit, or a transaction holding one, is a commit: durable,"
        " unless trimtab made it asynchronous (`synchronous_commit` off for that commit,"
        " spec P5: counted apart, it waits for no WAL flush). A step is one model call; the"
        " floor is one durable commit per step, which trimtab meets: the send's message and"
        " a tool call's start are durable, the run's other appends asynchronous.",
        *_pg_reference(data),
    ]
    return ["### PostgreSQL per turn", "", *_table(header, rows), *notes]


def _pg_reference(data: dict[str, Any]) -> list[str]:
    """What the PostgreSQL turns' CPU is read against: the same turns on the memory store."""
    memory = data.get("memory_cpu_ms_per_turn")
    if not memory:
        return []
    costs = []
    for kind, ms in memory.items():
        extra = data[kind]["cpu_ms_per_turn"] - ms
        statements = data[kind]["per_turn"].get("statements", 0)
        each = f", {_ms(extra / statements)} ms per statement" if statements else ""
        costs.append(f"{kind} {_ms(ms)} ms (PostgreSQL: {_ms(extra)} ms more{each})")
    return [
        "",
        "The same turns in the same process on the memory store (no database) took "
        + "; ".join(costs)
        + " of CPU: what a turn costs above it on PostgreSQL is its statements (psycopg, the"
        " pool, the loopback socket).",
    ]


def _local(results: dict[str, Any]) -> list[str]:
    data = results.get("local")
    if not data:
        return []
    kinds = data["conversation"]
    count = max(len(turns) for turns in kinds.values())
    rows = []
    for i in range(count):
        row = [str(i + 1)]
        for turns in kinds.values():
            turn = turns[i] if i < len(turns) else None
            row.append(
                "–"
                if turn is None
                else f"{turn['prompt_tokens']} / {turn['read_tokens']} / {turn['read_ms']:.0f}"
            )
        rows.append(row)
    header = ["turn", *(f"{kind}: prompt / read tokens / read ms" for kind in kinds)]
    load = data["load"]
    notes = [
        "",
        f"{data['model']}; `{'`, `'.join(kinds)}`: a plain conversation, one with a tool"
        " offered (two generations a turn: the pick, then the reply), and two conversations"
        " taking turns on one model. Per turn: the prompt tokens given to llama.cpp and those"
        f" it read (the rest it held), median of {data['repeats']} repeats. Model load"
        f" {load['first_s']:.2f} s; two providers in two clients loaded it"
        f" {load['loads_for_two_providers']} time(s).",
    ]
    return ["### Embedded model", "", *_table(header, rows), *notes]


def _in_process(results: dict[str, Any]) -> list[str]:
    turns = results.get("turns")
    peers = results.get("peers", {})
    if not turns and not peers:
        return []
    memory, imports = results.get("memory", {}), results.get("import", {})
    rows: list[list[str]] = []
    for store in ("memory", "sqlite"):
        if turns and store in turns:
            row = turns[store]
            per = memory.get(store, {}).get("traced")
            rows.append(
                [
                    f"trimtab ({store} store)",
                    _pair(row["plain"]),
                    _pair(row["tool"]),
                    f"{_pair(row['plain_lean'])}; {_pair(row['tool_lean'])}",
                    _pair(row["plain"]["floor"]) + "; " + _pair(row["tool"]["floor"]),
                    f"{per / KB:.1f} KB" if per is not None else "",
                    f"{imports['import_trimtab_s']:.2f} s" if imports else "",
                ]
            )
    for peer in peers.values():
        rows.append(
            [
                f"{peer['name']} {peer['version']}",
                _pair(peer["plain"]),
                _pair(peer["tool"]),
                "",
                _pair(peer["plain"]["floor"]) + "; " + _pair(peer["tool"]["floor"]),
                f"{peer['memory']['traced'] / KB:.1f} KB",
                f"{peer['import_s']:.2f} s",
            ]
        )
    for name in ("agents", "pydantic-ai", "langgraph"):
        if name not in peers:
            rows.append(
                [f"{PEER_LABELS[name]} (quoted, not run)", QUOTED[name], "", "", "", "", ""]
            )
    header = [
        "in process",
        "plain turn above floor",
        "one-tool turn above floor",
        "above the lean floor (plain; tool)",
        "floor itself (plain; tool)",
        "memory per idle session",
        "import",
    ]
    notes = [
        "",
        "Each row's floor is the raw `openai` client doing the same turn by hand, timed",
        "interleaved with it in the same process. The lean floor is the same client handing",
        "messages over in `extra_body`, as trimtab's provider does (it skips the client's",
        "per-message transform). Memory per idle session: tracemalloc, per session, of 1,000",
        "sessions left after one plain turn: trimtab's `Session` (its log on disk for SQLite, in",
        "the process for the memory store), the Agents SDK's in-memory `SQLiteSession`, Pydantic",
        "AI's message history, a LangGraph `InMemorySaver` thread.",
    ]
    quoted = "; ".join(f"{label}: {QUOTED[name]}" for name, label in PEER_LABELS.items())
    notes += ["", f"For reference, the issue's figures measured elsewhere: {quoted}."]
    notes += _idle_notes(results)
    return ["### In process, above the raw client", "", *_table(header, rows), *notes]


def _idle_notes(results: dict[str, Any]) -> list[str]:
    """RSS per idle session, by store, and the process holding the most of them."""
    notes: list[str] = []
    idle = results.get("idle", {})
    if idle:
        figures = "; ".join(
            f"{row['rss_per_session'] / KB:.2f} KB ({store} store)" for store, row in idle.items()
        )
        count = max(row["sessions"] for row in idle.values())
        notes += [
            "",
            f"RSS per idle trimtab session, growth of one process over {count:,} sessions each"
            f" left after one plain turn (ScriptedModel): {figures}. Read from /proc/self/statm"
            " after `gc.collect()` and glibc's `malloc_trim(0)`, so that heap the allocator"
            " kept from freed garbage does not count; each store in a fresh process, after 100"
            " warm-up sessions. The memory store keeps the sessions' logs in the process too.",
        ]
    rss = results.get("rss")
    if rss:
        notes += [
            "",
            f"{rss['sessions']:,} idle trimtab sessions ({rss.get('store', 'sqlite')} store) in"
            f" one process: {rss['rss_total'] / MB:.0f} MB RSS, {rss['rss_per_session'] / KB:.1f}"
            f" KB each (opened in {rss.get('seconds', 0):.0f} s).",
        ]
    return notes


def _scripted(results: dict[str, Any]) -> list[str]:
    scripted = results.get("scripted")
    if not scripted:
        return []
    rows = [
        [store, _pair(row["plain"]), _pair(row["tool"]), _pair(row["open_session"])]
        for store, row in scripted.items()
    ]
    header = ["store", "plain turn", "one-tool turn", "create_session"]
    return [
        "### trimtab's own overhead (ScriptedModel, no HTTP)",
        "",
        *_table(header, rows),
    ]


def _tracing(results: dict[str, Any]) -> list[str]:
    tracing = results.get("tracing")
    if not tracing:
        return []
    rows = []
    for phase, label in (("not loaded", "not loaded"), ("loaded", "API and SDK loaded")):
        off = tracing.get(phase, {}).get("off")
        for name, row in tracing.get(phase, {}).items():
            extra = "; ".join(
                f"{row[kind]['median'] - off[kind]['median']:+.2f}" for kind in ("plain", "tool")
            )
            rows.append(
                [label, name, _pair(row["plain"]), _pair(row["tool"]), "" if row is off else extra]
            )
    header = ["OpenTelemetry in the process", "tracing", "plain turn", "one-tool turn", "vs off"]
    notes = [
        "",
        "ScriptedModel, memory store, no HTTP; each group interleaved in one process. *Not"
        " loaded*: the application never imported OpenTelemetry, so trimtab does not either."
        " *API without SDK*: the global provider is the API's no-op. *SDK*: a `TracerProvider`"
        " with a span processor whose exporter drops the spans (what recording them costs).",
    ]
    if "sdk" in tracing:
        notes.append(f"SDK rows missing: {tracing['sdk']}.")
    return ["### Tracing (OpenTelemetry) off and on", "", *_table(header, rows), *notes]


def _server(results: dict[str, Any]) -> list[str]:
    server = results.get("server", {})
    if not server:
        return []
    rows = []
    for row in server.values():
        curve = ", ".join(f"{rss / MB:.0f} MB @{n}" for n, rss in row["rss_curve"] if n in (1, 100))
        version = "".join((results.get("copilot_version") or "Copilot CLI").splitlines()[:1])
        label = version.rstrip(".") if row["target"] == "copilot" else "trimtab serve"
        rows.append(
            [
                label.strip(),
                row["transport"],
                f"{row['ready_s']:.2f} s",
                _pair(row["plain"]),
                _pair(row["tool"]),
                f"{row['rss_start'] / MB:.0f} MB",
                f"{row['rss_session'] / MB:.0f} MB",
                f"{curve}; {row['rss_end'] / MB:.0f} MB @{row['turns']}",
            ]
        )
    if "copilot stdio" not in server:
        rows.append(
            ["Copilot CLI (quoted, not run)", "stdio", QUOTED["copilot"], "", "", "", "", ""]
        )
    header = [
        "runtime",
        "transport",
        "ready",
        "plain turn",
        "one-tool turn",
        "RSS at start",
        "after create_session",
        "RSS after n turns",
    ]
    return [
        "### Over JSON-RPC, driven by the official Copilot Python client",
        "",
        *_table(header, rows),
        "",
        "One session, plain and one-tool turns alternating (history grows), BYOK provider",
        "pointing at the fake model. `ready` is `CopilotClient.start()`: spawn, start-up and",
        "the `connect` handshake. RSS is the server's whole process tree. The issue's figures",
        f"for the Copilot CLI, measured elsewhere: {QUOTED['copilot']}.",
    ]


def _store(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    append = results.get("append")
    if append:
        rows = [
            [key.removeprefix("batch_"), f"{row['events_per_s']:,.0f}"]
            for key, row in append.items()
            if key.startswith("batch_")
        ]
        lines += [
            "### SQLite appends (one durable commit per batch)",
            "",
            *_table(["events per commit", "events/s"], rows),
            "",
            f"A plain run stores 5 events, a one-tool run {append['events_per_run']}; the runtime",
            "appends them as they are emitted: the message with its turn's start, the reply with"
            " its usage, the turn's end after its usage info (3 appends for a plain run, 10 for"
            " a one-tool run).",
            "",
        ]
    context = results.get("context")
    if context:
        rows = []
        for opened, bare, clear, turn in zip(
            context["open"], context["open_no_base"], context["clear"], context["turn"], strict=True
        ):
            rows.append(
                [
                    f"{opened['events']:,}",
                    _ms(opened["ms"]),
                    _ms(bare["ms"]),
                    f"{clear['clear_call_ms'] * 1000:.0f} µs",
                    _ms(clear["from_clear_to_reply_ms"]),
                    f"{turn['window_messages']:,}",
                    _pair(turn),
                ]
            )
        header = [
            "log events",
            "open (clear 2 turns before the end)",
            "open (no base: window = whole log)",
            "`clear_context()` call",
            "clear → seeded reply",
            "window messages",
            "plain turn at that window (ScriptedModel)",
        ]
        lines += ["### History length: open, clear_context, turn", "", *_table(header, rows)]
    return lines


def _errors(results: dict[str, Any]) -> list[str]:
    errors = results.get("errors") or {}
    if not errors:
        return []
    return [
        "### Not measured",
        "",
        *(f"- {name}: {text.splitlines()[0]}" for name, text in errors.items()),
    ]


def _scaleout(results: dict[str, Any]) -> list[str]:
    data = results.get("scaleout")
    if not data:
        return []
    rows = data["rows"]
    base = next((row for row in rows if row["processes"] == 1), rows[0])
    table = []
    for row in rows:
        cpu, turn, delivery = row["cpu_cores"], row["turn_ms"], row["delivery_ms"]
        per_turn = row["cpu_ms_per_turn"]
        postgres = "?" if cpu.get("postgres") is None else f"{cpu['postgres']:.2f}"
        table.append(
            [
                str(row["processes"]),
                f"{row['turns_per_s']:.0f}",
                f"{row['turns_per_s'] / base['turns_per_s']:.2f}×",
                f"{turn['p50']:.0f} / {turn['p99']:.0f}",
                f"{turn['p50'] / base['turn_ms']['p50']:.2f}×",
                f"{delivery['p50']:.0f} / {delivery['p99']:.0f}",
                " / ".join(
                    f"{per_turn[name]:.2f}" if name in per_turn else "?"
                    for name in ("driver", "servers", "postgres")
                ),
                f"{cpu['driver']:.2f}{' **(bottleneck)**' if row['driver_bound'] else ''} / "
                f"{cpu['servers']:.2f} / {postgres} / {cpu['rest']:.2f}"
                f" ({cpu['machine']:.2f} of {cpu['machine_capacity']:.0f})",
                ", ".join(str(mb) for mb in row["servers_rss_mb"]),
            ]
        )
    header = [
        "`trimtab serve` processes",
        "turns/s",
        "vs 1 process",
        "turn p50 / p99 (ms)",
        "p50 vs 1 process",
        "delivery p50 / p99 (ms)",
        "CPU ms per turn: driver / servers / PostgreSQL",
        "CPU cores: driver / servers / PostgreSQL / rest (machine busy)",
        "server RSS (MB)",
    ]
    settings = data.get("postgres", {})
    connections = {"per-session": "one connection per session", "per-server": "one per server"}
    notes = [
        "",
        f"{data['sessions']} concurrent sessions, spread round-robin over N `trimtab serve`"
        " processes that share one PostgreSQL database (a fresh one per N); each session runs"
        f" {data['turns_per_session']} plain turns (`send_and_wait`, one after another) after"
        f" {data['warmup_turns']} untimed warm-up turn(s), all sessions starting together. One"
        " driver process (asyncio, trimtab's remote client,"
        f" {connections.get(data['connections'], data['connections'])}), the fake model and"
        f" PostgreSQL {settings.get('server_version', '?').split()[0]}"
        f" (fsync={settings.get('fsync', '?')},"
        f" synchronous_commit={settings.get('synchronous_commit', '?')}) run on the same machine.",
        "",
        "Throughput is over the whole timed phase. A turn is `send_and_wait` to its answer (the"
        " run's `session.idle`); with every session busy its latency is mostly queueing"
        " (sessions / throughput), not what one turn costs an idle server. Delivery is an"
        " `assistant.message` event's arrival at the client's subscriber minus its `timestamp`"
        " (stamped by the server when it made the event; same clock). CPU is from /proc over the"
        " timed phase (PostgreSQL: the backends connected to the bench's database); *rest* is the"
        " machine's busy time not accounted to those, the driver, the servers or the fake model:"
        " PostgreSQL's background processes, the kernel and whatever else runs on the machine."
        " CPU per turn does not depend on that other load; throughput does.",
        "",
        *_scaleout_verdict(rows),
    ]
    return ["### Scale-out (PostgreSQL)", "", *_table(header, table), *notes]


def _scaleout_verdict(rows: list[dict[str, Any]]) -> list[str]:
    """What the numbers say about the bottleneck, computed, so that it stays true on re-runs."""
    lines = []
    bound = [str(row["processes"]) for row in rows if row["driver_bound"]]
    if bound:
        lines.append(
            f"**The driver was the bottleneck at N = {', '.join(bound)}**: those rows measure"
            " trimtab's client as much as the servers."
        )
    else:
        driver = max(row["cpu_cores"]["driver"] for row in rows)
        lines.append(f"The driver used at most {driver:.2f} of a core: not the bottleneck.")
    single = next((row for row in rows if row["processes"] == 1), None)
    if single and single["cpu_cores"]["servers"] >= 0.85:
        lines.append(
            f"At N = 1 the one server used {single['cpu_cores']['servers']:.2f} of a core: a"
            " `trimtab serve` process is CPU-bound (one Python thread), so throughput can only"
            " grow with N while there are idle cores for the extra processes."
        )
    widest = max(rows, key=lambda row: row["processes"])
    per_turn = sum(widest["cpu_ms_per_turn"].values())
    capacity = widest["cpu_cores"]["machine_capacity"]
    lines.append(
        f"At N = {widest['processes']} a turn cost {per_turn:.1f} ms of CPU (driver, servers and"
        f" database backends together), so {capacity:.0f} cores cannot serve more than"
        f" ~{capacity * 1000 / per_turn:.0f} turns/s, however many processes share them."
    )
    rest = max(row["cpu_cores"]["rest"] for row in rows)
    if rest >= 0.25:
        lines.append(
            f"Other work took up to {rest:.2f} cores during the run (*rest*): compare CPU per turn"
            " across rows rather than throughput."
        )
    return [" ".join(lines)]


MAIN: tuple[Section, ...] = (
    _budget,
    _in_process,
    _scripted,
    _tracing,
    _server,
    _many,
    _streaming,
    _store,
    _postgres,
    _local,
    _errors,
)
"""The sections between `BEGIN` and `END`; `_errors` comes last."""
