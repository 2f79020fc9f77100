"""Tools: definition from Pydantic models or typed functions, validation, execution.

`define_tool` builds a `Tool`; `Tool.run` validates the model's arguments, calls the handler
under the tool's timeout and maps whatever happened to exactly one outcome of spec section 1.
Permission and abort handling live in the loop, which owns the call's lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, overload

import pydantic_core
from pydantic import BaseModel, ConfigDict, ValidationError

from trimtab._durations import check_seconds
from trimtab._errors import ToolError, contained
from trimtab._results import ClearContextResult, CompactResult, TruncateResult
from trimtab.events import Event, OutputResult, PermissionRequestData, ToolDefinition, ToolOutcome

__all__ = [
    "MAX_ARGUMENT_DEPTH",
    "MAX_TOOL_NAME",
    "TOOL_NAME",
    "CallOutcome",
    "ExternalTool",
    "HistoryHandle",
    "RpcHandle",
    "SessionHandle",
    "Tool",
    "ToolHandler",
    "ToolInvocation",
    "ToolResult",
    "ToolSource",
    "define_tool",
    "failed_call",
    "parse_arguments",
    "valid_text",
]

ToolHandler = Callable[..., Any]
"""`handler(params)` or `handler(params, invocation)`, sync or async."""


class HistoryHandle(Protocol):
    """The context operations a handler may reach (`session.history`, spec C1-C11, §6)."""

    def clear_context(self, prompt: str) -> ClearContextResult: ...
    async def compact(self, custom_instructions: str | None = None) -> CompactResult: ...
    async def truncate(self, event_id: str) -> TruncateResult: ...
    async def fork(self, event_id: str | None = None) -> SessionHandle: ...
    async def summarize_for_handoff(self) -> str: ...


class RpcHandle(Protocol):
    @property
    def history(self) -> HistoryHandle: ...


class SessionHandle(Protocol):
    """What a tool handler may do with the session that called it: its id, its history
    (`clear_context`), its log and events, sending, and letting go of it (spec C11).
    `Session` is one; the loop below it never needs more."""

    @property
    def session_id(self) -> str: ...
    @property
    def history(self) -> HistoryHandle: ...
    async def log(self, message: str, *, level: Literal["info", "warning", "error"] = ...) -> Event:
        """A note in the session's timeline (spec K4)."""
        ...

    def on(self, handler: Callable[[Event], object], /) -> Callable[[], None]: ...
    async def send(self, prompt: str) -> str: ...
    async def get_events(self, *, after: int = 0) -> list[Event]: ...
    async def disconnect(self) -> None: ...
    async def shutdown(
        self, kind: Literal["routine", "error"] = ..., reason: str | None = ...
    ) -> None: ...
    @property
    def rpc(self) -> RpcHandle:
        """`history` in the Copilot SDK's spelling (`session.rpc.history`)."""
        ...


@dataclass(frozen=True, slots=True)
class ToolInvocation:
    """What a handler knows about the call it serves."""

    session_id: str
    tool_call_id: str
    tool_name: str
    arguments: Any
    """The arguments as the model sent them (parsed JSON)."""
    session: SessionHandle = field(repr=False)
    """The calling session, so a handler can use `invocation.session.history.clear_context`."""
    request_id: str | None = None
    """For an `ExternalTool`: the id of the `external_tool.requested` that announced the
    call, which the client's answer names."""


class ToolResult(BaseModel):
    """A handler's explicit result, when plain text is not enough (Copilot's result shape)."""

    model_config = ConfigDict(defer_build=True)

    text_result_for_llm: str
    result_type: Literal["success", "failure", "rejected", "denied", "timeout"] = "success"
    """`timeout`: the handler enforced a time limit of its own (a shell command's)."""
    error: str | None = None
    """Detail for logs and hosts; never shown to the model."""
    tool_references: list[str] = []
    """Deferred tools this result makes callable (what a `tool_search` tool returns)."""


class CallOutcome(NamedTuple):
    outcome: ToolOutcome
    text: str
    """What the model sees."""
    references: tuple[str, ...] = ()
    """Deferred tools a successful call made callable."""
    output: OutputResult | None = None
    """The run's typed result, which a successful call of its output tool gave (OUT4)."""


