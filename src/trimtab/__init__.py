"""trimtab: an open agent session runtime whose context window the host controls."""

from trimtab._client import Client, SessionOptions
from trimtab._errors import (
    ClearContextError,
    LeaseLostError,
    ProviderError,
    SessionError,
    SessionNotFoundError,
    ToolError,
    TrimtabError,
)
from trimtab._permissions import PermissionDecision, PermissionHandler
from trimtab._session import ClearContextResult, History, Session
from trimtab._tools import Tool, ToolInvocation, ToolResult, define_tool
from trimtab.events import Event

__version__ = "0.1.0"

__all__ = [
    "ClearContextError",
    "ClearContextResult",
    "Client",
    "Event",
    "History",
    "LeaseLostError",
    "PermissionDecision",
    "PermissionHandler",
    "ProviderError",
    "Session",
    "SessionError",
    "SessionNotFoundError",
    "SessionOptions",
    "Tool",
    "ToolError",
    "ToolInvocation",
    "ToolResult",
    "TrimtabError",
    "define_tool",
]
