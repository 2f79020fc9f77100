"""The provider seam: one request in, one streamed response out.

A provider knows nothing about sessions. It maps a `ModelRequest` to its wire format, streams
the answer back as `ProviderEvent`s ending in exactly one `ModelResponse`, and maps every
failure to a typed `ProviderError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from trimtab.events import Message, ToolCall, ToolDefinition

__all__ = [
    "Message",
    "ModelRequest",
    "ModelResponse",
    "Provider",
    "ProviderEvent",
    "ReasoningDelta",
    "TextDelta",
    "ToolCall",
    "Usage",
]


class _Frozen(BaseModel):
    # Schemas built on first use, as for the event models: a faster start-up.
    model_config = ConfigDict(frozen=True, defer_build=True)


class ModelRequest(_Frozen):
    """Everything a provider needs for one model call."""

    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...] = ()
    stream: bool = False
    max_tokens: int | None = None
    headers: dict[str, str] | None = None
    """HTTP headers for this request only (a `send`'s `request_headers`), over the
    provider's own."""
    reasoning_effort: str | None = None
    """The effort asked of a reasoning model (`low`, `medium`, `high`...), sent as given to
    the providers whose API has it (spec D12); None: the model's default."""
    tool_choice: Literal["required"] | None = None
    """`required`: the answer must call a tool (a run that must give a typed result, spec
    OUT2); None: the model chooses."""
    output_schema: dict[str, Any] | None = None
    """The JSON Schema the reply's text must follow, for providers with native structured
    output (`Provider.native_output`, spec OUT6); the text is checked all the same."""


class Usage(_Frozen):
    input_tokens: int | None = None
    """Every input token, those read from a prompt cache included."""
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    """Of the input tokens, those the provider read from its prompt cache (billed less)."""


class TextDelta(_Frozen):
    """A piece of the reply's text, as it streams."""

    kind: Literal["text"] = "text"
    text: str


class ReasoningDelta(_Frozen):
    """A piece of the model's reasoning text (providers that stream it)."""

    kind: Literal["reasoning"] = "reasoning"
    text: str


class ModelResponse(_Frozen):
    """The complete answer: always the last event of a stream."""

    kind: Literal["response"] = "response"
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None


ProviderEvent: TypeAlias = TextDelta | ReasoningDelta | ModelResponse


@runtime_checkable
class Provider(Protocol):
    """What the loop needs of a model provider."""

    name: str
    """A short label for logs and the persisted config, such as `"openai"`."""

    # Optional, read with a default of False (a provider written before it has none):
    # `native_output: bool`, the provider sends `ModelRequest.output_schema` as its API's own
    # structured output (spec OUT6).

    def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        """Answer one request; raise `ProviderError` on any failure."""
        ...

    async def aclose(self) -> None:
        """Release connections; called once when the client closes."""
        ...
