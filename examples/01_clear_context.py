"""The seed scenario: a terminal `clear_context` tool starts a fresh context window.

The model (scripted here, so this runs offline) calls `clear_context`; the handler clears the
conversation from inside the tool call; the session then runs the seed prompt in the fresh
window, and `send_and_wait` returns that seeded run's reply.

Run it: `python examples/01_clear_context.py`
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from trimtab import Client, PermissionHandler, ToolInvocation, define_tool
from trimtab.testing import ScriptedModel, tool_call


class ClearArgs(BaseModel):
    prompt: str


async def clear_context(params: ClearArgs, invocation: ToolInvocation) -> str:
    result = await invocation.session.history.clear_context(params.prompt)
    return f"Cleared {result.messages_cleared} messages."


async def main() -> None:
    model = ScriptedModel(
        [
            tool_call("clear_context", {"prompt": "Reply with exactly FRESH_CONTEXT."}),
            "FRESH_CONTEXT",
        ]
    )
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=model,
            system_message="You are a helpful assistant.",
            on_permission_request=PermissionHandler.approve_all,
            tools=[
                define_tool(
                    "clear_context",
                    description="Clear the conversation and start a fresh context window",
                    params_type=ClearArgs,
                    is_terminal=True,
                    defer="never",
                    handler=clear_context,
                )
            ],
        )
        session.on("session.context_cleared", lambda e: print(f"[event] {e.type}: {e.data}"))
        reply = await session.send_and_wait(
            'Call clear_context with prompt "Reply with exactly FRESH_CONTEXT." now.'
        )
        print("reply:", reply.data.content if reply else None)
        second = model.requests[1].messages
        print("the model's second request:", [(m.role, m.content) for m in second])


if __name__ == "__main__":
    asyncio.run(main())
