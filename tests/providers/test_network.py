"""The Chat Completions client's connections (`providers/_network.py`): asyncio transports
under httpcore2, over HTTP and HTTPS, against real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpcore2
import pytest
import trustme

from tests.fake_model import FakeModel, LocalServer
from trimtab._errors import ProviderError
from trimtab.events import Message
from trimtab.providers import _network as network
from trimtab.providers._base import ModelRequest, ModelResponse, TextDelta
from trimtab.providers._config import ProviderConfig
from trimtab.providers.openai import OpenAIProvider


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The connections `AsyncioBackend` opens, as (host, port)."""
    opened: list[tuple[str, int]] = []
    connect = network.AsyncioBackend.connect_tcp

    async def counted(self: network.AsyncioBackend, host: str, port: int, **options: Any) -> Any:
        opened.append((host, port))
        return await connect(self, host, port, **options)

    monkeypatch.setattr(network.AsyncioBackend, "connect_tcp", counted)
    return opened


@pytest.fixture
def authority(tmp_path: Path) -> tuple[trustme.CA, Path]:
    """A certificate authority, and its certificate in a PEM file."""
    ca = trustme.CA()
    pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    return ca, pem


def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


async def answer(base_url: str, *, stream: bool, **config: Any) -> list[Any]:
    provider = OpenAIProvider(
        ProviderConfig(type="openai", base_url=base_url, api_key="k", max_retries=0, **config)
    )
    request = ModelRequest(model="m", messages=(Message(role="user", content="hi"),), stream=stream)
    try:
        return [event async for event in provider.stream(request)]
    finally:
        await provider.aclose()


@pytest.mark.parametrize("stream", [False, True])
async def test_https_answers_come_over_asyncio_connections(
    stream: bool,
    authority: tuple[trustme.CA, Path],
    connects: list[tuple[str, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ca, pem = authority
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))  # what a private CA's users set
    async with FakeModel(reply="over TLS", tls=server_tls(ca)) as model:
        events = await answer(model.base_url, stream=stream)

    response = events[-1]
    assert isinstance(response, ModelResponse)
    assert response.content == "over TLS"
    if stream:
        assert [e.text for e in events if isinstance(e, TextDelta)] == ["over TLS"]
    assert connects and all(host == "127.0.0.1" for host, _ in connects)


async def test_an_untrusted_certificate_fails_as_unavailable(
    authority: tuple[trustme.CA, Path], connects: list[tuple[str, int]]
) -> None:
    ca, _ = authority  # not trusted: SSL_CERT_FILE is not set
    async with FakeModel(tls=server_tls(ca)) as model:
        with pytest.raises(ProviderError) as caught:
            await answer(model.base_url, stream=False)

    assert caught.value.error_type == "provider_unavailable"
    assert "certificate" in caught.value.message.lower()
    assert connects


async def test_a_large_answer_arrives_whole(connects: list[tuple[str, int]]) -> None:
    text = "0123456789" * 100_000  # 1 MB: the read buffer fills and drains several times
    async with FakeModel(reply=text) as model:
        events = await answer(model.base_url, stream=False)

    response = events[-1]
    assert isinstance(response, ModelResponse)
    assert response.content == text


class _ClosesAfterOne(FakeModel):
    """Answers one request per connection, then closes it without saying so (a server's
    keep-alive timeout): the client only learns it from the socket."""

    def __init__(self) -> None:
        super().__init__(reply="fresh")
        self.connections = 0

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.connections += 1
        await self._answer_one(reader, writer)


async def test_a_connection_the_server_closed_is_not_reused() -> None:
    async with _ClosesAfterOne() as model:
        provider = OpenAIProvider(
            ProviderConfig(type="openai", base_url=model.base_url, api_key="k", max_retries=0)
        )
        request = ModelRequest(model="m", messages=(Message(role="user", content="hi"),))
        try:
            for _ in range(3):
                events = [event async for event in provider.stream(request)]
                assert isinstance(events[-1], ModelResponse)
                assert events[-1].content == "fresh"
                await asyncio.sleep(0.1)  # the server's close reaches the client
        finally:
            await provider.aclose()

    assert model.connections == 3


class _Flood(LocalServer):
    """Writes `size` bytes as soon as a client connects."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(bytes(range(256)) * (self.size // 256))
        await writer.drain()
        await reader.read()  # until the client closes


@pytest.fixture
async def flood() -> AsyncIterator[_Flood]:
    async with _Flood(4 * 1024 * 1024) as server:
        yield server


async def test_a_connection_buffers_a_bounded_amount_unread(flood: _Flood) -> None:
    stream = await network.AsyncioBackend().connect_tcp("127.0.0.1", flood.port, timeout=5)
    assert isinstance(stream, network.AsyncioStream)
    try:
        async with asyncio.timeout(10):
            # Polled: the stream has no event for "bytes buffered", nor should it.
            while stream.buffered <= network.READ_BUFFER_LIMIT:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # what else the server could write has arrived
        # Reading stopped at the limit (one read more at most); the rest waits in the
        # kernel's buffers.
        assert stream.buffered <= network.READ_BUFFER_LIMIT + 256 * 1024
        received = bytearray()
        while len(received) < flood.size:
            chunk = await stream.read(65_536, timeout=5)
            assert chunk, "the connection ended early"
            received += chunk
        assert bytes(received) == bytes(range(256)) * (flood.size // 256)
    finally:
        await stream.aclose()


class _Deaf(LocalServer):
    """Accepts connections, and neither reads nor writes."""

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await asyncio.sleep(60)


async def test_a_read_that_gets_nothing_times_out() -> None:
    async with _Deaf() as silent:
        stream = await network.AsyncioBackend().connect_tcp("127.0.0.1", silent.port, timeout=5)
        try:
            with pytest.raises(httpcore2.ReadTimeout):
                await stream.read(1024, timeout=0.1)
        finally:
            await stream.aclose()


async def test_a_refused_connection_is_a_connect_error() -> None:
    async with _Deaf() as closed:
        port = closed.port
    with pytest.raises(httpcore2.ConnectError):
        await network.AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)


async def test_a_write_the_peer_does_not_take_times_out() -> None:
    async with _Deaf() as deaf:
        stream = await network.AsyncioBackend().connect_tcp("127.0.0.1", deaf.port, timeout=5)
        try:
            with pytest.raises(httpcore2.WriteTimeout):
                # More than the kernel's buffers on both ends take: the rest waits here.
                await stream.write(bytes(64 * 1024 * 1024), timeout=0.2)
        finally:
            await stream.aclose()


async def test_a_tls_handshake_nobody_answers_times_out() -> None:
    async with _Deaf() as deaf:
        stream = await network.AsyncioBackend().connect_tcp("127.0.0.1", deaf.port, timeout=5)
        with pytest.raises(httpcore2.ConnectTimeout):
            await stream.start_tls(
                ssl.create_default_context(), server_hostname="127.0.0.1", timeout=0.2
            )
