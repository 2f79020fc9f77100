"""Typed results: the tool a run gives its result with, and the check of a result (spec
OUT1-OUT8).

A run that must end with a typed result is offered one more tool for that run,
`final_result`, whose parameters are the result's JSON Schema: its success ends the run (T1)
and records the checked value; a result that does not check goes back to the model as
`invalid_arguments` (section 1). With native structured output the model's reply is the
result, checked the same way.

A result is checked against its Python type where this process has it (a `TypeAdapter`),
else against its JSON Schema (`jsonschema`): a run continued by another process, a schema
given on the wire or on the command line.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from trimtab._errors import SessionError
from trimtab._tools import CallOutcome, Tool, ToolInvocation, valid_text
from trimtab.events import OutputResult, OutputSpec, ToolDefinition

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

__all__ = [
    "DEFAULT_MAX_INVALID",
    "OUTPUT_TOOL",
    "Output",
    "checked_schema",
    "output_of",
    "typed_output",
    "value_of",
]

OUTPUT_TOOL = "final_result"
"""The output tool's name, unless the session has a tool of that name (then `final_result_2`,
...)."""

DEFAULT_MAX_INVALID = 3
"""Invalid results a run may see: the third ends it in `invalid_output`."""

_MAX_ERRORS = 20
"""Validation errors the model is told at once (it fixes a few at a time anyway)."""

_ACCEPTED = "The result was accepted."
_DESCRIPTION = (
    "Give the final result of the task. Call this once the task is done, with the result as"
    " its arguments: the run ends when the result is valid."
)

Check = Callable[[Any], Any]
"""A result as the model gave it (unwrapped) to its JSON data; raises `_Invalid`."""


class _Invalid(Exception):
    """A result that does not check: its lines say why, one per field."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass(eq=False, slots=True)
class Output:
    """What a run's typed result is, and how it is checked."""

    spec: OutputSpec
    check: Check
    _tool: OutputTool | None = None

    @property
    def tool(self) -> OutputTool:
        """The terminal tool the model gives the result with (tool mode)."""
        if self._tool is None:  # made once: each turn of the run builds its context
            self._tool = OutputTool(self)
        return self._tool

    def result(self, value: Any) -> OutputResult:
        """The result the model gave (the tool's arguments, or the reply as JSON), checked.

        Raises:
            _Invalid: It does not check; its lines name the fields as the model wrote them.
        """
        if not self.spec.wrapped:
            return OutputResult(value=self.check(value))
        if not isinstance(value, dict) or "result" not in value:
            raise _Invalid(["result: Field required"])
        try:
            return OutputResult(value=self.check(value["result"]))
        except _Invalid as exc:
            lines = [f"result.{line}".replace("result.(root)", "result") for line in exc.lines]
            raise _Invalid(lines) from None

    def reply(self, text: str) -> OutputResult | str:
        """The result a reply's text is (native mode, OUT6), or why it is none."""
        try:
            value = json.loads(_unfenced(text))
        except (ValueError, RecursionError):
            return "(root): the reply is not JSON"
        try:
            return self.result(value)
        except _Invalid as exc:
            return str(exc)


class OutputTool(Tool):
    """`final_result`: its arguments are the result; a successful call records it (OUT4)."""

    __slots__ = ("output",)

    def __init__(self, output: Output) -> None:
        spec = output.spec
        definition = ToolDefinition(
            name=spec.tool_name,
            description=_DESCRIPTION,
            parameters=spec.json_schema,
            is_terminal=True,
            defer="never",
            skip_permission=True,
        )
        super().__init__(definition, _unused, None)
        self.output = output

    def validate(self, arguments: Any) -> Any:
        """The result, checked, or an `invalid_arguments` outcome naming each field."""
        if not isinstance(arguments, dict):
            return super().validate(arguments)  # (its text for arguments that are no object)
        try:
            return self.output.result(arguments)
        except _Invalid as exc:
            return CallOutcome("invalid_arguments", valid_text(f"Invalid tool arguments:\n{exc}"))

    async def run(self, params: Any, invocation: ToolInvocation) -> CallOutcome:
        assert isinstance(params, OutputResult)
        return CallOutcome("success", _ACCEPTED, output=params)


def _unused(params: Any) -> None:  # pragma: no cover (OutputTool.run answers)
    raise AssertionError("the output tool's calls are answered by OutputTool.run")


def typed_output(
    output_type: Any, *, taken: Collection[str], max_invalid: int, native: bool
) -> Output:
    """The output of a run whose result is `output_type` (a Pydantic model, a dataclass, a
    TypedDict or a simple type such as `int` or `list[str]`).

    Raises:
        TypeError: Pydantic cannot make a schema of `output_type`.
    """
    if max_invalid < 1:
        raise ValueError("max_invalid_outputs must be at least 1")
    key = (output_type, _free_name(taken), max_invalid, native)
    try:
        return _typed(*key)
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return _typed.__wrapped__(*key)  # (a type no cache can key: made each time)


