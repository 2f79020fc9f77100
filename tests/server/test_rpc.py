"""The JSON-RPC connection, in process over a socket pair: concurrency, ids, batches,
cancellation and error codes."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from trimtab.protocol.framing import encode_frame, read_frame
from trimtab.protocol.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    REQUEST_CANCELLED,
    TOO_MANY_REQUESTS,
    Connection,
    Params,
    RpcError,
)


class Raw:
    """The far end of a connection, speaking raw frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def send(self, message: Any) -> None:
        body = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.writer.write(encode_frame(body))

    async def receive(self) -> Any:
        body = await asyncio.wait_for(read_frame(self.reader), 5)
        return None if body is None else json.loads(body)


class Service:
    """A dispatcher with a method that waits, for concurrency checks."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.notifications: list[tuple[str, Params]] = []

    async def dispatch(self, method: str, params: Params) -> Any:
        match method:
            case "echo":
                return params
            case "wait":
                await self.released.wait()
                return "released"
            case "release":
                self.released.set()
                return "ok"
            case "unserialisable":
                return {"value": object()}
            case "boom":
                raise RuntimeError("kaput")
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")

    def notified(self, method: str, params: Params) -> None:
        self.notifications.append((method, params))


@pytest.fixture
async def wired() -> AsyncIterator[tuple[Connection, Raw, Service]]:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    conn = Connection(reader, writer, cancellable={"wait"})
    service = Service()
    task = asyncio.create_task(conn.run(service.dispatch, on_notification=service.notified))
    raw = Raw(*await asyncio.open_connection(sock=theirs))
    yield conn, raw, service
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raw.writer.close()


def request(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


async def test_c11_a_waiting_request_does_not_block_the_next(wired: Any) -> None:
    _, raw, _ = wired
    raw.send(request(1, "wait"))
    raw.send(request(2, "release"))
    answers = {a["id"]: a["result"] for a in [await raw.receive(), await raw.receive()]}
    assert answers == {1: "released", 2: "ok"}


@pytest.mark.parametrize("request_id", [0, "0", "", None, 1.5, 2**60])
async def test_ids_are_echoed_with_their_type(wired: Any, request_id: Any) -> None:
    _, raw, _ = wired
    raw.send(request(request_id, "echo", {"x": 1}))
    assert await raw.receive() == {"jsonrpc": "2.0", "id": request_id, "result": {"x": 1}}


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (b"{not json", PARSE_ERROR),
        (b"\xff\xfe", PARSE_ERROR),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "echo", "params": NaN}', PARSE_ERROR),
        ('{"jsonrpc": "2.0", "id": 1, "method": "echo"}'.encode("utf-16"), PARSE_ERROR),
        # Past a double's range: not read as infinity, which no JSON holds.
        (b'{"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"x": 1e400}}', PARSE_ERROR),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"x": -1E+999}}', PARSE_ERROR),
        (5, INVALID_REQUEST),
        ([], INVALID_REQUEST),
        ({"id": 1, "method": "echo"}, INVALID_REQUEST),  # no "jsonrpc"
        ({"jsonrpc": "1.0", "id": 1, "method": "echo"}, INVALID_REQUEST),
        ({"jsonrpc": "2.0", "id": 1, "method": 7}, INVALID_REQUEST),
        ({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": "x"}, INVALID_REQUEST),
        ({"jsonrpc": "2.0", "id": 1, "method": "nope"}, METHOD_NOT_FOUND),
        ({"jsonrpc": "2.0", "id": 1, "method": "boom"}, INTERNAL_ERROR),
        ({"jsonrpc": "2.0", "id": 1, "method": "unserialisable"}, INTERNAL_ERROR),
    ],
)
async def test_bad_messages_get_errors_and_the_connection_goes_on(
    wired: Any, message: Any, code: int
) -> None:
    _, raw, _ = wired
    raw.send(message)
    answer = await raw.receive()
    assert answer["error"]["code"] == code and answer["id"] in (None, 1)
    raw.send(request(2, "echo", {}))
    assert (await raw.receive())["id"] == 2


async def test_an_invalid_id_is_answered_with_null(wired: Any) -> None:
    _, raw, _ = wired
    raw.send({"jsonrpc": "2.0", "id": {"no": 1}, "method": "echo"})
    answer = await raw.receive()
    assert answer["id"] is None and answer["error"]["code"] == INVALID_REQUEST


async def test_a_broken_frame_is_answered_then_the_connection_closes(wired: Any) -> None:
    _, raw, _ = wired
    raw.writer.write(b"Content-Length: nope\r\n\r\n")
    answer = await raw.receive()
    assert answer["error"]["code"] == PARSE_ERROR and answer["id"] is None
    assert await raw.receive() is None


async def test_batches_answer_every_request_in_one_array(wired: Any) -> None:
    _, raw, service = wired
    raw.send(
        [
            request(1, "echo", {"a": 1}),
            {"jsonrpc": "2.0", "method": "note"},  # a notification: no answer
            {"jsonrpc": "2.0", "id": 3, "method": 3},
        ]
    )
    answers = await raw.receive()
    assert [a["id"] for a in answers] == [1, 3]
    assert answers[1]["error"]["code"] == INVALID_REQUEST


async def test_notifications_arrive_in_order(wired: Any) -> None:
    _, raw, service = wired
    for n in range(20):
        raw.send({"jsonrpc": "2.0", "method": "tick", "params": {"n": n}})
    raw.send(request(1, "echo", {}))
    await raw.receive()
    assert [p["n"] for _, p in service.notifications] == list(range(20))


async def test_frames_sent_past_the_transports_mark_arrive_whole_and_in_order(
    wired: Any,
) -> None:
    # Written straight to the transport while it takes more, queued behind once it is past
    # its high-water mark (the peer reads nothing meanwhile): ~2 MB, more than the socket's
    # buffer and the transport's together, so both ways are taken, in one go.
    # The peer then reads one at a time, with a frame sent after each: the transport takes
    # more again before the queue is written, and no frame may pass those waiting.
    conn, raw, _ = wired
    filler = "x" * 10_000
    for n in range(200):
        conn.notify("tick", {"n": n, "filler": filler})
    received = []
    for n in range(200, 400):
        received.append(await raw.receive())
        conn.notify("tick", {"n": n, "filler": filler})
    received += [await raw.receive() for _ in range(200)]
    assert [m["params"]["n"] for m in received] == list(range(400))
    assert all(m["params"]["filler"] == filler for m in received)


async def test_a_frame_never_passes_one_queued_before_it(wired: Any) -> None:
    # The first is queued (the transport takes nothing: its mark is 0); the mark is back up
    # before the writer's turn comes, and the second must still go behind the first.
    conn, raw, _ = wired
    transport = raw_transport(conn)
    transport.set_write_buffer_limits(high=0)
    conn.notify("tick", {"n": 1})
    transport.set_write_buffer_limits()
    conn.notify("tick", {"n": 2})
    assert [(await raw.receive())["params"]["n"] for _ in range(2)] == [1, 2]


def raw_transport(conn: Connection) -> asyncio.WriteTransport:
    transport = conn._writer.transport
    assert isinstance(transport, asyncio.WriteTransport)
    return transport


async def test_cancel_request_stops_a_cancellable_request(wired: Any) -> None:
    _, raw, _ = wired
    raw.send(request("w", "wait"))
    await asyncio.sleep(0.05)
    raw.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": "w"}})
    answer = await raw.receive()
    assert answer["id"] == "w" and answer["error"]["code"] == REQUEST_CANCELLED


async def test_requests_to_the_peer_use_integer_ids(wired: Any) -> None:
    conn, raw, _ = wired
    pending = asyncio.create_task(conn.request("hooks.invoke", {"x": 1}))
    sent = await raw.receive()
    assert sent["method"] == "hooks.invoke" and isinstance(sent["id"], int)
    raw.send({"jsonrpc": "2.0", "id": sent["id"], "result": {"output": {}}})
    assert await pending == {"output": {}}
    failing = asyncio.create_task(conn.request("x", {}))
    sent = await raw.receive()
    raw.send({"jsonrpc": "2.0", "id": sent["id"], "error": {"code": -5, "message": "no"}})
    with pytest.raises(RpcError, match="no"):
        await failing


async def test_a_request_timing_out_is_cancelled_at_the_peer(wired: Any) -> None:
    conn, raw, _ = wired
    with pytest.raises(TimeoutError):
        await conn.request("slow", {}, timeout=0.05)
    sent, cancel = await raw.receive(), await raw.receive()
    assert cancel == {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": sent["id"]}}


async def test_closing_fails_requests_still_waiting(wired: Any) -> None:
    conn, raw, _ = wired
    pending = asyncio.create_task(conn.request("never", {}))
    await raw.receive()
    raw.writer.close()
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(pending, 5)
    assert conn.closed


async def test_issue15_3_requests_beyond_the_limit_are_refused_not_queued() -> None:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    conn = Connection(reader, writer, max_requests=2)
    service = Service()
    task = asyncio.create_task(conn.run(service.dispatch))
    raw = Raw(*await asyncio.open_connection(sock=theirs))
    try:
        for request_id in (1, 2, 3):
            raw.send({"jsonrpc": "2.0", "id": request_id, "method": "wait"})
        refused = await raw.receive()
        assert refused["id"] == 3 and refused["error"]["code"] == TOO_MANY_REQUESTS
        batch = [{"jsonrpc": "2.0", "id": n, "method": "echo"} for n in (4, 5, 6)]
        raw.send(batch)
        assert (await raw.receive())["error"]["code"] == TOO_MANY_REQUESTS
        raw.send({"jsonrpc": "2.0", "id": 7, "method": "release"})  # still refused: 2 wait
        assert (await raw.receive())["error"]["code"] == TOO_MANY_REQUESTS
        service.released.set()
        answers = {(await raw.receive())["id"] for _ in range(2)}
        assert answers == {1, 2}
        raw.send({"jsonrpc": "2.0", "id": 8, "method": "echo", "params": {"x": 1}})
        assert (await raw.receive()) == {"jsonrpc": "2.0", "id": 8, "result": {"x": 1}}
        # A batch's requests count one by one: one waiting and a batch of two are three.
        service.released.clear()
        raw.send({"jsonrpc": "2.0", "id": 9, "method": "wait"})
        raw.send([{"jsonrpc": "2.0", "id": n, "method": "wait"} for n in (10, 11)])
        assert (await raw.receive())["error"]["code"] == TOO_MANY_REQUESTS
        raw.send([{"jsonrpc": "2.0", "id": 12, "method": "wait"}])  # two now: the limit
        raw.send({"jsonrpc": "2.0", "id": 13, "method": "echo"})
        assert (await raw.receive())["error"]["code"] == TOO_MANY_REQUESTS
        service.released.set()
        released = [await raw.receive() for _ in range(2)]
        expected = [
            {"jsonrpc": "2.0", "id": 9, "result": "released"},
            [{"jsonrpc": "2.0", "id": 12, "result": "released"}],
        ]
        assert sorted(map(str, released)) == sorted(map(str, expected))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raw.writer.close()
