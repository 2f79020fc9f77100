"""`ask_user`: the Copilot CLI's question to the user, answered by whoever the host names
(on `trimtab serve`, the client, through `userInput.request`; spec B9)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field

from trimtab.builtin._base import BuiltinTool, builtin

__all__ = ["AskUser", "ask_user_tool"]

AskUser = Callable[[str, list[str], bool], Awaitable[tuple[str, bool]]]
"""`ask(question, choices, allow_freeform)`: the answer, and whether it was typed freely
(rather than chosen among `choices`)."""


class AskParams(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    question: str = Field(description="The question to ask the user.")
    choices: list[str] | None = Field(
        default=None, description="Answers the user may choose among."
    )
    allow_freeform: bool = Field(
        default=True, description="Whether the user may answer something else than a choice."
    )


def ask_user_tool(ask: AskUser) -> BuiltinTool:
    """The `ask_user` tool; its results read as the CLI's: `User selected: <choice>`, or
    `User responded: <text>` for a free answer. It asks no permission: it asks the user."""

    async def ask_user(params: AskParams) -> str:
        answer, freeform = await ask(params.question, params.choices or [], params.allow_freeform)
        return f"User responded: {answer}" if freeform else f"User selected: {answer}"

    return builtin(
        "ask_user",
        "Ask the user a question, with answers to choose among if you have them, and wait "
        "for the answer.",
        AskParams,
        ask_user,
    )
