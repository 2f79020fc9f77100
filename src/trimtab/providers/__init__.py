"""Model providers: the `Provider` seam and the built-in wire formats."""

from trimtab.providers._base import (
    Message,
    ModelRequest,
    ModelResponse,
    Provider,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    Usage,
)
from trimtab.providers._config import ProviderConfig, make_provider

__all__ = [
    "Message",
    "ModelRequest",
    "ModelResponse",
    "Provider",
    "ProviderConfig",
    "ProviderEvent",
    "ReasoningDelta",
    "TextDelta",
    "ToolCall",
    "Usage",
    "make_provider",
]