class Tool:
    """A tool the model may call: its definition plus the handler that serves it."""

    __slots__ = ("definition", "handler", "params_type", "_pass_invocation")

    def __init__(
        self,
        definition: ToolDefinition,
        handler: ToolHandler,
        params_type: type[BaseModel] | None,
    ) -> None:
        self.definition = definition
        self.handler = handler
        self.params_type = params_type
        self._pass_invocation = _positional_arity(handler) >= 2

    @property
    def name(self) -> str:
        return self.definition.name

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, is_terminal={self.definition.is_terminal})"

    def permission_request(
        self, arguments: Any, tool_call_id: str, request_id: str
    ) -> PermissionRequestData:
        """What the permission handler is asked about a call of this tool."""
        return PermissionRequestData(
            tool_name=self.name,
            tool_description=self.definition.description,
            args=arguments,
            tool_call_id=tool_call_id,
            request_id=request_id,
        )

    def validate(self, arguments: Any) -> BaseModel | dict[str, Any] | CallOutcome:
        """The handler's first argument, or an `invalid_arguments` outcome."""
        if not isinstance(arguments, dict):
            return CallOutcome(
                "invalid_arguments",
                f"Invalid tool arguments: expected a JSON object, got {_short(arguments)}",
            )
        if self.params_type is None:
            return arguments
        try:
            return self.params_type.model_validate(arguments)
        except ValidationError as exc:
            lines = [
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
                for err in exc.errors()
            ]
            text = valid_text("Invalid tool arguments:\n" + "\n".join(lines))
            return CallOutcome("invalid_arguments", text)
        except BaseException as exc:
            if not contained(exc):
                raise
            # A validator that raised something pydantic does not wrap (TypeError, ...): the
            # arguments are still what is wrong, and its text is the tool's internal business.
            return CallOutcome(
                "invalid_arguments", "Invalid tool arguments: (root): the arguments were refused"
            )

    async def run(
        self, params: BaseModel | dict[str, Any], invocation: ToolInvocation
    ) -> CallOutcome:
        """Call the handler under the tool's timeout; raises only what `contained` passes on
        (an abort's `CancelledError`, Ctrl-C): anything else the handler does is its outcome.

        An async handler runs on the event loop; a sync one runs in a thread of its own, so
        that it blocks neither the loop (other sessions, the server) nor its own timeout and
        abort. Python cannot stop a thread: a sync handler past its timeout runs on, and what
        it returns then is discarded; the thread is a daemon, so that it holds neither
        `asyncio.run`'s end nor the program's exit.
        """
        limit = self.definition.timeout
        try:
            async with asyncio.timeout(limit) as deadline:
                if inspect.iscoroutinefunction(self.handler):
                    value = await self._call(params, invocation)
                else:
                    value = await _in_thread(functools.partial(self._call, params, invocation))
                if inspect.isawaitable(value):  # a sync callable that returned an awaitable
                    value = await value
        except TimeoutError:
            if not deadline.expired():
                # The handler raised TimeoutError itself: its own failure, not our limit.
                return failed_call(self.name)
            return CallOutcome("timeout", f"Tool '{self.name}' timed out after {limit:g} s.")
        except ToolError as exc:
            return CallOutcome("failure", valid_text(str(exc)))
        except BaseException as exc:
            if not contained(exc):
                raise  # an abort (the call is `cancelled`), the runtime closing, Ctrl-C
            # Its text may hold paths or secrets: the model only learns that it failed.
            return failed_call(self.name)
        try:
            outcome = _to_outcome(value)
        except BaseException as exc:
            if not contained(exc):
                raise
            # An object JSON cannot hold, bytes that are not UTF-8, a structure too deep.
            return CallOutcome(
                "failure", f"Failed to execute '{self.name}': its result could not be serialised."
            )
        return outcome._replace(text=valid_text(outcome.text))

    def _call(self, params: BaseModel | dict[str, Any], invocation: ToolInvocation) -> Any:
        if self._pass_invocation:
            return self.handler(params, invocation)
        return self.handler(params)


