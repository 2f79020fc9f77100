"""The public surface: exports, `define_tool` forms, option validation, and the examples."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import trimtab
from tests.conftest import open_session
from trimtab import (
    Client,
    PermissionHandler,
    SessionNotFoundError,
    ToolInvocation,
    define_tool,
    events,
)
from trimtab.testing import ScriptedModel, tool_call

ROOT = Path(__file__).resolve().parent.parent


def test_all_is_sorted_and_matches_the_public_names() -> None:
    # Subpackages show up as attributes once imported; they are modules, not names in __all__.
    public = {
        name
        for name in dir(trimtab)
        if not name.startswith("_") and not isinstance(getattr(trimtab, name), types.ModuleType)
    }
    assert trimtab.__all__ == sorted(trimtab.__all__)
    assert set(trimtab.__all__) == public


class AddArgs(BaseModel):
    a: int
    b: int


def test_define_tool_as_a_decorator_infers_name_schema_and_docs() -> None:
    @define_tool
    def add(params: AddArgs) -> str:
        """Add two numbers."""
        return str(params.a + params.b)

    assert add.name == "add" and add.definition.description == "Add two numbers."
    assert add.definition.parameters["required"] == ["a", "b"]
    assert add.params_type is AddArgs


def test_define_tool_decorator_with_options() -> None:
    @define_tool(
        "adder",
        description="Adds",
        is_terminal=True,
        timeout=2.0,
        skip_permission=True,
        metadata={"k": 1},
    )
    async def add(params: AddArgs, invocation: ToolInvocation) -> int:
        return params.a + params.b

    d = add.definition
    assert (d.name, d.description, d.is_terminal, d.timeout, d.skip_permission, d.metadata) == (
        "adder",
        "Adds",
        True,
        2.0,
        True,
        {"k": 1},
    )


def test_tool_wire_definition_omits_false_flags() -> None:
    tool = define_tool("x", handler=lambda p: "", is_terminal=True, defer="never")
    wire = tool.definition.model_dump(by_alias=True, exclude_defaults=True)
    assert wire["isTerminal"] is True and wire["defer"] == "never" and "skipPermission" not in wire


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"handler": lambda p: ""}, ValueError),  # a lambda has no name
        ({"handler": 3}, TypeError),
        ({"handler": lambda p: "", "timeout": 0}, ValueError),
        ({"handler": lambda p: "", "timeout": float("nan")}, ValueError),
        ({"handler": lambda p: "", "params_type": dict}, TypeError),
    ],
)
def test_define_tool_rejects_bad_input(kwargs: dict[str, Any], error: type[Exception]) -> None:
    name = None if "timeout" not in kwargs and "params_type" not in kwargs else "t"
    with pytest.raises(error):
        define_tool(name, **kwargs)


NOT_DURATIONS = [0, -1.0, float("nan"), True, "5", 10**400]
"""What no timeout, interval or lease length may be (NaN compares false with everything, so
`<= 0` alone lets it through, and a wait bounded by it never ends; an int too large for a float
cannot be waited for)."""


@pytest.mark.parametrize("value", [*NOT_DURATIONS, float("inf")])
@pytest.mark.parametrize("name", ["lease_ttl", "poll_interval", "store_timeout"])
def test_w3_client_durations_must_be_positive_and_finite(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a positive, finite number"):
        Client(store="memory", **{name: value})


@pytest.mark.parametrize("value", [*NOT_DURATIONS, float("inf")])
def test_w3_store_timeouts_must_be_positive_and_finite(tmp_path: Path, value: Any) -> None:
    from trimtab.store.postgres import PostgresStore
    from trimtab.store.sqlite import SqliteStore

    with pytest.raises(ValueError, match="timeout must be a positive, finite number"):
        SqliteStore(tmp_path / "t.db", timeout=value)
    with pytest.raises(ValueError, match="timeout must be a positive, finite number"):
        PostgresStore("postgresql://127.0.0.1/none", timeout=value)


@pytest.mark.parametrize("value", NOT_DURATIONS)
async def test_w3_a_bad_send_and_wait_timeout_is_refused_before_anything_is_sent(
    client: Client, value: Any
) -> None:
    model = ScriptedModel(then=lambda request: "unused")
    session = await client.create_session(provider=model)
    before = len(await session.get_events())
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        await session.send_and_wait("hi", timeout=value)
    assert len(await session.get_events()) == before and model.requests == []


async def test_get_events_reads_past_a_count_and_refuses_anything_else(client: Client) -> None:
    session = await client.create_session(provider=ScriptedModel(["ok"]))
    await session.send_and_wait("hi")
    events = await session.get_events()
    assert await session.get_events(after=2) == events[2:]
    assert await session.get_events(after=len(events) + 5) == []
    not_counts: list[Any] = [-1, 1.5, float("nan"), "2", True]
    for after in not_counts:
        with pytest.raises(ValueError, match="after must be a count of events"):
            await session.get_events(after=after)


async def test_w3_an_infinite_send_and_wait_timeout_waits_as_none_does(client: Client) -> None:
    session = await client.create_session(provider=ScriptedModel(["ok"]))
    reply = await session.send_and_wait("hi", timeout=float("inf"))
    assert reply is not None and reply.data.content == "ok"


async def test_tool_without_a_model_gets_a_dict(client: Client) -> None:
    seen: list[Any] = []
    model = ScriptedModel([tool_call("raw", {"any": ["thing"]}), "ok"])
    session = await open_session(client, model, define_tool("raw", handler=seen.append))
    await session.send_and_wait("go")
    assert seen == [{"any": ["thing"]}]


async def test_unknown_session_option_is_an_error_naming_it(client: Client) -> None:
    with pytest.raises(ValueError, match="systemmessage"):
        await client.create_session(provider=ScriptedModel(), systemmessage="typo")


@pytest.mark.parametrize("name", ["get weather", "a.b", "x" * 65, "naïve", "tool/1"])
def test_t6_a_tool_name_no_provider_accepts_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        define_tool(name, handler=lambda _: "unreachable")


async def test_tool_names_given_twice_are_refused_before_anything_is_stored(
    client: Client,
) -> None:
    first = define_tool("lookup", handler=lambda _: "first")
    second = define_tool("lookup", handler=lambda _: "second")
    other = define_tool("other", handler=lambda _: "other")
    with pytest.raises(ValueError, match="unique.*lookup"):
        await client.create_session(
            provider=ScriptedModel(), session_id="dup", tools=[first, other, second]
        )
    assert "dup" not in {record.session_id for record in await client.list_sessions()}
    session = await client.create_session(provider=ScriptedModel(), tools=[first])
    await session.disconnect()
    with pytest.raises(ValueError, match="unique.*lookup"):
        await client.resume_session(
            session.session_id, provider=ScriptedModel(), tools=[first, second]
        )


async def test_provider_is_required_when_the_client_chooses_none() -> None:
    # Client() chooses one itself (spec S6, tests/test_provider_choice.py); None does not.
    async with Client(store="memory", provider=None) as client:
        with pytest.raises(ValueError, match="no provider"):
            await client.create_session()
    with pytest.raises(ValueError, match="a config dict, a Provider, 'auto' or None, not 'openai'"):
        Client(store="memory", provider="openai")  # type: ignore[arg-type]


async def test_unknown_provider_key_is_an_error_naming_it(client: Client) -> None:
    with pytest.raises(ValueError, match="base_uri"):
        await client.create_session(provider={"type": "openai", "base_uri": "http://x"}, model="m")


async def test_system_message_in_copilot_form(client: Client) -> None:
    model = ScriptedModel(["ok"])
    session = await client.create_session(provider=model, system_message={"content": "BE BRIEF"})
    await session.send_and_wait("hi")
    assert model.requests[0].messages[0].content == "BE BRIEF"


async def test_scripted_model_reports_leftover_steps() -> None:
    model = ScriptedModel(["never used"])
    with pytest.raises(AssertionError, match="1 script step"):
        async with Client(store="memory") as client:
            await client.create_session(provider=model)


def test_example_01_runs_offline() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "01_clear_context.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "reply: FRESH_CONTEXT" in done.stdout
    second_request = (
        "[('system', 'You are a helpful assistant.'), ('user', 'Reply with exactly FRESH"
    )
    assert second_request in done.stdout


def test_b1_example_05_reads_edits_and_tests_code_offline() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "05_builtin_tools.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.count("[asked] shell: ") == 2
    assert "[asked] write: " in done.stdout and "[edit] success" in done.stdout
    assert "last test run: ['test passed', '<exited with exit code 0>']" in done.stdout
    assert "calc.py now: return a + b" in done.stdout


def test_event_type_names_every_event_model_and_nothing_else() -> None:
    """`on()` checks names against `EventType`: a model added without its name there could
    not be subscribed to, and a stale name would be accepted and never delivered."""
    models = typing.get_args(typing.get_args(events.Event)[0])
    assert {model.model_fields["type"].default for model in models} == events.EVENT_TYPES


async def test_on_refuses_an_event_type_that_does_not_exist() -> None:
    async with Client(store="memory") as client:
        session = await client.create_session(provider=ScriptedModel())
        with pytest.raises(ValueError, match="unknown event type 'session.cleared'"):
            session.on("session.cleared", print)  # type: ignore[call-overload]
        session.on("session.context_cleared", print)


@pytest.mark.parametrize("value", [True, 2.0, "3", 0])
async def test_max_turns_must_be_a_whole_number_of_turns(client: Client, value: Any) -> None:
    with pytest.raises(ValueError, match="max_turns"):
        await client.create_session(provider=ScriptedModel(), max_turns=value)


@pytest.mark.parametrize(
    "args", [{"message": None}, {"message": 3}, {"message": "m", "kind": None}]
)
async def test_k4_a_log_note_of_the_wrong_type_is_a_value_error(
    client: Client, args: dict[str, Any]
) -> None:
    session = await client.create_session(provider=ScriptedModel())
    before = len(await session.get_events())
    with pytest.raises(ValueError):
        await session.log(**args)
    assert len(await session.get_events()) == before


async def test_d14_attachments_the_run_could_not_log_are_refused_even_when_queued(
    client: Client,
) -> None:
    # A message that waits behind a run is checked as one sent to an idle session: built
    # later, it would fail where nobody hears it and hold up every input behind it.
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(params: Any) -> str:
        started.set()
        await release.wait()
        return "ok"

    model = ScriptedModel([tool_call("slow"), "first", "third"])
    session = await client.create_session(
        provider=model,
        tools=[define_tool("slow", handler=slow)],
        on_permission_request=PermissionHandler.approve_all,
    )
    first = asyncio.ensure_future(session.send_and_wait("first"))
    await asyncio.wait_for(started.wait(), 10)
    unloggable: list[list[Any]] = [[{1: "a"}], [{"x": object()}]]
    for attachments in unloggable:
        with pytest.raises(ValueError, match="attachments"):
            await session.send("second", attachments=attachments)
    third = asyncio.ensure_future(session.send_and_wait("third"))
    release.set()
    assert (await asyncio.wait_for(first, 10)) is not None
    reply = await asyncio.wait_for(third, 10)
    assert reply is not None and reply.data.content == "third"
    assert await session.pending_messages() == []
    prompts = [e.data.content for e in await session.get_events() if e.type == "user.message"]
    assert prompts == ["first", "third"]


@pytest.mark.parametrize("number", [float("inf"), float("-inf"), float("nan")])
async def test_a_tool_the_log_cannot_hold_as_given_is_refused(
    client: Client, number: float
) -> None:
    # pydantic would store the number as null: the log would not give back the tool.
    tool = define_tool("t", handler=lambda params: "ok", metadata={"limits": [{"max": number}]})
    before = await client.list_sessions()
    with pytest.raises(ValueError, match="NaN or infinity"):
        await client.create_session(provider=ScriptedModel(), tools=[tool])
    assert await client.list_sessions() == before


async def test_one_sessions_record_is_read_alone(client: Client) -> None:
    session = await client.create_session(provider=ScriptedModel())
    await client.create_session(provider=ScriptedModel())
    record = await client.get_session_record(session.session_id)
    listed = {r.session_id: r for r in await client.list_sessions()}
    assert record == listed[session.session_id]
    with pytest.raises(SessionNotFoundError):
        await client.get_session_record("no-such-session")
