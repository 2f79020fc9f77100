"""OpenAI Agents SDK on the benchmark scenario (runs in the peers' virtual environment).

python bench/peers/agents_sdk.py --base-url http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402
import openai  # noqa: E402
from agents import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    SQLiteSession,
    function_tool,
    set_tracing_disabled,
)

IMPORT = "import agents"


async def main() -> dict[str, Any]:
    args = common.worker_args(__doc__ or "")
    # Tracing is on by default and exports spans to OpenAI: off, as in any offline run.
    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=common.API_KEY)

    @function_tool(name_override="echo")  # type: ignore[untyped-decorator, unused-ignore]
    def echo(text: str) -> str:
        """Echo the given text back."""
        return common.echo(text)

    agent = Agent(
        name="bench",
        instructions=common.SYSTEM,
        tools=[echo],
        model=OpenAIChatCompletionsModel(model=common.MODEL, openai_client=client),
    )
    turns = await common.measure_turns(
        args.base_url,
        args.runs,
        args.warmup,
        lambda: Runner.run(agent, common.PLAIN_PROMPT),
        lambda: Runner.run(agent, common.TOOL_PROMPT),
    )
    kept: list[Any] = []

    async def idle_session(i: int) -> None:
        # The SDK's own session store (SQLite in memory), after one turn.
        session = SQLiteSession(f"bench-{i}")
        await Runner.run(agent, common.PLAIN_PROMPT, session=session)
        kept.append(session)

    memory = await common.bytes_per_session(idle_session, args.sessions)
    return {
        "name": "OpenAI Agents SDK",
        "version": _version("openai-agents"),
        "idle_session": "SQLiteSession (in memory) after one turn",
        **turns,
        "memory": memory,
        "import_s": common.import_seconds(IMPORT),
    }


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    common.run_worker(main)