@functools.lru_cache(maxsize=64)
def _typed(output_type: Any, name: str, max_invalid: int, native: bool) -> Output:
    # Made once per type and settings: a schema takes a millisecond to generate, a run's
    # whole overhead.
    try:
        adapter = TypeAdapter(output_type)
        schema = adapter.json_schema()
    except Exception as exc:  # PydanticSchemaGenerationError, PydanticInvalidForJsonSchema
        raise TypeError(f"output_type {output_type!r} has no JSON Schema: {exc}") from None
    spec = _spec(schema, name, max_invalid, native)
    return Output(spec, functools.partial(_check_typed, adapter))


def output_of(spec: OutputSpec) -> Output:
    """The output a run's logged spec describes, checked by its JSON Schema (the run goes on
    here without its Python type: a resume, a takeover, a schema from the wire)."""
    validator = _validator(json.dumps(_inner(spec), sort_keys=True))
    return Output(spec, functools.partial(_check_schema, validator))


def checked_schema(
    schema: Mapping[str, Any], *, taken: Collection[str], max_invalid: int, native: bool
) -> Output:
    """The output of a run whose result is given by a JSON Schema (`output_schema=`).

    Raises:
        ValueError: `schema` is not a valid JSON Schema.
    """
    from jsonschema import validators
    from jsonschema.exceptions import SchemaError

    if max_invalid < 1:
        raise ValueError("max_invalid_outputs must be at least 1")
    given = dict(schema)
    try:
        validators.validator_for(given).check_schema(given)
    except SchemaError as exc:
        raise ValueError(f"output_schema is not a valid JSON Schema: {exc.message}") from None
    return output_of(_spec(given, _free_name(taken), max_invalid, native))


def value_of(output_type: Any, result: OutputResult) -> Any:
    """A run's result (JSON data) as `output_type`, for its caller.

    Raises:
        SessionError: `invalid_output`, when the value does not validate as `output_type`
            (it was checked against the schema only, where the run went on elsewhere).
    """
    try:
        return _adapter(output_type).validate_python(result.value)
    except ValidationError as exc:
        lines = "; ".join(_lines(exc)[:3])
        raise SessionError("invalid_output", f"the run's result is not valid: {lines}") from None


def _spec(schema: dict[str, Any], tool_name: str, max_invalid: int, native: bool) -> OutputSpec:
    """The logged spec of a result whose JSON Schema is `schema`: the tool's parameters must
    be an object, so another result is wrapped in `{"result": ...}` (OUT1)."""
    wrapped = schema.get("type") != "object"
    if wrapped:
        inner = {k: v for k, v in schema.items() if k != "$defs"}
        schema = {
            "type": "object",
            "properties": {"result": inner},
            "required": ["result"],
            **({"$defs": schema["$defs"]} if "$defs" in schema else {}),
        }
    return OutputSpec(
        tool_name=tool_name,
        json_schema=schema,
        wrapped=wrapped,
        max_invalid=max_invalid,
        native=native,
    )


def _inner(spec: OutputSpec) -> dict[str, Any]:
    """The result's own schema (inside the wrapper), with the definitions it refers to."""
    schema = spec.json_schema
    if not spec.wrapped:
        return schema
    inner = dict(schema["properties"]["result"])
    if "$defs" in schema:
        inner["$defs"] = schema["$defs"]
    return inner


def _free_name(taken: Collection[str]) -> str:
    """`final_result`, or the first `final_result_N` the session's tools leave free."""
    name, number = OUTPUT_TOOL, 1
    while name in taken:
        number += 1
        name = f"{OUTPUT_TOOL}_{number}"
    return name


def _adapter(output_type: Any) -> TypeAdapter[Any]:
    """The adapter of `output_type`: made once per type (a schema takes a while to build)."""
    try:
        return _cached_adapter(output_type)
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return TypeAdapter(output_type)  # (a type no cache can key: made each time)


@functools.lru_cache(maxsize=64)
def _cached_adapter(output_type: Any) -> TypeAdapter[Any]:
    return TypeAdapter(output_type)


def _check_typed(adapter: TypeAdapter[Any], value: Any) -> Any:
    try:
        validated = adapter.validate_python(value)
    except ValidationError as exc:
        raise _Invalid(_lines(exc)) from None
    except Exception:
        # A validator that raised something pydantic does not wrap: the value is what is
        # wrong, and the validator's text is the host's business (as for a tool's, O1).
        raise _Invalid(["(root): the result was refused"]) from None
    return adapter.dump_python(validated, mode="json")


@functools.lru_cache(maxsize=64)
def _validator(schema: str) -> Validator:
    from jsonschema import validators

    loaded = json.loads(schema)
    return validators.validator_for(loaded)(loaded)


def _check_schema(validator: Validator, value: Any) -> Any:
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        raise _Invalid(
            [
                f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
                for error in errors[:_MAX_ERRORS]
            ]
        )
    return value


def _lines(exc: ValidationError) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in error['loc']) or '(root)'}: {error['msg']}"
        for error in exc.errors()[:_MAX_ERRORS]
    ]


_FENCE = re.compile(r"\A\s*```[A-Za-z]*\n(.*)\n```\s*\Z", re.S)


def _unfenced(text: str) -> str:
    """A reply's JSON without the Markdown fence some models put around it."""
    fenced = _FENCE.match(text)
    return fenced.group(1) if fenced else text
