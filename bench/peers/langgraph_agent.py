"""LangGraph's prebuilt ReAct agent on the benchmark scenario (peers' virtual environment).

python bench/peers/langgraph_agent.py --base-url http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402
from langchain_core.tools import tool  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
from langchain_openai import ChatOpenAI  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
from langgraph.checkpoint.memory import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    InMemorySaver,
)
from langgraph.prebuilt import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    create_react_agent,
)

IMPORT = "import langgraph.prebuilt, langchain_openai"


async def main() -> dict[str, Any]:
    args = common.worker_args(__doc__ or "")
    # create_react_agent is deprecated in favour of langchain.agents.create_agent, which
    # needs the `langchain` package on top; the graph it builds is the same loop.
    warnings.simplefilter("ignore")

    @tool  # type: ignore[untyped-decorator, unused-ignore]
    def echo(text: str) -> str:
        """Echo the given text back."""
        return common.echo(text)

    llm = ChatOpenAI(model=common.MODEL, base_url=args.base_url, api_key=common.API_KEY)
    graph = create_react_agent(llm, [echo], prompt=common.SYSTEM)
    turns = await common.measure_turns(
        args.base_url,
        args.runs,
        args.warmup,
        lambda: graph.ainvoke({"messages": [("user", common.PLAIN_PROMPT)]}),
        lambda: graph.ainvoke({"messages": [("user", common.TOOL_PROMPT)]}),
    )
    saved = create_react_agent(llm, [echo], prompt=common.SYSTEM, checkpointer=InMemorySaver())

    async def idle_session(i: int) -> None:
        # A thread of the in-memory checkpointer, after one turn.
        config = {"configurable": {"thread_id": f"bench-{i}"}}
        await saved.ainvoke({"messages": [("user", common.PLAIN_PROMPT)]}, config=config)

    memory = await common.bytes_per_session(idle_session, args.sessions)
    return {
        "name": "LangGraph",
        "version": _version("langgraph"),
        "idle_session": "a thread of InMemorySaver after one turn",
        **turns,
        "memory": memory,
        "import_s": common.import_seconds(IMPORT),
    }


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    common.run_worker(main)
