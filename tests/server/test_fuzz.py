"""Fuzzing the server: broken frames, wrong JSON-RPC shapes and garbage params.

Every input gets what JSON-RPC 2.0 prescribes (an error, an answer, or silence for a
notification), never an internal error; the connection survives everything but a broken
frame (which cannot be resynchronised), the server survives everything, and a session that
an official client drives on the same server meanwhile loses no event.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import socket
from typing import Any

from copilot import CopilotClient
from copilot.generated.session_events import AssistantMessageData
from copilot.session import PermissionHandler
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.server.conftest import StartServer, assistant, conversation, provider, user
from trimtab.protocol.framing import encode_frame
from trimtab.testing import ReplayServer

PARSE_ERROR, INVALID_REQUEST, INTERNAL_ERROR = -32700, -32600, -32603

METHODS = [
    "connect",
    "ping",
    "status.get",
    "auth.getStatus",
    "models.list",
    "runtime.shutdown",
    "session.create",
    "session.resume",
    "session.send",
    "session.sendAndWait",
    "session.abort",
    "session.detach",
    "session.destroy",
    "session.getMessages",
    "session.list",
    "session.getMetadata",
    "session.getLastId",
    "session.delete",
    "session.history.clearContext",
    "session.history.truncate",
    "session.history.compact",
    "session.tools.handlePendingToolCall",
    "session.permissions.handlePendingPermissionRequest",
    "$/cancelRequest",
    "no.such.method",
]
KEYS = ["sessionId", "prompt", "requestId", "result", "error", "tools", "token", "message"]
KEYS += ["eventId", "kind", "model", "systemMessage", "streaming", "hooks", "provider"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
# Never a provider object: a valid one would make the server call a model.
params = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), values, max_size=5).filter(
    lambda p: not isinstance(p.get("provider"), dict)
)
ids = (
    st.integers()
    | st.text(max_size=8)
    | st.none()
    | st.booleans()
    | st.floats()
    | st.lists(scalars, max_size=2)
)
shapes = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0"]) | scalars,
        "id": ids,
        "method": st.sampled_from(METHODS) | scalars,
        "params": values.filter(lambda v: not (isinstance(v, dict) and "provider" in v)),
        "result": values,
        "error": values,
    },
)
bodies = st.binary(max_size=48) | (shapes | scalars | st.lists(shapes, max_size=3)).map(
    lambda m: json.dumps(m).encode()
)
broken_headers = st.sampled_from(
    [
        b"Content-Length: abc\r\n\r\n",
        b"Content-Length: -5\r\n\r\n",
        b"Content-Length: 99999999999999\r\n\r\n",
        b"Content-Type: application/json\r\n\r\n{}",
    ]
) | st.binary(min_size=1, max_size=30).filter(
    lambda b: (
        b"\n" not in b
        and b.strip() != b""
        and b.split(b":")[0].strip().lower() != b"content-length"
    )
).map(lambda b: b + b"\r\n\r\n")
inputs = st.one_of(
    broken_headers.map(lambda b: ("broken", b)),
    bodies.map(lambda b: ("frame", b)),
    st.tuples(st.sampled_from(METHODS), params).map(lambda mp: ("call", mp)),
)


# --- the oracle: what JSON-RPC 2.0 says the answer must be ----------------------------------


def _valid_id(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or (isinstance(value, str | int) and not isinstance(value, bool))


def _answered(message: Any) -> bool:
    """A response or a well-formed notification gets no answer; anything else gets one."""
    if not isinstance(message, dict):
        return True
    if "method" not in message and ("result" in message or "error" in message):
        return False
    return not (
        "id" not in message
        and message.get("jsonrpc") == "2.0"
        and isinstance(message.get("method"), str)
        and isinstance(message.get("params", {}), dict | list)
    )


def expectation(body: bytes) -> tuple[str, Any]:
    """("single", id), ("batch", count) or ("none", None)."""
    try:
        message = json.loads(body, parse_constant=lambda name: 1 / 0)
    except (ValueError, ZeroDivisionError):
        return "single", None
    if isinstance(message, list):
        count = sum(_answered(m) for m in message)
        return ("single", None) if not message else ("batch", count) if count else ("none", None)
    if not _answered(message):
        return "none", None
    request_id = message.get("id") if isinstance(message, dict) else None
    return "single", request_id if _valid_id(request_id) else None


# --- a blocking JSON-RPC peer (the fuzz runs in a thread) -----------------------------------


class Peer:
    """Authenticated on every connection: the fuzz is of what a client may send, and a server
    closes a connection that presents no token in time (spec S10)."""

    def __init__(self, port: int, token: str | None) -> None:
        self.port = port
        self.token = token
        self.sentinels = itertools.count()
        self.connect()

    def connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=15)
        self.stream = self.sock.makefile("rb")
        if self.token is not None:
            body = {"jsonrpc": "2.0", "id": "auth", "method": "connect"}
            self.send(encode_frame(json.dumps({**body, "params": {"token": self.token}}).encode()))
            answer = self.read()
            assert answer is not None and "result" in answer, answer

    def reconnect(self) -> None:
        self.sock.close()
        self.connect()

    def read(self) -> Any:
        """The next frame but lifecycle notifications (sessions the fuzzed frames created,
        announced to every client, spec D8), as strictly as the official client reads it;
        None at the end."""
        while True:
            header = self.stream.readline()
            if not header:
                return None
            assert header.startswith(b"Content-Length: ") and header.endswith(b"\r\n"), header
            assert self.stream.readline() == b"\r\n"
            frame = json.loads(self.stream.read(int(header[16:])))
            if not (isinstance(frame, dict) and frame.get("method") == "session.lifecycle"):
                return frame

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def exchange(self, body: bytes) -> list[Any]:
        """Send a frame, then a ping; every answer that came before the ping's."""
        sentinel = f"sentinel-{next(self.sentinels)}"
        ping = {"jsonrpc": "2.0", "id": sentinel, "method": "ping", "params": {}}
        self.send(encode_frame(body) + encode_frame(json.dumps(ping).encode()))
        answers: list[Any] = []
        while (answer := self.read()) is not None:
            if isinstance(answer, dict) and answer.get("id") == sentinel:
                return answers
            answers.append(answer)
        raise AssertionError(f"the connection closed; answers so far: {answers}")


