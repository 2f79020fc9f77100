"""Pydantic AI on the benchmark scenario (runs in the peers' virtual environment).

python bench/peers/pydantic_ai_agent.py --base-url http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402
import openai  # noqa: E402
from pydantic_ai import Agent  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
from pydantic_ai.models.openai import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    OpenAIChatModel,
)
from pydantic_ai.providers.openai import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    OpenAIProvider,
)

IMPORT = "import pydantic_ai"


async def main() -> dict[str, Any]:
    args = common.worker_args(__doc__ or "")
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=common.API_KEY)
    model = OpenAIChatModel(common.MODEL, provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, instructions=common.SYSTEM)

    @agent.tool_plain  # type: ignore[untyped-decorator, unused-ignore]
    def echo(text: str) -> str:
        """Echo the given text back."""
        return common.echo(text)

    turns = await common.measure_turns(
        args.base_url,
        args.runs,
        args.warmup,
        lambda: agent.run(common.PLAIN_PROMPT),
        lambda: agent.run(common.TOOL_PROMPT),
    )
    kept: list[Any] = []

    async def idle_session(i: int) -> None:
        # Pydantic AI has no session object: the caller keeps the message history.
        result = await agent.run(common.PLAIN_PROMPT)
        kept.append(result.all_messages())

    memory = await common.bytes_per_session(idle_session, args.sessions)
    return {
        "name": "Pydantic AI",
        "version": _version("pydantic-ai-slim"),
        "idle_session": "the message history after one turn",
        **turns,
        "memory": memory,
        "import_s": common.import_seconds(IMPORT),
    }


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    common.run_worker(main)
