"""Typed results (issue 39; spec OUT1-OUT6): `send_and_wait(prompt, output_type=...)` ends the
run with a validated value, given by the model through the run's terminal `final_result`
tool, or by its reply where the provider has native structured output."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, field_validator
from typing_extensions import TypedDict

from tests.conftest import EchoArgs, Recorder, echo_tool, open_session
from tests.test_persistence import copy_log
from trimtab import Client, SessionError, TrimtabError, define_tool
from trimtab.events import Event
from trimtab.testing import ScriptedModel, tool_call


class City(BaseModel):
    """A city and how many live there."""

    name: str
    population: int


@dataclasses.dataclass
class Point:
    x: float
    y: float


class Pair(TypedDict):
    left: str
    right: list[int]


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


CASES: list[tuple[Any, dict[str, Any], Any]] = [
    (City, {"name": "Paris", "population": "2100000"}, City(name="Paris", population=2100000)),
    (Point, {"x": 1, "y": 2.5}, Point(1.0, 2.5)),
    (Pair, {"left": "a", "right": [1, 2]}, {"left": "a", "right": [1, 2]}),
    (int, {"result": 42}, 42),
    (list[str], {"result": ["a", "b"]}, ["a", "b"]),
    (Color, {"result": "blue"}, Color.BLUE),
    (Literal["yes", "no"], {"result": "no"}, "no"),
    (City | None, {"result": None}, None),
]


def outputs(log: list[Event]) -> list[Any]:
    return [
        e.data.output.value
        for e in log
        if e.type in ("tool.execution_complete", "assistant.message") and e.data.output
    ]


@pytest.mark.parametrize(("output_type", "arguments", "expected"), CASES)
async def test_out1_each_output_type_is_given_by_the_final_result_tool(
    output_type: Any, arguments: dict[str, Any], expected: Any
) -> None:
    model = ScriptedModel([tool_call("final_result", arguments)])
    async with Client(store="memory") as client:
        session = await open_session(client, model)
        value = await session.send_and_wait("Answer.", output_type=output_type)
        log = await session.get_events()

    assert value == expected and type(value) is type(expected)
    [request] = model.requests
    assert request.tool_choice == "required"  # OUT2: the answer must call a tool
    [tool] = request.tools
    assert tool.name == "final_result" and tool.is_terminal
    # Objects are the tool's parameters; anything else is wrapped in {"result": ...}.
    wrapped = "result" in arguments
    assert ("result" in tool.parameters["properties"]) == wrapped
    # OUT4: the validated value, as JSON data, is in the log.
    assert len(outputs(log)) == 1
    message = next(e for e in log if e.type == "user.message")
    assert message.data.output is not None and message.data.output.tool_name == "final_result"


async def test_out1_a_plain_run_is_unchanged_and_a_typed_one_adds_its_tool_for_that_run() -> None:
    model = ScriptedModel(["plain", tool_call("final_result", {"result": 3}), "plain again"])
    async with Client(store="memory") as client:
        session = await open_session(client, model, echo_tool())
        reply = await session.send_and_wait("Hi")
        assert reply is not None and reply.data.content == "plain"
        assert await session.send_and_wait("Count.", output_type=int) == 3
        await session.send_and_wait("Hi again")

    names = [[t.name for t in r.tools] for r in model.requests]
    assert names == [["echo"], ["echo", "final_result"], ["echo"]]
    assert [r.tool_choice for r in model.requests] == [None, "required", None]


async def test_out3_an_invalid_result_goes_back_to_the_model_which_tries_again() -> None:
    model = ScriptedModel(
        [
            tool_call("final_result", {"name": "Paris"}),
            tool_call("final_result", {"name": "Paris", "population": 2100000}),
        ]
    )
    async with Client(store="memory") as client:
        session = await open_session(client, model)
        city = await session.send_and_wait("Biggest city?", output_type=City)
        log = await session.get_events()

    assert city == City(name="Paris", population=2100000)
    completes = [e.data for e in log if e.type == "tool.execution_complete"]
    assert [c.outcome for c in completes] == ["invalid_arguments", "success"]
    # The model read why, field by field, as the call's result.
    told = model.requests[1].messages[-1]
    assert told.role == "tool" and "population: Field required" in told.content
    assert outputs(log) == [{"name": "Paris", "population": 2100000}]


async def test_out3_a_host_validator_refusing_a_result_is_an_invalid_result() -> None:
    class Even(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def _even(cls, n: int) -> int:
            if n % 2:
                raise ValueError("must be even")
            return n

    model = ScriptedModel(
        [tool_call("final_result", {"n": 3}), tool_call("final_result", {"n": 4})]
    )
    async with Client(store="memory") as client:
        session = await open_session(client, model)
        assert await session.send_and_wait("An even number.", output_type=Even) == Even(n=4)
    assert "must be even" in model.requests[1].messages[-1].content


async def test_out3_a_reply_in_text_is_told_to_call_the_tool() -> None:
    model = ScriptedModel(["It is Paris.", tool_call("final_result", {"result": "Paris"})])
    async with Client(store="memory") as client:
        session = await open_session(client, model)
        seen = Recorder(session)
        assert await session.send_and_wait("Biggest city?", output_type=str) == "Paris"
        log = await session.get_events()

    retry = [e for e in log if e.type == "user.message" and e.data.source == "output"]
    assert len(retry) == 1 and "final_result" in retry[0].data.content
    # The same run: one idle, and the retry is the second request's last message.
    assert seen.types.count("session.idle") == 1
    assert model.requests[1].messages[-1].content == retry[0].data.content


async def test_out3_the_last_invalid_result_ends_the_run_in_invalid_output() -> None:
    model = ScriptedModel(
        [
            tool_call("final_result", {"result": "x"}),
            "not a call",
            tool_call("final_result", {"result": "three"}),
        ]
    )
    async with Client(store="memory") as client:
        session = await open_session(client, model)
        seen = Recorder(session)
        with pytest.raises(SessionError, match="invalid_output") as raised:
            await session.send_and_wait("A number.", output_type=int)
        await seen.wait_for("session.idle")
        log, types = await session.get_events(), seen.types
        # The session goes on: the next run is a new one, with attempts of its own.
        model.add(tool_call("final_result", {"result": 7}))
        assert await session.send_and_wait("A number.", output_type=int) == 7

    # The error names the last validation error (OUT3), and the run ended in it.
    assert "3 invalid results" in raised.value.message
    assert "result: Input should be a valid integer" in raised.value.message
    assert types[-2:] == ["session.error", "session.idle"]
    assert types.count("session.idle") == 1
    assert log[-1].type == "session.error" and log[-1].data.error_type == "invalid_output"
    assert len(model.requests) == 4


async def test_out3_max_invalid_outputs_bounds_replies_in_text_too() -> None:
    model = ScriptedModel(["no", "still no"])
    async with Client(store="memory") as client:
        session = await open_session(client, model)
        with pytest.raises(SessionError, match="invalid_output") as raised:
            await session.send_and_wait("A number.", output_type=int, max_invalid_outputs=2)
        log = await session.get_events()
    assert "a reply in text" in raised.value.message
    # The last try gets no retry message: the run ends with the error.
    assert [e.data.source for e in log if e.type == "user.message"] == ["user", "output"]
    assert log[-1].type == "session.error"


async def test_out1_the_tool_takes_another_name_when_the_session_has_a_final_result() -> None:
    model = ScriptedModel([tool_call("final_result_2", {"result": True})])
    async with Client(store="memory") as client:
        session = await open_session(client, model, echo_tool(), tool_named("final_result"))
        assert await session.send_and_wait("Yes?", output_type=bool) is True
    assert [t.name for t in model.requests[0].tools] == ["echo", "final_result", "final_result_2"]


def tool_named(name: str) -> Any:
    return define_tool(name, handler=lambda params: "the host's own")


async def test_out4_run_returns_the_typed_result_and_a_resumed_session_reads_it(
    tmp_path: Path,
) -> None:
    store = tmp_path / "trimtab.db"
    async with Client(store=store) as client:
        model = ScriptedModel([tool_call("final_result", {"name": "Oslo", "population": 7})])
        session = await open_session(client, model)
        end = await session.run("A city.", output_type=City)
        assert end.output is not None and end.output.value == City(name="Oslo", population=7)
        await session.disconnect()
    async with Client(store=store) as other:
        resumed = await other.resume_session(session.session_id, provider=ScriptedModel())
        assert await resumed.output(end.message_id, output_type=City) == City(
            name="Oslo", population=7
        )
        assert await resumed.output() == {"name": "Oslo", "population": 7}
        with pytest.raises(LookupError):
            await resumed.output("no-such-message")


async def test_out5_a_run_continued_elsewhere_is_checked_against_its_logged_schema(
    tmp_path: Path,
) -> None:
    """The process that asked for the result crashed mid-run; another one continues the run
    from the log, without the Python type: the result is checked by its JSON Schema."""
    async with Client(store="memory") as first:
        crashing = ScriptedModel(then=lambda request: tool_call("echo", {"text": "x"}))
        hanging = define_tool("echo", params_type=EchoArgs, handler=_hang)
        session = await open_session(first, crashing, hanging)
        seen = Recorder(session)
        await session.send("A city.", output_type=City)
        await seen.wait_for("tool.execution_start")
        crashed = await session.get_events()
        await session.disconnect()
    db = tmp_path / "crash.db"
    await copy_log(crashed, db, session.session_id)

    model = ScriptedModel(
        [
            tool_call("final_result", {"name": "Oslo", "population": "many"}),
            tool_call("final_result", {"name": "Oslo", "population": 7}),
        ]
    )
    async with Client(store=db) as second:
        resumed = await open_resumed(second, session.session_id, model)
        seen = Recorder(resumed)
        await seen.wait_for("session.idle")
        log = await resumed.get_events()
        assert await resumed.output(output_type=City) == City(name="Oslo", population=7)

    completes = [e.data for e in log if e.type == "tool.execution_complete"]
    assert [c.outcome for c in completes][-2:] == ["invalid_arguments", "success"]
    assert "'many' is not of type 'integer'" in (completes[-2].error.message or "")
    assert model.requests[0].tool_choice == "required"


async def _hang(params: Any) -> str:
    import asyncio

    await asyncio.Event().wait()
    return "never"


async def open_resumed(client: Client, session_id: str, model: ScriptedModel) -> Any:
    from trimtab import PermissionHandler

    return await client.resume_session(
        session_id,
        continue_pending_work=True,
        provider=model,
        tools=[echo_tool()],
        on_permission_request=PermissionHandler.approve_all,
    )


async def test_out1_output_schema_gives_json_data_checked_by_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["tags"],
    }
    model = ScriptedModel(
        [tool_call("final_result", {"tags": [1]}), tool_call("final_result", {"tags": ["a"]})]
    )
    async with Client(store="memory") as client:
        session = await open_session(client, model)
        assert await session.send_and_wait("Tags.", output_schema=schema) == {"tags": ["a"]}
        with pytest.raises(ValueError, match="not a valid JSON Schema"):
            await session.send("x", output_schema={"type": "no-such-type"})
        with pytest.raises(ValueError, match="not both"):
            await session.send("x", output_type=int, output_schema=schema)
        with pytest.raises(TypeError, match="no JSON Schema"):
            await session.send("x", output_type=object())
        assert len(await session.get_events()) == len(await session.get_events())
    assert model.requests[0].tools[0].parameters == schema


async def test_out4_a_typed_run_that_gives_no_result_raises() -> None:
    from trimtab import PermissionDecision

    def reject(request: Any, invocation: Any) -> PermissionDecision:
        return PermissionDecision(kind="reject")

    model = ScriptedModel([tool_call("echo", {"text": "x"})])
    async with Client(store="memory") as client:
        session = await open_session(client, model, echo_tool(), on_permission_request=reject)
        with pytest.raises(TrimtabError, match="without a result"):
            await session.send_and_wait("Echo, then answer.", output_type=int)


async def test_out6_native_structured_output_takes_the_reply_as_the_result() -> None:
    model = ScriptedModel(
        ['{"name": "Oslo"}', '```json\n{"name": "Oslo", "population": 7}\n```'],
        native_output=True,
    )
    async with Client(store="memory") as client:
        session = await open_session(client, model, structured_output="native")
        city = await session.send_and_wait("A city.", output_type=City)
        log = await session.get_events()

    assert city == City(name="Oslo", population=7)
    request = model.requests[0]
    # The provider's own structured output, not the tool: the reply is the result.
    assert request.tools == () and request.tool_choice is None
    assert request.output_schema is not None and "population" in request.output_schema["required"]
    retry = [e.data.content for e in log if e.type == "user.message" and e.data.source == "output"]
    assert len(retry) == 1 and "population: Field required" in retry[0]
    assert outputs(log) == [{"name": "Oslo", "population": 7}]
    message = [e for e in log if e.type == "assistant.message"][-1]
    assert message.data.output is not None


async def test_out6_native_asked_of_a_provider_without_it_uses_the_tool() -> None:
    model = ScriptedModel([tool_call("final_result", {"result": 5})])  # native_output=False
    async with Client(store="memory") as client:
        session = await open_session(client, model, structured_output="native")
        assert await session.send_and_wait("Five.", output_type=int) == 5
    assert model.requests[0].output_schema is None
    assert [t.name for t in model.requests[0].tools] == ["final_result"]


async def test_out1_a_remote_session_refuses_a_typed_send(tmp_path: Path) -> None:
    store = tmp_path / "trimtab.db"
    async with Client(store=store) as owner, Client(store=store) as other:
        session = await open_session(owner, ScriptedModel())
        remote = await other.resume_session(session.session_id, provider=ScriptedModel())
        assert remote.is_remote
        with pytest.raises(TrimtabError, match="takes no output_type"):
            await remote.send("x", output_type=int)
        assert [e.type for e in await remote.get_events()] == ["session.start"]


def test_out1_the_log_keeps_the_schema_as_json() -> None:
    from trimtab._output import typed_output

    output = typed_output(City | None, taken=(), max_invalid=3, native=False)
    # `$defs` are kept at the top, where `$ref`s find them, also in the wrapper.
    assert json.loads(output.spec.model_dump_json(by_alias=True))["jsonSchema"]["$defs"].keys() == {
        "City"
    }
