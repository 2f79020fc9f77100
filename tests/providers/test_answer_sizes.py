"""A model server's answer cannot fill the process's memory (spec M3: every buffer has a limit).

Every provider reads an answer's body under one bound (`trimtab.providers._bodies`): a server
(or a proxy) that sends without end, an unstreamed answer, an error's body, an event stream
whose events keep coming or one line that never ends, gets a typed error once the limit is
passed, and the connection is closed, instead of the process buffering for as long as the
deadline lets it. The stall timeout cannot catch these: bytes keep arriving.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
import zlib
from collections.abc import Iterator

import pytest

from tests.fake_model import LocalServer
from trimtab._errors import ProviderError
from trimtab.providers import Message, ModelRequest, ProviderConfig, make_provider
from trimtab.providers._bodies import ERROR_BODY_LIMIT, MAX_ANSWER_BYTES, MAX_EVENT_BYTES

CHUNK = b"x" * 65536
DELTA = "y" * 60_000  # large deltas: the limit is reached in ~1,100 events


def _event(provider: str) -> bytes:
    """One text delta of `provider`'s event stream."""
    if provider == "anthropic":
        data = {"type": "content_block_delta", "index": 0}
        data["delta"] = {"type": "text_delta", "text": DELTA}
        return b"event: content_block_delta\ndata: " + json.dumps(data).encode() + b"\n\n"
    if provider == "responses":
        data = {"type": "response.output_text.delta", "item_id": "i", "output_index": 0}
        data |= {"content_index": 0, "delta": DELTA, "sequence_number": 1, "logprobs": []}
        return b"event: response.output_text.delta\ndata: " + json.dumps(data).encode() + b"\n\n"
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunk["choices"] = [{"index": 0, "delta": {"content": DELTA}, "finish_reason": None}]
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


_ANTHROPIC_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":"message",'
    b'"role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,'
    b'"usage":{"input_tokens":1,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)