async def _in_thread(call: Callable[[], Any]) -> Any:
    """`call()` in a daemon thread of its own, in this context (a tool's spans nest under its
    call's); what it returns, or raises, once it has.

    Not `asyncio.to_thread`: the default executor's threads are joined when `asyncio.run` ends
    and when the interpreter exits, so one handler that never returns (a timed-out or aborted
    call's) would keep the program from ever exiting.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():
            return  # given up on (a timeout, an abort): what it returned is discarded
        if error is None:
            done.set_result(value)
        else:
            done.set_exception(error)

    def work() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = context.run(call)
        except (StopIteration, GeneratorExit) as exc:
            # Neither survives the trip: a future cannot hold StopIteration, and GeneratorExit
            # thrown into the awaiting task closes its coroutines instead of reaching `run`.
            error = RuntimeError(f"the tool's handler raised {type(exc).__name__}")
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name="trimtab-tool", daemon=True).start()
    return await done


class ToolSource(Protocol):
    """Tools a session gets from outside its own list (its MCP servers), which may change
    between turns."""

    async def refresh(self) -> tuple[Mapping[str, Tool] | None, Sequence[str]]:
        """The source's tools when they changed since the last call (else None), and
        warnings for the log (a server that could not start)."""
        ...

    @property
    def options(self) -> Mapping[str, Any]:
        """The source's configuration as given (what a fork of the session is given)."""
        ...

    async def close(self) -> None:
        """The session is done with the source."""
        ...


class ExternalTool(Tool):
    """A tool whose calls a client runs (the Copilot protocol's external tools).

    The loop announces each call with `external_tool.requested` (its `request_id` is the
    invocation's) and settles it with `external_tool.completed`, also when the call is
    aborted; the handler waits for the client's answer. A call while `provided()` is false
    (no client that runs the tool is attached) fails at once.
    """

    __slots__ = ("provided",)

    def __init__(
        self,
        definition: ToolDefinition,
        handler: ToolHandler,
        provided: Callable[[], bool] = lambda: True,
    ) -> None:
        super().__init__(definition, handler, None)
        self.provided = provided


MAX_TOOL_NAME = 64
"""OpenAI's limit on a tool name, the strictest of the providers."""
TOOL_NAME = rf"[A-Za-z0-9_-]{{1,{MAX_TOOL_NAME}}}"
"""The tool names every model provider accepts (OpenAI's rule, the strictest; spec T6)."""


def failed_call(name: str) -> CallOutcome:
    """A call whose handler failed: the model learns only that (the text may hold secrets)."""
    return CallOutcome("failure", f"Failed to execute '{name}': tool execution failed.")


def _to_outcome(value: Any) -> CallOutcome:
    match value:
        case ToolResult(result_type="success"):
            return CallOutcome("success", value.text_result_for_llm, tuple(value.tool_references))
        case ToolResult():
            return CallOutcome(value.result_type, value.text_result_for_llm)
        case str():
            return CallOutcome("success", value)
        case None:
            return CallOutcome("success", "")
        case BaseModel():
            return CallOutcome("success", value.model_dump_json())
        case _:
            return CallOutcome("success", pydantic_core.to_json(value).decode())


def valid_text(text: str) -> str:
    """`text` with lone surrogates replaced: they cannot be stored as UTF-8, and one stray
    character from a handler or a model must not fail the whole run."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


MAX_ARGUMENT_DEPTH = 64
"""Deeper JSON is not arguments but an attack or a broken model: it stays text (so the call
is `invalid_arguments`), as the log could not store it (pydantic serialises ~255 levels)."""


def parse_arguments(text: str) -> Any:
    """The model's argument text as JSON, or the text itself when it is not valid JSON (or is
    nested deeper than `MAX_ARGUMENT_DEPTH`). Lone surrogates that JSON escapes (`"\\ud800"`)
    put in strings are replaced, so that the arguments can be stored."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return valid_text(text)
    if _depth(value) > MAX_ARGUMENT_DEPTH:
        return valid_text(text)
    return _valid_strings(value)


def _depth(value: Any, limit: int = MAX_ARGUMENT_DEPTH) -> int:
    """How deeply `value` nests, counting no further than `limit + 1`."""
    depth, level = 0, [value]
    while level and depth <= limit:
        depth += 1
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
    return depth if not level else limit + 1


