"""Recorded conversations, and their YAML files.

A conversation is a list of messages in OpenAI Chat Completions shape; each assistant message
in it is the answer to everything before it. Files have the shape of the Copilot SDK's
snapshot files, so the same recordings serve both:

```yaml
models: [gpt-4.1]          # optional
conversations:
  - messages:
      - role: user
        content: Weather in Paris?
      - role: assistant
        tool_calls:
          - id: call_1
            type: function
            function: {name: get_weather, arguments: '{"city":"Paris"}'}
      - role: tool
        tool_call_id: call_1
        content: sunny
      - role: assistant
        content: It is sunny in Paris.
```

PyYAML is imported only by the functions that read or write files (the `testing` extra:
`pip install '.[testing]'` in trimtab's checkout).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from yaml import SafeDumper, ScalarNode

__all__ = [
    "Conversation",
    "ConversationFile",
    "ConversationFunction",
    "ConversationMessage",
    "ConversationToolCall",
    "load_conversations",
    "read_conversation_file",
    "save_conversations",
]


class _Strict(BaseModel):
    # Conversations are written by hand: a misspelt key must fail, not be ignored.
    model_config = ConfigDict(extra="forbid")


class ConversationFunction(_Strict):
    """The function a recorded tool call invokes."""

    name: str
    arguments: str = "{}"
    """The arguments as JSON text, as on the wire; compared as parsed JSON (text that is not
    valid JSON compares as `{}`, which is how formats that cannot carry it send it back)."""


class ConversationToolCall(_Strict):
    """A recorded tool call, in OpenAI shape."""

    id: str
    """Matched by order of appearance, not literally: any id the client sends back will do."""
    type: Literal["function"] = "function"
    function: ConversationFunction


class ConversationMessage(_Strict):
    """One recorded message, in OpenAI Chat Completions shape."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ConversationToolCall] | None = None
    """On assistant messages: the calls the model made."""
    tool_call_id: str | None = None
    """On tool messages: the call this is the result of."""
    reasoning_content: str | None = None
    """On assistant messages: reasoning text to send before the content (not matched)."""
    finish_reason: str | None = None
    """On assistant messages: the finish reason to answer with, in Chat Completions terms
    (by default `tool_calls` or `stop`; not matched). Each format translates it."""


class Conversation(_Strict):
    """A recorded exchange; each assistant message in it is the answer to what precedes it."""

    messages: list[ConversationMessage]


class ConversationFile(_Strict):
    """The content of a conversations file."""

    models: list[str] | None = None
    """The models the recordings were made with (served by `GET /v1/models`)."""
    conversations: list[Conversation]


def read_conversation_file(path: str | Path) -> ConversationFile:
    """Read a conversations file.

    Raises:
        ValueError: The file is not YAML of the expected shape (pydantic names the field).
    """
    import yaml  # deferred: PyYAML is an optional dependency

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return ConversationFile.model_validate(data if data is not None else {})


def load_conversations(path: str | Path) -> list[Conversation]:
    """The conversations of a YAML file (see the module's docstring for the shape)."""
    return read_conversation_file(path).conversations


def save_conversations(
    path: str | Path,
    conversations: Sequence[Conversation],
    *,
    models: Sequence[str] | None = None,
) -> None:
    """Write conversations to a YAML file that `load_conversations` reads back as they were."""
    import yaml  # deferred: PyYAML is an optional dependency

    document = ConversationFile(
        models=list(models) if models is not None else None, conversations=list(conversations)
    )
    text = yaml.dump(
        document.model_dump(exclude_none=True),
        Dumper=_dumper(),
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )
    Path(path).write_text(text, encoding="utf-8")


def _dumper() -> type[SafeDumper]:
    """A safe dumper that writes multi-line text as literal blocks, which diff well."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: SafeDumper, value: str) -> ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return Dumper
