"""Provider conformance: one suite of scenarios, run through every wire format.

Each test drives the real runtime (`Client`, a session, tools, the loop) against a
`ReplayServer` speaking one of OpenAI Chat Completions, OpenAI Responses or Anthropic
Messages, streamed or not. The recorded conversations are the same for every format (the
server converts each request to the canonical form), and system messages are matched, so a
request that reached the model with the wrong shape fails to match.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from tests.conftest import Recorder, clear_tool
from trimtab import Client, PermissionHandler, Session, SessionError, define_tool
from trimtab.events import Image
from trimtab.testing import Conversation, ConversationMessage, ReplayServer
from trimtab.testing._replay.formats import format_for

SYSTEM = "You are terse."
DEVELOPER = "Answer in English."
HELLO = "Hello there, how can I help you today?"
SEED = "Reply with exactly FRESH_CONTEXT."
ASK = f'Call clear_context with prompt "{SEED}" now.'
NOTE = 'He said "naïve 🌍"\nthen left; a\\b and \t tab'
BAD_ARGUMENTS = '{"city": "Par'


@dataclass(frozen=True)
class Wire:
    """One wire format, streamed or not, and how to point a provider at the server."""

    family: str
    stream: bool

    def provider(self, server: ReplayServer, **options: Any) -> dict[str, Any]:
        config: dict[str, Any] = {"api_key": "test-key", "max_retries": 0, **options}
        if self.family == "anthropic":
            # The Anthropic client adds `/v1/messages` to the server's root itself.
            return {"type": "anthropic", "base_url": server.root_url, **config}
        wire_api = "responses" if self.family == "responses" else "completions"
        return {"type": "openai", "base_url": server.base_url, "wire_api": wire_api, **config}

    @property
    def context_length_message(self) -> str:
        if self.family == "anthropic":
            return "prompt is too long: 250000 tokens > 200000 maximum"
        return "This model's maximum context length is 128000 tokens."


WIRES = {
    f"{family}{'-stream' if stream else ''}": Wire(family, stream)
    for family in ("chat", "responses", "anthropic")
    for stream in (False, True)
}


def _call(call_id: str, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _conversation(*messages: dict[str, Any]) -> Conversation:
    head = [{"role": "system", "content": SYSTEM}, {"role": "developer", "content": DEVELOPER}]
    return Conversation(
        messages=[ConversationMessage.model_validate(m) for m in (*head, *messages)]
    )


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _assistant(text: str | None = None, *calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, "tool_calls": list(calls) or None, **extra}


def _tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


CONVERSATIONS = [
    _conversation(_user("Say hello"), _assistant(HELLO)),
    # After a failed run its user message stays in the window: the next run continues it.
    _conversation(_user("Say hello"), _user("Again please"), _assistant("Hello again.")),
    _conversation(
        _user("Weather in Paris?"),
        _assistant(None, _call("call_1", "get_weather", {"city": "Paris"})),
        _tool("call_1", "sunny in Paris"),
        _assistant("It is sunny in Paris."),
    ),
    _conversation(
        _user("Weather in Paris and Rome?"),
        _assistant(
            "Checking both.",
            _call("call_a", "get_weather", {"city": "Paris"}),
            _call("call_b", "get_weather", {"city": "Rome", "units": "imperial"}),
        ),
        _tool("call_a", "sunny in Paris"),
        _tool("call_b", "sunny in Rome (imperial)"),
        _assistant("Sunny in both."),
    ),
    _conversation(
        _user("Take a note"),
        _assistant(None, _call("call_n", "take_note", {"text": NOTE})),
        _tool("call_n", "noted"),
        _assistant("Noted."),
    ),
    _conversation(
        _user("Finish now"), _assistant(None, _call("call_f", "finish", {"summary": "done"}))
    ),
    _conversation(_user(ASK), _assistant(None, _call("call_c", "clear_context", {"prompt": SEED}))),
    _conversation(_user(SEED), _assistant("FRESH_CONTEXT")),
    _conversation(
        _user("Weather in Pa?"),
        _assistant(None, _call("call_x", "get_weather", BAD_ARGUMENTS)),
        _tool("call_x", f"Invalid tool arguments: expected a JSON object, got {BAD_ARGUMENTS}"),
        _assistant("Sorry, which city?"),
    ),
    _conversation(
        _user("Think first"),
        _assistant("42", reasoning_content="Let me think about it carefully."),
    ),
    _conversation(_user("Stop oddly"), _assistant("Partial", finish_reason="weird_reason")),
]


class City(BaseModel):
    city: str
    units: str = "metric"


class Note(BaseModel):
    text: str


class Summary(BaseModel):
    summary: str


@dataclass
class Harness:
    """A replay server, a client, and the tools' calls as the handlers saw them."""

    server: ReplayServer
    client: Client
    wire: Wire
    calls: list[tuple[str, Any]] = field(default_factory=list)

    async def session(
        self, session: dict[str, Any] | None = None, **provider_options: Any
    ) -> tuple[Session, Recorder]:
        def weather(params: City) -> str:
            self.calls.append(("get_weather", params.model_dump()))
            suffix = "" if params.units == "metric" else f" ({params.units})"
            return f"sunny in {params.city}{suffix}"

        def note(params: Note) -> str:
            self.calls.append(("take_note", params.text))
            return "noted"

        tools = [
            define_tool("get_weather", description="The weather", handler=weather),
            define_tool("take_note", description="Remember text", handler=note),
            define_tool(
                "finish",
                description="End the task",
                params_type=Summary,
                is_terminal=True,
                handler=lambda params: "finished",
            ),
            clear_tool(),
        ]
        created = await self.client.create_session(
            provider=self.wire.provider(self.server, **provider_options),
            model="test-model",
            system_message=SYSTEM,
            developer_messages=[DEVELOPER],
            streaming=self.wire.stream,
            tools=tools,
            on_permission_request=PermissionHandler.approve_all,
            **(session or {}),
        )
        return created, Recorder(created)


