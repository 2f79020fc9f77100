"""The benchmarks' one entry point: trimtab and its peers against one fake model server.

    python bench/run.py [--runs 200] [--warmup 20] [--smoke] [--only NAMES]
                        [--write docs/performance.md] [--json results.json]

NAMES (comma-separated, default all): trimtab (in process: turns above the floor, pure
overhead, memory per idle session, 100,000 idle sessions, import time, tracing off and on),
agents, pydantic-ai, langgraph (the peers, each above its own floor), server (`trimtab
serve` driven by the official Copilot client), copilot (the Copilot CLI driven by the same
client), many (1,000 sessions on one `trimtab serve` over JSON-RPC: server CPU per turn
against the same turns in process, latency, RSS), streaming (a delta's latency from the
provider's bytes to an `on()` handler and to a JSON-RPC client), store (SQLite append rate,
open and clear_context costs), local (the embedded model: tokens read per turn, time to
first token against raw llama-cpp-python; skipped without the `local` extra and its
weights), postgres (database round trips, commits and NOTIFYs per turn, in process),
scaleout (1, 2 and 4 `trimtab serve` processes sharing one PostgreSQL database, 200
concurrent sessions). The last two need $TRIMTAB_BENCH_PG_DSN or $TRIMTAB_TEST_PG_DSN, and
are skipped without.

Every measurement runs in a subprocess of its own (see `common.py` for the scenario). The
peers are installed into a virtual environment under the cache directory
($TRIMTAB_BENCH_CACHE, default ~/.cache/trimtab-bench), never into this one; the Copilot CLI
comes from npm into the same cache.

`--smoke` (CI) runs trimtab's in-process pure-overhead, memory (tracemalloc, and RSS over
1,000 idle sessions), import, append, context and tracing benchmarks with few runs, and the
many-sessions, streaming and (with a DSN) PostgreSQL benches small: no network beyond
127.0.0.1, no peers, well under a minute. Timings never fail a run; a worker that crashes,
or whose correctness check fails, does.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import report

BENCH = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("TRIMTAB_BENCH_CACHE", "~/.cache/trimtab-bench")).expanduser()
PEERS = {
    "agents": "agents_sdk.py",
    "pydantic-ai": "pydantic_ai_agent.py",
    "langgraph": "langgraph_agent.py",
}
PEER_PACKAGES = ["openai-agents", "pydantic-ai", "langgraph", "langchain-openai"]
NAMES = [
    "trimtab",
    *PEERS,
    "server",
    "copilot",
    "many",
    "streaming",
    "store",
    "local",
    "postgres",
    "scaleout",
]
SERVER_BENCHES = {"many": "many_sessions.py", "streaming": "streaming.py"}
"""Benches that start their own fake model, so that they can time and count it."""
PG_DSN_VARIABLES = ("TRIMTAB_BENCH_PG_DSN", "TRIMTAB_TEST_PG_DSN")
SMOKE_RUNS = 20


class WorkerError(RuntimeError):
    pass


def worker(command: list[str], timeout: float = 1800) -> dict[str, Any]:
    """Run one benchmark process; its last stdout line is its JSON result."""
    label = " ".join(Path(part).name if "/" in part else part for part in command[1:4])
    print(f"  running {label} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=BENCH)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise WorkerError(f"{label} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(f"  ... {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def trimtab_part(part: str, *extra: str) -> dict[str, Any]:
    return worker([sys.executable, str(BENCH / "trimtab_inproc.py"), "--part", part, *extra])


def idle_rss() -> dict[str, Any]:
    """RSS growth per idle session over 1,000 sessions, per store, each in a fresh process."""
    return {
        store: trimtab_part("rss", "--store", store, "--sessions", "1000")
        for store in ("sqlite", "memory")
    }


class FakeModel:
    """`fake_model.py` in a process of its own, so that it never competes with the measured
    process for the GIL (it does for the two cores, as any local model server would)."""

    def __enter__(self) -> str:
        self.process = subprocess.Popen(
            [sys.executable, str(BENCH / "fake_model.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("PORT "):
            self.process.kill()
            raise WorkerError(f"the fake model server did not start: {line!r}")
        return f"http://127.0.0.1:{int(line.split()[1])}/v1"

    def __exit__(self, *exc: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # it serves until its stdin closes
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def peers_python() -> Path:
    """The peers' virtual environment's interpreter, created and filled on first use."""
    venv = CACHE / "peers-venv"
    python = venv / "bin" / "python"
    marker = venv / "installed.txt"
    if not marker.exists() or marker.read_text().split() != PEER_PACKAGES:
        print(f"  installing {', '.join(PEER_PACKAGES)} into {venv}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEER_PACKAGES], check=True)
        marker.write_text(" ".join(PEER_PACKAGES))
    return python


def copilot_cli() -> str:
    """The Copilot CLI, installed from npm into the cache on first use."""
    prefix = CACHE / "copilot-cli"
    cli = prefix / "node_modules" / ".bin" / "copilot"
    if not cli.exists():
        if shutil.which("npm") is None:
            raise WorkerError("npm is not installed")
        print(f"  installing @github/copilot into {prefix}", file=sys.stderr)
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "@github/copilot"],
            check=True,
            capture_output=True,
        )
    return str(cli)


def _version(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def smoke(results: dict[str, Any]) -> None:
    results["scripted"] = trimtab_part("scripted", "--runs", str(SMOKE_RUNS), "--warmup", "5")
    results["memory"] = trimtab_part("memory", "--sessions", "100")
    results["idle"] = idle_rss()
    results["import"] = trimtab_part("import")
    results["append"] = trimtab_part("append", "--smoke")
    results["context"] = trimtab_part("context", "--smoke")
    results["tracing"] = trimtab_part("tracing", "--runs", str(SMOKE_RUNS), "--warmup", "5")
    for name, script in SERVER_BENCHES.items():
        results[name] = worker([sys.executable, str(BENCH / script), "--smoke"])
    if any(os.environ.get(variable) for variable in PG_DSN_VARIABLES):
        results["postgres"] = worker([sys.executable, str(BENCH / "pg_round_trips.py"), "--smoke"])


def full(results: dict[str, Any], names: set[str], runs: str, warmup: str) -> None:
    errors = results["errors"]
    with FakeModel() as base_url:
        results["fake_model"] = base_url
        timing = ["--base-url", base_url, "--runs", runs, "--warmup", warmup]
        if "trimtab" in names:
            results["turns"] = trimtab_part("turns", *timing)
            results["scripted"] = trimtab_part("scripted", "--runs", runs, "--warmup", warmup)
            results["memory"] = trimtab_part("memory", "--sessions", "1000")
            results["idle"] = idle_rss()
            results["rss"] = trimtab_part("rss", "--store", "sqlite", "--sessions", "100000")
            results["import"] = trimtab_part("import")
            results["tracing"] = trimtab_part("tracing", "--runs", runs, "--warmup", warmup)
        wanted = [name for name in PEERS if name in names]
        if wanted:
            try:
                python = str(peers_python())
            except (subprocess.CalledProcessError, OSError) as exc:
                errors["peers"] = f"could not install the peers: {exc}"
                wanted = []
            for name in wanted:
                try:
                    script = str(BENCH / "peers" / PEERS[name])
                    results.setdefault("peers", {})[name] = worker([python, script, *timing])
                except WorkerError as exc:
                    errors[name] = str(exc)
        server = [sys.executable, str(BENCH / "server_mode.py"), *timing[:4], "--warmup", "10"]
        if "server" in names:
            for transport in (["stdio"], ["tcp"], ["tcp", "--nodelay"]):
                key = "trimtab " + " ".join(transport)
                try:
                    results.setdefault("server", {})[key] = worker(
                        [*server, "--target", "trimtab", "--transport", *transport]
                    )
                except WorkerError as exc:
                    errors[key] = str(exc)
        if "copilot" in names:
            try:
                cli = copilot_cli()
                results["copilot_version"] = _version([cli, "--version"])
                results.setdefault("server", {})["copilot stdio"] = worker(
                    [*server, "--target", "copilot", "--cli", cli]
                )
            except (WorkerError, subprocess.CalledProcessError, OSError) as exc:
                errors["copilot"] = str(exc)
    server_benches(results, names)
    if "store" in names:
        results["append"] = trimtab_part("append")
        results["context"] = trimtab_part("context")
    if "local" in names:
        local(results)
    if "postgres" in names:
        postgres(results, "postgres", "pg_round_trips.py")
    if "scaleout" in names:
        postgres(results, "scaleout", "scaleout.py")


def server_benches(results: dict[str, Any], names: set[str]) -> None:
    for name, script in SERVER_BENCHES.items():
        if name in names:
            try:
                results[name] = worker([sys.executable, str(BENCH / script)])
            except WorkerError as exc:
                results["errors"][name] = str(exc)


def local(results: dict[str, Any]) -> None:
    """`local_model.py`, if llama-cpp-python and the default weights are installed."""
    from importlib.util import find_spec

    if find_spec("llama_cpp") is None:
        message = "skipped: llama-cpp-python is not installed (the `local` extra)"
        print(f"  local {message}", file=sys.stderr, flush=True)
        results["errors"]["local"] = message
        return
    try:
        results["local"] = worker([sys.executable, str(BENCH / "local_model.py")], timeout=3600)
    except WorkerError as exc:
        results["errors"]["local"] = str(exc)


def postgres(results: dict[str, Any], name: str, script: str) -> None:
    """A bench on PostgreSQL, if a DSN is set (it reads the same variables). It starts its
    own fake model, so that it can count that process's CPU."""
    if not any(os.environ.get(variable) for variable in PG_DSN_VARIABLES):
        message = f"skipped: no PostgreSQL server (set {' or '.join(PG_DSN_VARIABLES)})"
        print(f"  {name} {message}", file=sys.stderr, flush=True)
        results["errors"][name] = message
        return
    try:
        results[name] = worker([sys.executable, str(BENCH / script)])
    except WorkerError as exc:
        results["errors"][name] = str(exc)


