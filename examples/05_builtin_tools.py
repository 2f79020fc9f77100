"""The agent's own tools: read, edit and test code in a directory, as the Copilot CLI does.

A program gives its session `builtin_tools(root)` (the Copilot CLI's `view`, `create`,
`edit`, `bash`, `grep` and `glob`) and asks the agent to fix a failing test. The model is
scripted here, so this runs offline; a real one calls the same tools. Every call is asked
about in the CLI's shapes: `read` with the path, `write` with the file and a diff, `shell`
with the command line.

Run it: `python examples/05_builtin_tools.py`
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from trimtab import Client, Event, PermissionDecision, ToolInvocation, builtin_tools
from trimtab.events import PermissionRequestData, ToolExecutionCompleteEvent
from trimtab.testing import ScriptedModel, tool_call


def approve(request: PermissionRequestData, invocation: ToolInvocation) -> PermissionDecision:
    """Approve everything, saying what was asked (a real host asks its user)."""
    what = request.full_command_text or request.path or request.file_name
    print(f"[asked] {request.kind}: {what}")
    return PermissionDecision(kind="approve-once")


def show(event: Event) -> None:
    if isinstance(event, ToolExecutionCompleteEvent):
        print(f"[{event.data.tool_name}] {event.data.outcome}")


async def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        repo = Path(directory)
        (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
        (repo / "test_calc.py").write_text(
            "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('test passed')\n"
        )
        test = {"command": f"{sys.executable} test_calc.py", "description": "Run the test"}
        model = ScriptedModel(
            [
                tool_call("bash", test),
                tool_call("view", {"path": "calc.py"}),
                tool_call("edit", {"path": "calc.py", "old_str": "a - b", "new_str": "a + b"}),
                tool_call("bash", test),
                "Fixed: add subtracted; it adds now and the test passes.",
            ]
        )
        async with Client(store="memory") as client:
            session = await client.create_session(
                provider=model,
                tools=builtin_tools(repo, shell_timeout=60),
                on_permission_request=approve,
            )
            session.on("tool.execution_complete", show)
            reply = await session.send_and_wait("The test fails. Fix the code.")
            print("reply:", reply.data.content if reply else None)
            results = [m.content for m in model.requests[-1].messages if m.role == "tool"]
            print("last test run:", results[-1].splitlines())
        print("calc.py now:", (repo / "calc.py").read_text().splitlines()[1].strip())


if __name__ == "__main__":
    asyncio.run(main())
