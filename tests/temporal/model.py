"""`ConversationModel`: a Chat Completions server on 127.0.0.1 for the engine's crash tests,
whose answers a test can hold (a model call in flight for as long as the test needs).

It answers by the conversation's last message: a user message `clear ...` calls the `clear`
tool, `block ...`, `stall ...` and `ask ...` the tool of that name (see `tests.temporal.tools`),
any other `re: <it>`; after a tool's result, `done`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from tests.fake_model import FakeModel

__all__ = ["ConversationModel"]

_CALLS = {"clear": "clear", "block": "block", "stall": "stall", "ask": "ask"}


class ConversationModel(FakeModel):
    """See the module."""

    def __init__(self) -> None:
        super().__init__()
        self._held: Callable[[str], bool] | None = None
        self._released = asyncio.Event()
        self._arrival = asyncio.Condition()
        self._call_ids = itertools.count(1)

    def hold(self, when: Callable[[str], bool] = lambda last: True) -> None:
        """Hold the answers to requests whose last message's text `when` accepts, from now
        on until `release`."""
        self._held = when
        self._released.clear()

    def release(self) -> None:
        self._held = None
        self._released.set()

    async def wait_requests(self, count: int, timeout: float = 20.0) -> None:
        """Return once `count` requests arrived in all."""
        async with asyncio.timeout(timeout), self._arrival:
            await self._arrival.wait_for(lambda: len(self.requests) >= count)

    async def arrived(self, body: dict[str, Any]) -> None:
        async with self._arrival:
            self._arrival.notify_all()
        held = self._held
        if held is not None and held(_last_text(body.get("messages") or [])):
            await self._released.wait()

    def _message(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        last = messages[-1] if messages else {}
        text = _last_text(messages)
        if last.get("role") == "user" and (tool := _CALLS.get(text.split(" ", 1)[0])):
            call = {
                "id": f"call_{next(self._call_ids)}",
                "type": "function",
                "function": {"name": tool, "arguments": "{}"},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        if last.get("role") == "tool":
            return {"role": "assistant", "content": "done"}
        return {"role": "assistant", "content": f"re: {text}"}


def _last_text(messages: list[dict[str, Any]]) -> str:
    content = messages[-1].get("content") if messages else None
    return content if isinstance(content, str) else ""