@pytest.fixture(params=list(WIRES), ids=list(WIRES))
def wire(request: pytest.FixtureRequest) -> Wire:
    return WIRES[request.param]


@pytest.fixture
async def harness(wire: Wire) -> AsyncIterator[Harness]:
    async with (
        ReplayServer(CONVERSATIONS, match_system=True, chunk_size=4) as server,
        Client(store="memory") as client,
    ):
        yield Harness(server, client, wire)


def _reply_text(reply: Any) -> str:
    assert reply is not None
    return str(reply.data.content)


def _outcomes(rec: Recorder) -> list[str]:
    return [e.data.outcome for e in rec.of("tool.execution_complete")]


# --- replies ------------------------------------------------------------------------------


async def test_plain_reply_and_streamed_deltas(harness: Harness) -> None:
    session, rec = await harness.session()

    reply = await session.send_and_wait("Say hello")

    assert _reply_text(reply) == HELLO
    deltas = [e.data.delta_content for e in rec.of("assistant.message_delta")]
    if harness.wire.stream:
        assert len(deltas) > 1
        assert "".join(deltas) == HELLO
    else:
        assert deltas == []
    assert [bool(body.get("stream")) for body in harness.server.requests] == [harness.wire.stream]
    usage = rec.of("assistant.usage")[0].data
    assert usage.finish_reason == "stop"
    assert usage.input_tokens and usage.output_tokens
    assert rec.types[-1] == "session.idle"


async def test_one_tool_call(harness: Harness) -> None:
    session, rec = await harness.session()

    reply = await session.send_and_wait("Weather in Paris?")

    assert _reply_text(reply) == "It is sunny in Paris."
    assert harness.calls == [("get_weather", {"city": "Paris", "units": "metric"})]
    assert _outcomes(rec) == ["success"]
    assert rec.of("assistant.usage")[0].data.finish_reason == "tool_calls"
    assert len(harness.server.requests) == 2


async def test_parallel_tool_calls(harness: Harness) -> None:
    session, rec = await harness.session()

    reply = await session.send_and_wait("Weather in Paris and Rome?")

    assert _reply_text(reply) == "Sunny in both."
    first = rec.of("assistant.message")[0].data
    assert first.content == "Checking both."
    assert [r.name for r in first.tool_requests] == ["get_weather", "get_weather"]
    assert sorted(args["city"] for _, args in harness.calls) == ["Paris", "Rome"]
    assert _outcomes(rec) == ["success", "success"]


async def test_arguments_split_across_chunks_are_reassembled(harness: Harness) -> None:
    session, _ = await harness.session()

    reply = await session.send_and_wait("Take a note")

    # chunk_size=4 splits the arguments (escapes, emoji and all) across many stream events.
    assert _reply_text(reply) == "Noted."
    assert harness.calls == [("take_note", NOTE)]


async def test_terminal_tool_ends_the_run_without_a_second_request(harness: Harness) -> None:
    session, rec = await harness.session()

    reply = await session.send_and_wait("Finish now")

    assert reply is not None and reply.data.tool_requests is not None
    assert reply.data.tool_requests[0].name == "finish"
    assert _outcomes(rec) == ["success"]
    assert len(harness.server.requests) == 1
    assert rec.types.count("session.idle") == 1


