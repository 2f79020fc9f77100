"""The hidden `scripted` provider: a `ScriptedModel` whose replies come from a file.

It lets the command line be tried and tested without a model or a network. The file (JSON,
or YAML when PyYAML is installed) holds a list of steps, one per model call:

```yaml
- tool_call: {name: calculator, arguments: {expression: "6*7"}}
- "It is 42."                                  # a plain reply
- {reply: "Slow answer", delay: 2}             # answered after 2 seconds
- tool_calls: [{name: current_time}, {name: calculator, arguments: {expression: "1+1"}}]
- error: {type: rate_limit, message: "slow down", status_code: 429}
```
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, TypeAlias, assert_never

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from trimtab import ProviderError
from trimtab._errors import ProviderErrorType
from trimtab.cli.errors import EXIT_USAGE, CliError, read_input
from trimtab.providers import ModelRequest
from trimtab.testing import ScriptedModel, ScriptStep, tool_call

__all__ = ["CliScriptedModel", "load_script"]


class _Strict(BaseModel):
    # A script is written by hand: a misspelt key must fail, not be ignored.
    model_config = ConfigDict(extra="forbid")


class _Call(_Strict):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class _Reply(_Strict):
    reply: str
    delay: float = Field(default=0.0, ge=0)
    """Seconds to wait before answering: a slow model, for progress and Ctrl-C."""


class _ToolCall(_Strict):
    tool_call: _Call


class _ToolCalls(_Strict):
    tool_calls: list[_Call] = Field(min_length=1)


class _Error(_Strict):
    type: ProviderErrorType
    message: str = "scripted provider error"
    status_code: int | None = None
    retryable: bool = False


class _Failure(_Strict):
    error: _Error


_Step: TypeAlias = str | _Reply | _ToolCall | _ToolCalls | _Failure
_STEPS = TypeAdapter(list[_Step])


class CliScriptedModel(ScriptedModel):
    """A `ScriptedModel` that leaves unused steps to the caller to report.

    `ScriptedModel.aclose` raises on leftovers, which suits a test; a person who leaves a chat
    early gets a note instead (see `remaining`).
    """

    async def aclose(self) -> None:
        """Nothing to release."""


def load_script(path: Path) -> CliScriptedModel:
    """Read a script file into a provider.

    Raises:
        CliError: The file is missing, is not JSON/YAML, or holds an invalid step.
    """
    try:
        with path.open("rb") as file:
            text = read_input(file, f"script {path}")
        data = _parse(text, path)
        steps = _STEPS.validate_python(data)
    except OSError as exc:
        raise _bad(path, exc.strerror or str(exc)) from None
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise _bad(path, f"step {where}: {error['msg']}") from None
    except ValueError as exc:
        raise _bad(path, str(exc).splitlines()[0]) from None
    return CliScriptedModel([_to_step(step) for step in steps])


def _parse(text: str, path: Path) -> Any:
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError("reading YAML needs PyYAML (pip install pyyaml)") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"not valid YAML: {exc}") from None
    return json.loads(text)


def _bad(path: Path, reason: str) -> CliError:
    return CliError(
        f"cannot use script {path}: {reason}",
        hint="a script is a JSON or YAML list of replies, tool calls and errors",
        exit_code=EXIT_USAGE,
    )


def _to_step(step: _Step) -> ScriptStep:
    match step:
        case str():
            return step
        case _Reply(delay=0):
            return step.reply
        case _Reply():
            return _delayed(step.reply, step.delay)
        case _ToolCall():
            return tool_call(step.tool_call.name, step.tool_call.arguments)
        case _ToolCalls():
            return [tool_call(call.name, call.arguments) for call in step.tool_calls]
        case _Failure():
            error = step.error
            return ProviderError(
                error.type,
                error.message,
                status_code=error.status_code,
                retryable=error.retryable,
            )
        case _:
            assert_never(step)


def _delayed(reply: str, delay: float) -> ScriptStep:
    async def answer(request: ModelRequest) -> ScriptStep:
        await asyncio.sleep(delay)
        return reply

    return answer