def compile_trimtab() -> None:
    """Compile trimtab's modules, so that imports and start-up are timed as an installed
    package has them: an editable install run with PYTHONDONTWRITEBYTECODE would compile
    every module changed since its last bytecode at every start (~30 ms for `import trimtab`)."""
    spec = importlib.util.find_spec("trimtab")
    assert spec is not None and spec.submodule_search_locations
    compileall.compile_dir(spec.submodule_search_locations[0], quiet=1)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="timed runs per turn kind")
    parser.add_argument("--warmup", type=int, default=20, help="untimed runs first")
    parser.add_argument("--smoke", action="store_true", help="CI: trimtab only, few runs")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(NAMES)}")
    parser.add_argument("--write", type=Path, help="update the tables in this markdown file")
    parser.add_argument("--json", type=Path, help="also save the raw results here")
    args = parser.parse_args()
    names = set(NAMES) if not args.only else {n.strip() for n in args.only.split(",")}
    if unknown := names - set(NAMES):
        parser.error(f"unknown names {sorted(unknown)}; choose from {NAMES}")
    results: dict[str, Any] = {
        "command": "python bench/run.py " + " ".join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}",
        "runs": SMOKE_RUNS if args.smoke else args.runs,
        "smoke": args.smoke,
        "errors": {},
    }
    try:
        if args.smoke:
            smoke(results)
        else:
            compile_trimtab()
            full(results, names, str(args.runs), str(args.warmup))
    except WorkerError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(report.render(results))
    if args.write:
        report.write(args.write, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
