"""Test doubles for trimtab and for the code built on it."""

from trimtab.testing._replay import Conversation, ConversationMessage, ReplayServer
from trimtab.testing._scripted import ScriptedModel, ScriptStep, tool_call

__all__ = [
    "Conversation",
    "ConversationMessage",
    "ReplayServer",
    "ScriptStep",
    "ScriptedModel",
    "tool_call",
]