async def test_clear_context_seeded_run_makes_exactly_two_requests(harness: Harness) -> None:
    session, rec = await harness.session()

    reply = await session.send_and_wait(ASK)

    assert _reply_text(reply) == "FRESH_CONTEXT"
    assert len(harness.server.requests) == 2
    second = harness.server.received[1]
    wire_format = format_for(second.path)
    assert wire_format is not None
    messages = wire_format.parse(second.body).messages
    # Chat Completions and Anthropic send the developer message as system text.
    assert [(m.role.replace("developer", "system"), m.content) for m in messages] == [
        ("system", SYSTEM),
        ("system", DEVELOPER),
        ("user", SEED),
    ]
    assert len(rec.of("session.context_cleared")) == 1
    assert rec.types.count("session.idle") == 1


async def test_invalid_json_arguments_get_a_second_chance(harness: Harness) -> None:
    session, rec = await harness.session()

    reply = await session.send_and_wait("Weather in Pa?")

    assert _outcomes(rec) == ["invalid_arguments"]
    assert harness.calls == []  # the handler never ran
    assert _reply_text(reply) == "Sorry, which city?"
    assert len(harness.server.requests) == 2


async def test_reasoning_is_kept_apart_from_the_reply(harness: Harness) -> None:
    session, rec = await harness.session()

    reply = await session.send_and_wait("Think first")

    assert _reply_text(reply) == "42"
    assert reply is not None and reply.data.reasoning_text == "Let me think about it carefully."
    deltas = "".join(e.data.delta_content for e in rec.of("assistant.message_delta"))
    assert deltas == ("42" if harness.wire.stream else "")


async def test_D12_reasoning_effort_is_sent_where_the_api_has_it(harness: Harness) -> None:
    sent: list[Any] = []
    for effort in ("high", None, "low"):
        options: Any = {"reasoning_effort": effort} if effort == "high" else {}
        session = await harness.client.create_session(
            provider=harness.wire.provider(harness.server),
            model="test-model",
            system_message=SYSTEM,
            developer_messages=[DEVELOPER],
            streaming=harness.wire.stream,
            **options,
        )
        if effort == "low":  # set on the open session: its next call asks for it
            await session.set_reasoning_effort("low")
        assert _reply_text(await session.send_and_wait("Say hello")) == HELLO
        body = harness.server.requests[-1]
        sent.append(
            body.get("reasoning_effort")
            if harness.wire.family == "chat"
            else body.get("reasoning")
            if harness.wire.family == "responses"
            else {key: body[key] for key in ("thinking", "output_config") if key in body}
        )
    if harness.wire.family == "chat":
        assert sent == ["high", None, "low"]
    elif harness.wire.family == "responses":
        assert sent == [{"effort": "high"}, None, {"effort": "low"}]
    else:  # Messages has a thinking budget, not an effort: nothing is sent (D12)
        assert sent == [{}, {}, {}]


PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(60)).decode()


