"""`RunContext`: what a turn of a run works with, as one value.

The session's runner builds one at each turn's start: the configuration, the tools, the
approvals and the provider may change between turns (a model switch, an MCP server's new
tools, `approve_all`), never during one. Together with the session's log (`Writer`), it is
all the loop and compaction need, so that a run can be driven from anywhere that can supply
both (a test with a list for a log, another worker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from trimtab._hooks import Hooks
from trimtab._output import Output
from trimtab._permissions import PermissionHandlerFn
from trimtab._state import SessionState
from trimtab._tools import SessionHandle, Tool, ToolInvocation
from trimtab._tracing import Tracing
from trimtab.events import Event, ModelLimits, SessionConfigData, ToolDefinition
from trimtab.providers import Provider, ToolCall

__all__ = ["RunContext", "Writer", "emit"]


@dataclass(frozen=True, slots=True)
class RunContext:
    """One turn's inputs: who runs, with what model, tools, policy and hooks."""

    session: SessionHandle
    """The session the run belongs to, as its tool handlers get it."""
    config: SessionConfigData
    """The configuration as the log held it when the turn started."""
    provider: Provider
    limits: ModelLimits
    """The model's context window and output limit (the session's override, else the table)."""
    tools: Mapping[str, Tool]
    """Every tool the model may call, the built-in `tool_search` included."""
    deferred: frozenset[str]
    """Tools left out of the model's list until `tool_search` finds them."""
    shown: tuple[ToolDefinition, ...]
    """The tool definitions the model is sent this turn."""
    permission_handler: PermissionHandlerFn | None
    approve_all: bool
    """Every call is approved without a permission request (spec K6)."""
    hooks: Hooks
    tracing: Tracing
    request_headers: dict[str, str] | None = None
    """The HTTP headers the run's `send` gave for its model requests (spec D9)."""
    prompt: str | None = None
    """The run's prompt, as stored: the request a handoff carries over (X5); None when this
    runtime was not given it (a run a crash interrupted goes on)."""
    output: Output | None = None
    """The typed result the run must end with (spec OUT1): in tool mode its tool is among
    `tools` and `shown`."""

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def usage_model(self) -> str:
        """The model a call's `assistant.usage` names, by which the estimate is calibrated
        (spec X1): the session's model, else its provider's name."""
        return self.config.model or self.provider.name

    def invocation(
        self, call: ToolCall, arguments: object, request_id: str | None = None
    ) -> ToolInvocation:
        """What the handler of `call` is told about it."""
        return ToolInvocation(
            session_id=self.session_id,
            tool_call_id=call.id,
            tool_name=call.name,
            arguments=arguments,
            session=self.session,
            request_id=request_id,
        )


class Writer(Protocol):
    """A session's log as a run writes it: what it knows, and the one way to add to it."""

    @property
    def state(self) -> SessionState:
        """The session's state, as the log's events so far make it (read-only)."""
        ...

    async def emit_all(self, events: Sequence[Event]) -> list[Event]:
        """Store and deliver `events` as one atomic batch, nothing between them."""
        ...


async def emit(writer: Writer, event: Event) -> Event:
    """Store and deliver one event; the event as stored."""
    return (await writer.emit_all((event,)))[0]
