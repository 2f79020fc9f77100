"""Test doubles for trimtab and for the code built on it."""

from trimtab.testing._faulty import FaultyStore
from trimtab.testing._replay import (
    Conversation,
    ConversationFunction,
    ConversationMessage,
    ConversationToolCall,
    ReceivedRequest,
    ReplayServer,
    load_conversations,
    save_conversations,
)
from trimtab.testing._scripted import ScriptedModel, ScriptStep, tool_call

__all__ = [
    "Conversation",
    "ConversationFunction",
    "ConversationMessage",
    "ConversationToolCall",
    "FaultyStore",
    "ReceivedRequest",
    "ReplayServer",
    "ScriptStep",
    "ScriptedModel",
    "load_conversations",
    "save_conversations",
    "tool_call",
]