async def test_D14_images_are_sent_as_the_wire_shows_them(harness: Harness) -> None:
    session, _ = await harness.session()
    image = Image(mime_type="image/png", data=PIXEL)
    attached = [{"type": "blob", "mimeType": "image/png", "byteLength": 68}]
    message_id = await session.send("Say hello", images=[image], attachments=attached)
    await session.wait_idle()
    [user] = [e for e in await session.get_events() if e.type == "user.message"]
    assert user.data.message_id == message_id and user.data.attachments == attached
    body = harness.server.requests[0]
    if harness.wire.family == "chat":
        [last] = [m for m in body["messages"] if m["role"] == "user"]
        assert last["content"] == [
            {"type": "text", "text": "Say hello"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
        ]
    elif harness.wire.family == "responses":
        [last] = [i for i in body["input"] if i.get("role") == "user"]
        assert last["content"] == [
            {"type": "input_text", "text": "Say hello"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PIXEL}"},
        ]
    else:
        [last] = [m for m in body["messages"] if m["role"] == "user"]
        assert last["content"] == [
            {"type": "text", "text": "Say hello"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": PIXEL},
            },
        ]


async def test_unknown_finish_reason_is_passed_on(harness: Harness) -> None:
    session, rec = await harness.session()

    reply = await session.send_and_wait("Stop oddly")

    assert _reply_text(reply) == "Partial"
    assert rec.of("assistant.usage")[0].data.finish_reason == "weird_reason"


# --- retries ------------------------------------------------------------------------------


async def test_rate_limit_is_retried_after_retry_after(harness: Harness) -> None:
    harness.server.fail_next(429, retry_after=0.05)
    session, _ = await harness.session(max_retries=1)

    reply = await session.send_and_wait("Say hello")

    assert _reply_text(reply) == HELLO
    first, second = harness.server.received
    # Waited as asked: not less, and not the client's own backoff (0.375 s or more).
    assert 0.05 <= second.at - first.at < 0.35


async def test_connection_reset_is_retried(harness: Harness) -> None:
    harness.server.reset_next()
    session, _ = await harness.session(max_retries=1)

    reply = await session.send_and_wait("Say hello")

    assert _reply_text(reply) == HELLO
    assert len(harness.server.requests) == 2


# --- failures -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """A failure to inject, the `session.error` it must end in, and the provider options."""

    inject: Callable[[ReplayServer, Wire], None]
    error_type: str
    status_code: int | None
    retryable: bool
    options: dict[str, Any] = field(default_factory=dict)
    requests: int = 1
    """Requests the failed run makes (retries included)."""
    session: dict[str, Any] = field(default_factory=dict)
    """Session options."""


FAILURES = {
    "rate-limit-exhausted": Failure(
        lambda s, w: s.fail_next(429, retry_after=0.01, times=2),
        "rate_limit",
        429,
        True,
        {"max_retries": 1},
        requests=2,
    ),
    "server-error": Failure(lambda s, w: s.fail_next(500), "provider_unavailable", 500, True),
    "overloaded": Failure(lambda s, w: s.fail_next(529), "provider_unavailable", 529, True),
    "unauthorized": Failure(lambda s, w: s.fail_next(401), "authentication", 401, False),
    # Ended at once as the `fail` policy says: by default a refusal as too long is retried
    # once after the window is made to fit (spec X2, tested in test_long_sessions).
    "context-length": Failure(
        lambda s, w: s.fail_next(400, message=w.context_length_message),
        "context_length",
        400,
        False,
        session={"context_overflow": "fail"},
    ),
    "connection-reset": Failure(
        lambda s, w: s.reset_next(times=2),
        "provider_unavailable",
        None,
        True,
        {"max_retries": 1},
        requests=2,
    ),
    "stream-cut": Failure(lambda s, w: s.cut_next(after=3), "provider_unavailable", None, True),
    "malformed": Failure(lambda s, w: s.malform_next(), "bad_response", None, False),
    # A proxy's page, or its error object, with a 200: not what was asked for (spec M2).
    "html-page": Failure(
        lambda s, w: s.fail_next(200, body="<html>Bad gateway</html>", content_type="text/html"),
        "bad_response",
        None,
        False,
        {"max_retries": 1},
    ),
    "error-object": Failure(
        lambda s, w: s.fail_next(200, body={"error": {"message": "Key revoked by the proxy."}}),
        "bad_response",
        None,
        False,
        {"max_retries": 1},
    ),
    # Streams stall after three events and hit stall_timeout; non-streamed answers (all or
    # nothing) stall before the body and hit the request timeout.
    "stall": Failure(
        lambda s, w: s.stall_next(10.0, after=3),
        "timeout",
        None,
        True,
        {"stall_timeout": 0.2, "timeout": 1.0},
    ),
}


@pytest.mark.parametrize("name", list(FAILURES))
async def test_failure_ends_in_a_typed_error_and_the_session_goes_on(
    harness: Harness, name: str
) -> None:
    failure = FAILURES[name]
    failure.inject(harness.server, harness.wire)
    session, rec = await harness.session(failure.session, **failure.options)
    started = time.monotonic()

    with pytest.raises(SessionError) as caught:
        await session.send_and_wait("Say hello")

    elapsed = time.monotonic() - started
    assert (caught.value.error_type, caught.value.status_code) == (
        failure.error_type,
        failure.status_code,
    )
    error = rec.of("session.error")[0].data
    assert (error.error_type, error.status_code, error.retryable) == (
        failure.error_type,
        failure.status_code,
        failure.retryable,
    )
    assert rec.types[rec.types.index("session.error") :] == ["session.error", "session.idle"]
    assert len(harness.server.requests) == failure.requests
    if name == "stall" and harness.wire.stream:
        assert elapsed < 0.8  # the stall timeout, not the request timeout, ended it
    events = await session.get_events()
    assert [e.data.content for e in events if e.type == "user.message"] == ["Say hello"]

    reply = await session.send_and_wait("Again please")

    assert _reply_text(reply) == "Hello again."
    assert rec.types.count("session.idle") == 2
