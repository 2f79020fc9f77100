"""What every built-in tool adds to a `Tool`: its permission request in the Copilot CLI's
shape (spec B7), and paths outside the directory refused before anyone is asked (B2)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from trimtab._tools import CallOutcome, Tool, ToolHandler
from trimtab.builtin._directory import Outside
from trimtab.events import PermissionRequestData, ToolDefinition

__all__ = ["Asks", "BuiltinTool", "Checks", "builtin"]

Asks = Callable[[Any], dict[str, Any]]
"""The permission request's fields for a call's validated parameters (`kind` among them)."""
Checks = Callable[[Any], object]
"""Raises `Outside` when a call's parameters name a path outside the directory."""


class BuiltinTool(Tool):
    """A built-in tool: a `Tool` that says what its permission request holds."""

    __slots__ = ("_asks", "_checks")

    def __init__(
        self,
        definition: ToolDefinition,
        handler: ToolHandler,
        params_type: type[BaseModel],
        asks: Asks | None,
        checks: Checks | None,
    ) -> None:
        super().__init__(definition, handler, params_type)
        self._asks = asks
        self._checks = checks

    def validate(self, arguments: Any) -> BaseModel | dict[str, Any] | CallOutcome:
        """The parameters, or why the call may not be made: invalid arguments, or a path
        outside the directory (`denied`, before any permission request)."""
        params = super().validate(arguments)
        if isinstance(params, CallOutcome) or self._checks is None:
            return params
        try:
            self._checks(params)
        except Outside as refused:
            return CallOutcome("denied", str(refused))
        return params

    def permission_request(
        self, arguments: Any, tool_call_id: str, request_id: str
    ) -> PermissionRequestData:
        """The request in the CLI's shape: `read` with the path, `write` with the file and a
        diff, `shell` with the command line."""
        params = super().validate(arguments)
        fields = {} if self._asks is None or isinstance(params, CallOutcome) else self._asks(params)
        return PermissionRequestData(
            tool_name=self.name,
            tool_description=self.definition.description,
            args=arguments,
            tool_call_id=tool_call_id,
            request_id=request_id,
            **fields,
        )


def builtin(
    name: str,
    description: str,
    params_type: type[BaseModel],
    handler: ToolHandler,
    *,
    asks: Asks | None = None,
    checks: Checks | None = None,
) -> BuiltinTool:
    """A built-in tool; one that `asks` nothing is never asked about (`report_intent`)."""
    schema = params_type.model_json_schema(by_alias=True)
    definition = ToolDefinition(
        name=name,
        description=description,
        parameters=schema,
        skip_permission=asks is None,
    )
    return BuiltinTool(definition, handler, params_type, asks, checks)