def _valid_strings(value: Any) -> Any:
    """`value` with `valid_text` applied to every string in it (keys included); the same
    object when nothing needed it, which is almost always."""
    match value:
        case str():
            return valid_text(value)
        case list():
            cleaned = [_valid_strings(item) for item in value]
            return value if all(a is b for a, b in zip(cleaned, value, strict=True)) else cleaned
        case dict():
            pairs = [(_valid_strings(k), _valid_strings(v)) for k, v in value.items()]
            items = zip(pairs, value.items(), strict=True)
            return value if all(k is a and v is b for (k, v), (a, b) in items) else dict(pairs)
        case _:
            return value


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _positional_arity(handler: ToolHandler) -> int:
    try:
        parameters = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)


def _params_type_of(fn: ToolHandler) -> type[BaseModel] | None:
    """The Pydantic model annotating the function's first parameter, if any."""
    try:
        first = next(iter(inspect.signature(fn, eval_str=True).parameters.values()), None)
    except (NameError, TypeError, ValueError):
        return None
    annotation = first.annotation if first is not None else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


@overload
def define_tool(name: ToolHandler, /) -> Tool: ...
@overload
def define_tool(
    name: str | None = None,
    /,
    *,
    description: str | None = None,
    handler: ToolHandler,
    params_type: type[BaseModel] | None = None,
    is_terminal: bool = False,
    defer: Literal["auto", "never"] | None = None,
    skip_permission: bool = False,
    overrides_built_in_tool: bool = False,
    metadata: dict[str, Any] | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
) -> Tool: ...
@overload
def define_tool(
    name: str | None = None,
    /,
    *,
    description: str | None = None,
    params_type: type[BaseModel] | None = None,
    is_terminal: bool = False,
    defer: Literal["auto", "never"] | None = None,
    skip_permission: bool = False,
    overrides_built_in_tool: bool = False,
    metadata: dict[str, Any] | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
) -> Callable[[ToolHandler], Tool]: ...
def define_tool(
    name: str | ToolHandler | None = None,
    /,
    *,
    description: str | None = None,
    handler: ToolHandler | None = None,
    params_type: type[BaseModel] | None = None,
    is_terminal: bool = False,
    defer: Literal["auto", "never"] | None = None,
    skip_permission: bool = False,
    overrides_built_in_tool: bool = False,
    metadata: dict[str, Any] | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
) -> Tool | Callable[[ToolHandler], Tool]:
    """Define a tool, directly or as a decorator.

    ```python
    clear = define_tool("clear_context", description="...", params_type=ClearArgs,
                        is_terminal=True, handler=clear_handler)

    @define_tool(description="Add two numbers")
    def add(params: AddArgs) -> str: ...
    ```

    The argument schema comes from `params_type`, else from the Pydantic model annotating
    the handler's first parameter; a handler without one receives the arguments as a dict.
    A handler taking two positional parameters also receives the `ToolInvocation`.
    `idempotent=True` lets a call a crash interrupted run again when the session is resumed
    or taken over (at least once); otherwise it ends `cancelled` (at most once).
    """
    if callable(name):
        return define_tool(handler=name)
    check_seconds("timeout", timeout, bounded=False)

    def build(fn: ToolHandler) -> Tool:
        if not callable(fn):
            raise TypeError(f"a tool handler must be callable, got {type(fn).__name__}")
        tool_name = name or getattr(fn, "__name__", None)
        if not tool_name or tool_name == "<lambda>":
            raise ValueError("a tool needs a name: pass define_tool('name', ...)")
        if not re.fullmatch(TOOL_NAME, tool_name):
            raise ValueError(
                f"tool name {tool_name!r} is not 1 to 64 letters, digits, '_' or '-', "
                "which is what model providers accept"
            )
        model = params_type or _params_type_of(fn)
        if model is not None and not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise TypeError("params_type must be a Pydantic BaseModel subclass")
        schema = model.model_json_schema() if model else {"type": "object", "properties": {}}
        definition = ToolDefinition(
            name=tool_name,
            description=description if description is not None else inspect.getdoc(fn) or "",
            parameters=schema,
            is_terminal=is_terminal,
            defer=defer,
            skip_permission=skip_permission,
            overrides_built_in_tool=overrides_built_in_tool,
            metadata=metadata,
            timeout=timeout,
            idempotent=idempotent,
        )
        return Tool(definition, fn, model)

    return build(handler) if handler is not None else build
