"""Tools the engine's worker processes run (`trimtab worker --tools tests.temporal.tools:TOOLS`),
and that the tests' sessions declare.

`block` marks that it started (a file in `$TRIMTAB_TEST_MARKERS`, named after the process) and
never returns, so that a test can kill its worker mid call. `stall` marks that it started,
then holds its worker's event loop (no heartbeat, nothing else runs) until the file `go`
appears there. `clear` clears the context with the seed "fresh start". `ask` needs a
permission.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from pydantic import BaseModel

from trimtab import ToolInvocation, define_tool

__all__ = ["SEED", "TOOLS"]

SEED = "fresh start"


class Nothing(BaseModel):
    pass


async def _block(params: Nothing, invocation: ToolInvocation) -> str:
    markers = Path(os.environ["TRIMTAB_TEST_MARKERS"])
    (markers / f"block-{os.getpid()}").write_text(invocation.tool_call_id)
    await asyncio.Event().wait()
    return "never"


async def _stall(params: Nothing, invocation: ToolInvocation) -> str:
    markers = Path(os.environ["TRIMTAB_TEST_MARKERS"])
    (markers / f"stall-{os.getpid()}").write_text(invocation.tool_call_id)
    while not (markers / "go").exists():
        time.sleep(0.05)  # noqa: ASYNC251 (on purpose: the worker stalls as a whole)
    return "stalled"


def _clear(params: Nothing, invocation: ToolInvocation) -> str:
    result = invocation.session.history.clear_context(SEED)
    return f"cleared {result.messages_cleared}"


TOOLS = [
    define_tool("block", params_type=Nothing, skip_permission=True, handler=_block),
    define_tool("stall", params_type=Nothing, skip_permission=True, handler=_stall),
    define_tool(
        "clear", params_type=Nothing, skip_permission=True, is_terminal=True, handler=_clear
    ),
    define_tool("ask", params_type=Nothing, handler=lambda params: "asked and done"),
]
