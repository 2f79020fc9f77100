"""`ScriptedModel`: an in-process provider that answers from a script."""

from __future__ import annotations

import inspect
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeAlias

from trimtab._errors import ProviderError
from trimtab._window import estimate_tokens
from trimtab.providers import ModelRequest, ModelResponse, ProviderEvent, TextDelta, ToolCall, Usage

__all__ = ["ScriptStep", "ScriptedModel", "tool_call"]


def tool_call(
    name: str, arguments: dict[str, Any] | str | None = None, *, id: str | None = None
) -> ToolCall:
    """A tool call for a script; a `str` `arguments` is sent verbatim (even if invalid JSON)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCall(id=id or "", name=name, arguments=text)


ScriptStep: TypeAlias = (
    str
    | ToolCall
    | Sequence[ToolCall]
    | ModelResponse
    | ProviderError
    | Callable[[ModelRequest], "ScriptStep | Awaitable[ScriptStep]"]
)
"""One answer: reply text, one or several tool calls, a full response, an error to raise, or a
function of the request that returns (or awaits) one of those."""


class ScriptedModel:
    """A provider that replies from a script and records every request it received.

    ```python
    model = ScriptedModel([tool_call("clear_context", {"prompt": "Say hi"}), "hi"])
    session = await client.create_session(provider=model, ...)
    ...
    model.assert_done()          # fails if the script has steps left
    model.requests[1].messages   # what the model saw on its second call
    ```

    A request arriving after the script is exhausted fails the run with a `session.error`
    of type `script_exhausted`. Closing the client checks for leftover steps too.
    """

    name = "scripted"

    def __init__(
        self,
        steps: Iterable[ScriptStep] = (),
        *,
        then: Callable[[ModelRequest], ScriptStep] | None = None,
        chunk_size: int = 8,
        native_output: bool = False,
    ) -> None:
        self.native_output = native_output
        """Whether it stands for a provider with native structured output (spec OUT6): its
        requests then carry `output_schema`, and its replies are the results."""
        self._steps: deque[ScriptStep] = deque(steps)
        self._then = then
        """Answers every request once the steps are used up (for long, generated sessions)."""
        self._chunk_size = chunk_size
        self._calls = 0
        self.requests: list[ModelRequest] = []
        """Every request received, in order."""

    @property
    def remaining(self) -> int:
        """Steps not consumed yet."""
        return len(self._steps)

    def add(self, *steps: ScriptStep) -> None:
        """Append steps to the script."""
        self._steps.extend(steps)

    def assert_done(self) -> None:
        """Fail (AssertionError) if script steps are left over."""
        if self._steps:
            raise AssertionError(
                f"ScriptedModel: {len(self._steps)} script step(s) were never used"
            )

    async def aclose(self) -> None:
        self.assert_done()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        self.requests.append(request)
        if not self._steps and self._then is not None:
            self._steps.append(self._then)
        if not self._steps:
            raise ProviderError(
                "script_exhausted",
                f"ScriptedModel got request #{len(self.requests)} but its script is used up",
            )
        response = await self._resolve(self._steps.popleft(), request)
        if request.stream:
            text = response.content
            for start in range(0, len(text), self._chunk_size):
                yield TextDelta(text=text[start : start + self._chunk_size])
        yield response

    async def _resolve(self, step: ScriptStep, request: ModelRequest) -> ModelResponse:
        while callable(step) and not isinstance(step, ToolCall | ModelResponse | ProviderError):
            produced = step(request)
            step = await produced if inspect.isawaitable(produced) else produced
        match step:
            case ProviderError():
                raise step
            case ModelResponse():
                return step
            case str():
                return ModelResponse(
                    content=step, usage=self._usage(request, step), finish_reason="stop"
                )
            case ToolCall():
                calls: Sequence[ToolCall] = (step,)
            case _:
                calls = step
        numbered = tuple(c if c.id else c.model_copy(update={"id": self._next_id()}) for c in calls)
        return ModelResponse(
            tool_calls=numbered, usage=self._usage(request, ""), finish_reason="tool_calls"
        )

    def _next_id(self) -> str:
        self._calls += 1
        return f"call_{self._calls}"

    @staticmethod
    def _usage(request: ModelRequest, reply: str) -> Usage:
        # The request counted as the window's estimate counts it (the messages and the tools'
        # schemas), so that a session on this model calibrates to 1 (spec X1): what the tests
        # of the window's size set up is what the session measures.
        tools = sum(len(t.model_dump_json()) for t in request.tools) // 4
        prompt = estimate_tokens(request.messages) + tools
        return Usage(input_tokens=prompt, output_tokens=len(reply) // 4 + 1)
