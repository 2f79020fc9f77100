"""A replay server: recorded conversations served over real HTTP.

`ReplayServer` listens on 127.0.0.1 and answers model calls from a list of `Conversation`s in
the OpenAI Chat Completions, OpenAI Responses and Anthropic Messages wire formats. Everything
a provider does on the wire is exercised (HTTP, SSE framing, chunking, retries, timeouts),
without a network or a model.

The package has one module per concern: `conversations` (the models and their YAML files),
`matching` (format-neutral), `formats` (one module per wire format, each converting requests
to the canonical form and answers back), `http` and `server`.
"""

from trimtab.testing._replay.conversations import (
    Conversation,
    ConversationFunction,
    ConversationMessage,
    ConversationToolCall,
    load_conversations,
    save_conversations,
)
from trimtab.testing._replay.server import ReceivedRequest, ReplayServer

__all__ = [
    "Conversation",
    "ConversationFunction",
    "ConversationMessage",
    "ConversationToolCall",
    "ReceivedRequest",
    "ReplayServer",
    "load_conversations",
    "save_conversations",
]
