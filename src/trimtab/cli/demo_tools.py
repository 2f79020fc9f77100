"""Built-in demo tools (`--tools demo`): enough to try tools, permissions and a terminal
`clear_context` from the command line without writing any code."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from trimtab import ClearContextError, Tool, ToolError, ToolInvocation, define_tool

__all__ = ["CLEAR_CONTEXT", "DEMO_TOOL_NAMES", "demo_tools", "evaluate"]

CLEAR_CONTEXT = "clear_context"

DEMO_TOOL_NAMES = frozenset({"calculator", "current_time", CLEAR_CONTEXT})

_MAX_EXPONENT = 1000
_MAX_BITS = 14_000
"""About 4,300 digits, Python's own limit on int -> str: bigger results are refused, and
checked before a power is computed, so that no expression can keep the process busy."""

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


class CalculatorArgs(BaseModel):
    """Arguments of `calculator`."""

    expression: str = Field(
        description="Arithmetic with + - * / // % ** and parentheses, such as (2 + 3) * 4.5",
        # The shape in the schema too: a model whose output a grammar keeps to it (the
        # embedded one) can write nothing else, and no more of it than this.
        pattern=r"^[0-9.+*/%() -]{1,200}$",
    )


class CurrentTimeArgs(BaseModel):
    """Arguments of `current_time`."""

    timezone: str | None = Field(
        default=None,
        description="An IANA time zone such as Europe/Paris; default: this computer's zone",
        pattern=r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$",  # Area/Location
    )


class ClearContextArgs(BaseModel):
    """Arguments of `clear_context`."""

    prompt: str = Field(
        description="The first message of the fresh context: the task to continue with, "
        "including everything it needs from the current conversation"
    )


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, without `eval`: only numbers and operators.

    Raises:
        ToolError: The expression is not plain arithmetic, divides by zero, or is too large.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None
    try:
        return _value(tree.body)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except (OverflowError, ValueError):
        raise ToolError("the result is too large") from None


def _value(node: ast.expr) -> int | float:
    match node:
        case ast.Constant(value=bool()):
            raise ToolError("booleans are not numbers here")
        case ast.Constant(value=int() | float() as number):
            return number
        case ast.UnaryOp(op=op, operand=operand) if type(op) in _UNARY:
            return _UNARY[type(op)](_value(operand))
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY:
            a, b = _value(left), _value(right)
            if isinstance(op, ast.Pow):
                _check_power(a, b)
            result: object = _BINARY[type(op)](a, b)
            if isinstance(result, complex):
                raise ToolError("the result is not a real number")
            if isinstance(result, int) and result.bit_length() > _MAX_BITS:
                raise OverflowError
            assert isinstance(result, int | float)
            return result
    raise ToolError(f"unsupported in arithmetic: {ast.unparse(node)!r}")


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > _MAX_EXPONENT:
        raise ToolError(f"exponents are limited to {_MAX_EXPONENT}")
    if isinstance(base, int) and abs(base) > 1 and base.bit_length() * exponent > _MAX_BITS:
        raise OverflowError


def calculator(params: CalculatorArgs) -> str:
    """Evaluate an arithmetic expression."""
    value = evaluate(params.expression)
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is too large (or not a number)")
    return format(value, ".15g") if isinstance(value, float) else str(value)


def current_time(params: CurrentTimeArgs) -> str:
    """The current date and time."""
    now = datetime.now(UTC)
    if params.timezone:
        try:
            local = now.astimezone(ZoneInfo(params.timezone))
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolError(f"unknown time zone {params.timezone!r}") from None
    else:
        local = now.astimezone()
    return f"{local.isoformat(timespec='seconds')} ({local:%A}, {local.tzname()})"


async def clear_context(params: ClearContextArgs, invocation: ToolInvocation) -> str:
    """Clear the conversation and continue in a fresh context window with `prompt`."""
    try:
        result = await invocation.session.history.clear_context(params.prompt)
    except ClearContextError as exc:
        # The model can act on the reason (an empty prompt, a clear already pending).
        raise ToolError(str(exc)) from None
    return f"Cleared {result.messages_cleared} messages."


def demo_tools() -> list[Tool]:
    """The demo tools; each asks for permission, so they also show the permission flow."""
    return [
        define_tool(
            "calculator",
            description="Evaluate an arithmetic expression exactly",
            params_type=CalculatorArgs,
            handler=calculator,
        ),
        define_tool(
            "current_time",
            description="Get the current date and time, optionally in a given time zone",
            params_type=CurrentTimeArgs,
            handler=current_time,
        ),
        define_tool(
            CLEAR_CONTEXT,
            description="Clear the conversation and start a fresh context window that begins "
            "with `prompt`; use it when told to, or to drop a long finished task",
            params_type=ClearContextArgs,
            is_terminal=True,
            defer="never",
            handler=clear_context,
        ),
    ]