class EndlessServer(LocalServer):
    """Answers every request with `status` and a chunked body that never ends, of `shape`:
    JSON text (`json`), an event stream's events (`events`), or one endless line (`line`)."""

    def __init__(self, provider: str, status: int, shape: str) -> None:
        super().__init__()
        self.provider, self.status, self.shape = provider, status, shape
        self.sent = 0

    def _pieces(self) -> Iterator[bytes]:
        if self.shape == "json":
            yield b'{"id": "'
            while True:
                yield CHUNK
        yield b"data: " if self.shape == "line" else b""
        if self.provider == "anthropic" and self.shape == "events":
            yield _ANTHROPIC_START
        piece = CHUNK if self.shape == "line" else _event(self.provider)
        while True:
            yield piece

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        kind = "application/json" if self.shape == "json" else "text/event-stream"
        writer.write(
            f"HTTP/1.1 {self.status} X\r\nContent-Type: {kind}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        try:
            for piece in self._pieces():
                if piece:
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.sent += len(piece)
                    await writer.drain()
        except (ConnectionError, OSError):
            pass  # the client closed the connection: what is tested


PROVIDERS = ["openai", "responses", "anthropic"]


async def _answer(server: LocalServer, provider: str, *, stream: bool) -> tuple[ProviderError, int]:
    """The error a `provider` call against `server` ends with, and its peak traced memory."""
    config: dict[str, object] = {"api_key": "k", "timeout": 60, "max_retries": 0}
    if provider == "anthropic":
        config |= {"type": "anthropic", "base_url": server.root_url}
    else:
        config |= {"type": "openai", "base_url": f"{server.root_url}/v1"}
        config["wire_api"] = "responses" if provider == "responses" else "completions"
    model = make_provider(ProviderConfig.model_validate(config))
    request = ModelRequest(model="m", messages=(Message(role="user", content="hi"),), stream=stream)
    tracemalloc.start()
    try:
        with pytest.raises(ProviderError) as caught:
            async with asyncio.timeout(60):
                async for _ in model.stream(request):
                    pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await model.aclose()
    return caught.value, peak


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_m3_an_endless_unstreamed_answer_is_a_bad_response_past_the_limit(
    provider: str,
) -> None:
    async with EndlessServer(provider, 200, "json") as server:
        error, peak = await _answer(server, provider, stream=False)
    assert error.error_type == "bad_response"
    assert f"larger than {MAX_ANSWER_BYTES} bytes" in error.message
    assert peak < 3 * MAX_ANSWER_BYTES


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
async def test_m3_only_the_start_of_an_endless_error_is_read(provider: str, stream: bool) -> None:
    async with EndlessServer(provider, 400, "json") as server:
        error, peak = await _answer(server, provider, stream=stream)
        sent = server.sent
    assert error.error_type == "bad_request"
    assert error.status_code == 400
    assert sent < MAX_ANSWER_BYTES // 4  # the client stopped reading at the error's limit
    assert peak < 16 * ERROR_BODY_LIMIT + 4 * 1024 * 1024


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_m3_a_stream_whose_events_never_end_is_a_bad_response_past_the_limit(
    provider: str,
) -> None:
    async with EndlessServer(provider, 200, "events") as server:
        error, peak = await _answer(server, provider, stream=True)
    assert error.error_type == "bad_response"
    assert f"larger than {MAX_ANSWER_BYTES} bytes" in error.message
    assert peak < 3 * MAX_ANSWER_BYTES


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_m3_an_endless_line_of_a_stream_is_a_bad_response_past_the_event_limit(
    provider: str,
) -> None:
    async with EndlessServer(provider, 200, "line") as server:
        error, peak = await _answer(server, provider, stream=True)
        sent = server.sent
    assert error.error_type == "bad_response"
    assert f"longer than {MAX_EVENT_BYTES} bytes" in error.message
    assert sent < 4 * MAX_EVENT_BYTES
    assert peak < 6 * MAX_EVENT_BYTES


class CompressedServer(LocalServer):
    """Answers with `body`, compressed with each of `codings` in turn (a bomb: a few KiB on
    the wire that inflate to far more than any limit)."""

    def __init__(self, body: bytes, codings: tuple[str, ...], status: int = 200) -> None:
        super().__init__()
        self.codings, self.status = codings, status
        for coding in codings:
            level = zlib.compressobj(9, zlib.DEFLATED, 31 if coding == "gzip" else 15)
            body = level.compress(body) + level.flush()
        self.body = body

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            f"HTTP/1.1 {self.status} X\r\nContent-Type: application/json\r\n"
            f"Content-Encoding: {', '.join(self.codings)}\r\n"
            f"Content-Length: {len(self.body)}\r\n\r\n".encode()
        )
        writer.write(self.body)
        await writer.drain()
        await reader.read()


def _completion(content: str) -> bytes:
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return json.dumps({"id": "c", "object": "chat.completion", "choices": [choice]}).encode()


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("codings", [("gzip",), ("gzip", "gzip"), ("deflate",)])
async def test_m3_a_compressed_answer_is_bounded_as_it_inflates(
    provider: str, codings: tuple[str, ...]
) -> None:
    bomb = b'{"id": "' + b"A" * (2 * MAX_ANSWER_BYTES) + b'"}'
    async with CompressedServer(bomb, codings) as server:
        error, peak = await _answer(server, provider, stream=False)
    assert error.error_type == "bad_response"
    assert peak < 3 * MAX_ANSWER_BYTES


@pytest.mark.parametrize("codings", [("gzip",), ("deflate",), ("gzip", "deflate")])
async def test_m3_a_compressed_answer_within_the_limits_is_read(codings: tuple[str, ...]) -> None:
    async with CompressedServer(_completion("fine, compressed"), codings) as server:
        config = {"type": "openai", "base_url": f"{server.root_url}/v1", "api_key": "k"}
        model = make_provider(ProviderConfig.model_validate(config))
        request = ModelRequest(model="m", messages=(Message(role="user", content="hi"),))
        events = [event async for event in model.stream(request)]
        await model.aclose()
    assert events[-1].kind == "response" and events[-1].content == "fine, compressed"
