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
from trimtab.providers._names import PROVIDER_NAMES, ProviderName, named_provider

__all__ = [
    "PROVIDER_NAMES",
    "Message",
    "ModelRequest",
    "ModelResponse",
    "Provider",
    "ProviderConfig",
    "ProviderEvent",
    "ProviderName",
    "ReasoningDelta",
    "TextDelta",
    "ToolCall",
    "Usage",
    "make_provider",
    "named_provider",
]
