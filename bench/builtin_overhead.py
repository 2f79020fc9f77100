"""What a call of a built-in tool costs above doing the same thing directly in Python.

    python bench/builtin_overhead.py [--calls 200]

For each tool, `calls` calls through the tool as the loop makes them (argument validation,
the permission request in the CLI's shape, the path checks, the handler under its timeout,
a sync handler in its own thread) against the same operation written directly: read a
100-line file, create a file, replace a line, run `bash -c true`, search 50 files, match a
glob. Calls alternate (tool, direct) so that both see the same machine; the figures are
the medians, in microseconds, and the tool's overhead is their difference.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from trimtab import builtin_tools
from trimtab._tools import CallOutcome, Tool, ToolInvocation

Op = Callable[[int], Awaitable[object]]


def tool_op(tool: Tool, arguments: Callable[[int], dict[str, Any]]) -> Op:
    async def op(i: int) -> object:
        args = arguments(i)
        params = tool.validate(args)
        assert not isinstance(params, CallOutcome), params
        tool.permission_request(args, "call", "request")
        outcome = await tool.run(
            params, ToolInvocation("s", "call", tool.name, args, cast(Any, None))
        )
        assert outcome.outcome == "success", outcome
        return outcome

    return op


async def measure(tool: Op, direct: Op, calls: int) -> tuple[float, float]:
    tool_times: list[float] = []
    direct_times: list[float] = []
    for i in range(calls):
        for op, times in ((tool, tool_times), (direct, direct_times)):
            started = time.perf_counter()
            await op(i)
            times.append(time.perf_counter() - started)
    return statistics.median(tool_times) * 1e6, statistics.median(direct_times) * 1e6


async def main(calls: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        lines = "".join(f"line {n}: some text of a source file\n" for n in range(100))
        (root / "read.txt").write_text(lines)
        for n in range(50):
            (root / "src" / f"m{n // 10}").mkdir(parents=True, exist_ok=True)
            (root / "src" / f"m{n // 10}" / f"f{n}.py").write_text(lines)
        tools = {t.name: t for t in builtin_tools(root)}
        pattern = re.compile("line 99:")

        async def direct_view(i: int) -> object:
            return (root / "read.txt").read_text()

        async def direct_create(i: int) -> object:
            # Blocking on purpose: the direct way, as a program would write it.
            with open(root / f"direct{i}.txt", "x") as file:  # noqa: ASYNC230
                return file.write("created\n")

        async def direct_edit(i: int) -> object:
            path = root / "edit_direct.txt"
            text = path.read_text()
            return path.write_text(text.replace(f"v{i}", f"v{i + 1}", 1))

        async def direct_bash(i: int) -> object:
            process = await asyncio.create_subprocess_exec("bash", "-c", "true")
            return await process.wait()

        async def direct_grep(i: int) -> object:
            return [
                p for p in sorted((root / "src").rglob("*.py")) if pattern.search(p.read_text())
            ]

        async def direct_glob(i: int) -> object:
            return sorted((root / "src").glob("**/*.py"))

        (root / "edit_direct.txt").write_text("v0\n")
        (root / "edit_tool.txt").write_text("v0\n")
        cases: dict[str, tuple[Op, Op]] = {
            "view": (tool_op(tools["view"], lambda i: {"path": "read.txt"}), direct_view),
            "create": (
                tool_op(
                    tools["create"], lambda i: {"path": f"tool{i}.txt", "file_text": "created\n"}
                ),
                direct_create,
            ),
            "edit": (
                tool_op(
                    tools["edit"],
                    lambda i: {"path": "edit_tool.txt", "old_str": f"v{i}", "new_str": f"v{i + 1}"},
                ),
                direct_edit,
            ),
            "bash": (tool_op(tools["bash"], lambda i: {"command": "true"}), direct_bash),
            "grep": (
                tool_op(tools["grep"], lambda i: {"pattern": "line 99:", "path": "src"}),
                direct_grep,
            ),
            "glob": (
                tool_op(tools["glob"], lambda i: {"pattern": "**/*.py", "path": "src"}),
                direct_glob,
            ),
        }
        print(
            f"{'tool':8} {'tool µs':>10} {'direct µs':>10} {'overhead µs':>12}  (median of {calls})"
        )
        for name, (tool, direct) in cases.items():
            through_tool, directly = await measure(tool, direct, calls)
            print(f"{name:8} {through_tool:10.0f} {directly:10.0f} {through_tool - directly:12.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    asyncio.run(main(parser.parse_args().calls))
