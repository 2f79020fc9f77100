"""Spec D15: session options are one model, `SessionOptions`, for the in-process client, the
remote client and the wire."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from trimtab import Client, PermissionHandler, SessionOptions, define_tool
from trimtab.events import Budget, Handoff, InfiniteSessions, ModelLimits, Recall, ToolSearch
from trimtab.protocol.wire import CreateParams, ResumeParams, SystemMessage, WireTool, dump
from trimtab.providers import ProviderConfig
from trimtab.testing import ScriptedModel


def echo(text: str) -> str:
    return text


ECHO = define_tool("echo", handler=echo)


def every_option() -> SessionOptions:
    """Options with every field given: a new field must be added here (see the check)."""
    return SessionOptions(
        model="m",
        reasoning_effort="high",
        provider={"type": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key": "k"},
        system_message="BE BRIEF",
        developer_messages=["dev"],
        tools=[ECHO],
        on_permission_request=PermissionHandler.approve_all,
        streaming=True,
        model_limits=ModelLimits(context_window=1000, max_output_tokens=100),
        infinite_sessions=InfiniteSessions(enabled=True, threshold=0.5),
        tool_search=ToolSearch(enabled=False, defer_threshold=3),
        max_turns=7,
        context_overflow="drop",
        handoff=Handoff(threshold=0.6),
        recall=Recall(max_results=3),
        budget=Budget(cost=2.5, model_calls=40, warn_at=0.5),
        structured_output="native",
        hooks={"on_session_end": lambda *args: None},
        mcp_servers={"fs": {"command": "server", "args": ["--root", "."]}},
    )


def test_d15_the_sample_gives_every_option() -> None:
    assert every_option().model_fields_set == set(SessionOptions.model_fields)


async def test_d15_an_instance_keywords_or_both_give_the_same_session() -> None:
    async with Client(store="memory") as client:
        given = SessionOptions(model="m", max_turns=3, developer_messages=["dev"])
        by_instance = await client.create_session(given, provider=ScriptedModel())
        by_keywords = await client.create_session(
            provider=ScriptedModel(), model="m", max_turns=3, developer_messages=["dev"]
        )
        # Keywords win over the instance's fields; its other fields stay.
        both = await client.create_session(given, provider=ScriptedModel(), max_turns=5)
    config = by_instance.config
    assert (config.model, config.max_turns, config.developer_messages) == ("m", 3, ["dev"])
    assert by_keywords.config == config
    assert both.config == config.model_copy(update={"max_turns": 5})


async def test_d15_keywords_take_python_names_only() -> None:
    async with Client(store="memory") as client:
        with pytest.raises(ValueError, match="maxTurns"):
            await client.create_session(provider=ScriptedModel(), maxTurns=3)
        assert await client.list_sessions() == []
    with pytest.raises(ValidationError, match="mx_turns"):
        # A type checker sees the model's fields: the wrong name is a static error too.
        SessionOptions(mx_turns=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="SessionOptions"):
        async with Client(store="memory") as client:
            await client.create_session({"model": "m"})  # type: ignore[arg-type]


async def test_d15_an_option_given_as_none_is_not_given() -> None:
    async with Client(store="memory") as client:
        session = await client.create_session(provider=ScriptedModel(), model="m", max_turns=3)
        await session.disconnect()
        resumed = await client.resume_session(
            session.session_id, provider=ScriptedModel(), model=None, max_turns=None
        )
        assert (resumed.config.model, resumed.config.max_turns) == ("m", 3)


async def test_d15_errors_name_the_option_never_its_value() -> None:
    async with Client(store="memory") as client:
        with pytest.raises(ValueError, match="provider") as raised:
            await client.create_session(provider="sk-secret")
    assert "sk-secret" not in str(raised.value)


async def test_d15_a_session_gives_its_options_as_the_model() -> None:
    model = ScriptedModel()
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=model, tools=[ECHO], on_permission_request=PermissionHandler.approve_all
        )
        options = session.options()
        assert isinstance(options, SessionOptions)
        assert (options.provider, options.tools) == (model, [ECHO])
        assert options.on_permission_request is PermissionHandler.approve_all
        # What a fork is given again, as a caller may pass it.
        again = await client.create_session(options, model="other")
        assert (set(again.tools), again.config.model) == ({"echo"}, "other")


def test_d15_the_wire_gives_back_the_options_a_client_sends() -> None:
    """What `Client.connect` sends, the server reads as the same options: every option with a
    wire form, with no mapping written per field."""
    options = every_option().model_copy(update={"hooks": None})
    for params_type in (CreateParams, ResumeParams):
        wire = params_type.model_validate(dump(params_type.of("s", options)))
        read = wire.options()
        code = {name for name, field in SessionOptions.model_fields.items() if field.exclude}
        data = set(SessionOptions.model_fields) - code - {"provider", "system_message"}
        assert {name: getattr(read, name) for name in data} == {
            name: getattr(options, name) for name in data
        }
        # The provider goes as its checked config, the system message as the whole one.
        assert ProviderConfig.model_validate(read.provider) == ProviderConfig.model_validate(
            options.provider
        )
        assert wire.system_message == SystemMessage(content="BE BRIEF", mode="replace")
        assert wire.tools == [WireTool.of(ECHO.definition)]
        assert (wire.request_permission, wire.hooks) == (True, False)


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"hooks": {"on_session_end": lambda *args: None}}, "not available on a remote session"),
        ({"provider": ScriptedModel()}, "a Provider object cannot be sent"),
    ],
)
def test_d15_what_has_no_wire_form_is_refused_before_anything_is_sent(
    given: dict[str, Any], refused: str
) -> None:
    with pytest.raises(TypeError, match=refused):
        CreateParams.of("s", SessionOptions(**given))


def test_d15_a_clients_create_without_a_system_message_has_none() -> None:
    create = CreateParams.of("s", SessionOptions())
    resume = ResumeParams.of("s", SessionOptions())
    assert create.system_message == SystemMessage(content="", mode="replace")
    assert resume.system_message is None  # the session keeps its own