def check_answer(answer: Any, request_id: Any) -> None:
    assert isinstance(answer, dict) and answer["jsonrpc"] == "2.0", answer
    assert answer["id"] == request_id and type(answer["id"]) is type(request_id), answer
    assert ("result" in answer) != ("error" in answer), answer
    if "error" in answer:
        error = answer["error"]
        assert isinstance(error["code"], int) and isinstance(error["message"], str)
        assert error["code"] != INTERNAL_ERROR, error  # garbage in is never a server bug


def check_broken_frame(peer: Peer, data: bytes) -> None:
    peer.send(data)
    answer = peer.read()
    assert answer["error"]["code"] == PARSE_ERROR and answer["id"] is None
    assert peer.read() is None  # the stream cannot be resynchronised: closed
    peer.reconnect()


def check_frame(peer: Peer, body: bytes, expected: tuple[str, Any]) -> None:
    answers = peer.exchange(body)
    shape, detail = expected
    if shape == "none":
        assert answers == [], answers
        return
    if not answers:  # answered after the ping: wait for it
        answers = [peer.read()]
    assert len(answers) == 1, answers
    if shape == "batch":
        assert isinstance(answers[0], list) and len(answers[0]) == detail, answers
        for answer in answers[0]:
            check_answer(answer, answer.get("id"))
        return
    check_answer(answers[0], detail)
    if "error" in answers[0] and not _is_request(body):
        assert answers[0]["error"]["code"] in (PARSE_ERROR, INVALID_REQUEST)


def fuzz(port: int, token: str | None) -> int:
    """Run the examples against the server on `port`; returns how many ran."""
    peer = Peer(port, token)
    ids = itertools.count(1_000_000)
    seen = [0]

    @settings(
        max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(inputs)
    def one(case: tuple[str, Any]) -> None:
        seen[0] += 1
        kind, payload = case
        event(kind)
        if kind == "broken":
            check_broken_frame(peer, payload)
        elif kind == "call":
            method, call_params = payload
            request_id = next(ids)  # even `$/cancelRequest` is a request when it has an id
            message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": call_params}
            check_frame(peer, json.dumps(message).encode(), ("single", request_id))
        else:
            check_frame(peer, payload, expectation(payload))

    one()
    peer.sock.close()
    return seen[0]


def _is_request(body: bytes) -> bool:
    """A well-formed request, which may fail in any way a method can (not only -32600)."""
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(message, dict)
        and message.get("jsonrpc") == "2.0"
        and isinstance(message.get("method"), str)
    )


async def test_fuzz_frames_shapes_and_params(start_server: StartServer) -> None:
    # A model call can never leave the machine, whatever the fuzz manages to create.
    server = start_server(None, env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    turns = 40
    messages = [m for n in range(turns) for m in (user(f"Message {n}"), assistant(f"Reply {n}"))]
    async with ReplayServer([conversation(*messages)]) as model:
        client = CopilotClient(connection=server.connection())
        await client.start()
        session = await client.create_session(
            provider=provider(model),  # type: ignore[arg-type]
            on_permission_request=PermissionHandler.approve_all,
        )
        received: list[dict[str, Any]] = []
        session.on(lambda event: received.append(event.to_dict()))
        fuzzing = asyncio.create_task(asyncio.to_thread(fuzz, server.port, server.token))
        runs = 0
        while runs < turns and (not fuzzing.done() or runs < 3):
            reply = await session.send_and_wait(f"Message {runs}", timeout=30)
            assert reply is not None and isinstance(reply.data, AssistantMessageData)
            assert reply.data.content == f"Reply {runs}"
            runs += 1
        examples = await fuzzing
        logged = [event.to_dict() for event in await session.get_events()]
        await client.force_stop()
    assert examples >= 200 and server.process.poll() is None
    persisted = [e["id"] for e in received if not e.get("ephemeral")]
    assert persisted == [e["id"] for e in logged if e["type"] != "session.start"]
    assert sum(e["type"] == "session.idle" for e in received) == runs
