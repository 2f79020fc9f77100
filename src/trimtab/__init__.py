"""trimtab: an open agent session runtime whose context window the host controls."""

from trimtab._client import Client
from trimtab._errors import (
    BudgetExceededError,
    ClearContextError,
    LeaseLostError,
    PolicyRefusedError,
    PromptBlockedError,
    ProviderError,
    PruneError,
    QueueEditError,
    SessionError,
    SessionNotFoundError,
    StoreUnavailableError,
    ToolError,
    TrimtabError,
)
from trimtab._history import (
    ClearContextResult,
    CompactResult,
    History,
    PruneResult,
    TruncateResult,
)
from trimtab._metrics import SessionMetrics
from trimtab._options import SessionOptions
from trimtab._permissions import PermissionDecision, PermissionHandler
from trimtab._session import QueuedCommand, QueuedMessage, Session
from trimtab._tools import Tool, ToolInvocation, ToolResult, define_tool
from trimtab._window import ContextMessage, ContextWindow
from trimtab._workspace import Checkpoint, PathInfo, Workspace, WorkspaceError
from trimtab.builtin import builtin_tools
from trimtab.events import Budget, Event

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "BudgetExceededError",
    "Checkpoint",
    "ClearContextError",
    "ClearContextResult",
    "Client",
    "CompactResult",
    "ContextMessage",
    "ContextWindow",
    "Event",
    "History",
    "LeaseLostError",
    "PathInfo",
    "PermissionDecision",
    "PermissionHandler",
    "PolicyRefusedError",
    "PromptBlockedError",
    "ProviderError",
    "PruneError",
    "PruneResult",
    "QueueEditError",
    "QueuedCommand",
    "QueuedMessage",
    "Session",
    "SessionError",
    "SessionMetrics",
    "SessionNotFoundError",
    "SessionOptions",
    "StoreUnavailableError",
    "Tool",
    "ToolError",
    "ToolInvocation",
    "ToolResult",
    "TrimtabError",
    "TruncateResult",
    "Workspace",
    "WorkspaceError",
    "builtin_tools",
    "define_tool",
]
