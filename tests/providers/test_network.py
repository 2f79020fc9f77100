"""The HTTP stack every provider shares (`providers/_http.py`): httpx2's own transport over
HTTP and HTTPS, the environment's proxies, HTTP/2 where `h2` is installed, against real
servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trustme

from tests.fake_model import FakeModel, LocalServer
from trimtab._errors import ProviderError
from trimtab.events import Message
from trimtab.providers import Provider, ProviderConfig, _common, make_provider
from trimtab.providers._base import ModelRequest, ModelResponse, TextDelta
from trimtab.providers.openai import OpenAIProvider
from trimtab.testing import Conversation, ConversationMessage, ReplayServer


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


def _request(stream: bool = False) -> ModelRequest:
    return ModelRequest(model="m", messages=(Message(role="user", content="hi"),), stream=stream)


async def answer(base_url: str, *, stream: bool, **config: Any) -> list[Any]:
    provider = OpenAIProvider(
        ProviderConfig(type="openai", base_url=base_url, api_key="k", max_retries=0, **config)
    )
    try:
        return [event async for event in provider.stream(_request(stream))]
    finally:
        await provider.aclose()


async def failure(base_url: str, **config: Any) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        async with asyncio.timeout(30):
            await answer(base_url, stream=False, **config)
    return caught.value


class _Counting(FakeModel):
    """Counts the connections made to it."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.connections = 0

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.connections += 1
        await super().serve_connection(reader, writer)


@pytest.mark.parametrize("stream", [False, True])
async def test_https_answers_come_through_the_stock_transport(
    stream: bool, authority: tuple[trustme.CA, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, pem = authority
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))  # what a private CA's users set
    async with _Counting(reply="over TLS", tls=server_tls(ca)) as model:
        events = await answer(model.base_url, stream=stream)

    response = events[-1]
    assert isinstance(response, ModelResponse)
    assert response.content == "over TLS"
    if stream:
        assert [e.text for e in events if isinstance(e, TextDelta)] == ["over TLS"]
    assert model.connections == 1 and len(model.requests) == 1


async def test_an_untrusted_certificate_fails_as_unavailable(
    authority: tuple[trustme.CA, Path],
) -> None:
    ca, _ = authority  # not trusted: SSL_CERT_FILE does not name it
    async with FakeModel(tls=server_tls(ca)) as model:
        error = await failure(model.base_url)

    assert error.error_type == "provider_unavailable"
    assert "certificate" in error.message.lower()


async def test_a_large_answer_arrives_whole() -> None:
    text = "0123456789" * 100_000  # 1 MB
    async with FakeModel(reply=text) as model:
        events = await answer(model.base_url, stream=False)

    response = events[-1]
    assert isinstance(response, ModelResponse)
    assert response.content == text


async def test_a_connection_is_reused_for_the_next_request() -> None:
    async with _Counting(reply="again") as model:
        provider = OpenAIProvider(
            ProviderConfig(type="openai", base_url=model.base_url, api_key="k", max_retries=0)
        )
        try:
            for _ in range(3):
                events = [event async for event in provider.stream(_request())]
                assert isinstance(events[-1], ModelResponse)
        finally:
            await provider.aclose()

    assert model.connections == 1 and len(model.requests) == 3


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
        try:
            for _ in range(3):
                events = [event async for event in provider.stream(_request())]
                assert isinstance(events[-1], ModelResponse)
                assert events[-1].content == "fresh"
                await asyncio.sleep(0.1)  # the server's close reaches the client
        finally:
            await provider.aclose()

    assert model.connections == 3


class _Truncates(LocalServer):
    """Promises 10 bytes and closes after 2."""

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab")
        await writer.drain()
        writer.close()


async def test_an_answer_cut_short_is_unavailable() -> None:
    async with _Truncates() as server:
        error = await failure(f"{server.root_url}/v1")

    assert (error.error_type, error.retryable) == ("provider_unavailable", True)


class _EndlessHead(LocalServer):
    """Answers with a head that never ends (one header line after another)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for n in range(100_000):
            line = b"X-Filler-%d: %s\r\n" % (n, b"x" * 100)
            writer.write(line)
            self.sent += len(line)
            await writer.drain()


async def test_a_head_that_never_ends_is_refused_not_buffered() -> None:
    async with _EndlessHead() as server:
        error = await failure(f"{server.root_url}/v1")
        sent = server.sent

    assert error.error_type == "provider_unavailable"
    assert sent < 8 * 1024 * 1024  # refused at the HTTP parser's bound, not read on


class _Deaf(LocalServer):
    """Accepts connections, and neither reads nor writes."""

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await asyncio.sleep(60)


async def test_m1_a_tls_handshake_nobody_answers_ends_at_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_common, "CONNECT_TIMEOUT", 0.3)
    async with _Deaf() as deaf:
        loop = asyncio.get_running_loop()
        started = loop.time()
        error = await failure(f"https://127.0.0.1:{deaf.port}/v1", timeout=30)
        elapsed = loop.time() - started

    assert (error.error_type, error.retryable) == ("timeout", True)
    assert elapsed < 5


# --- the environment's proxies --------------------------------------------------------------


class ForwardProxy(LocalServer):
    """An HTTP proxy: `CONNECT host:port` tunnels, and a request for an absolute URL is sent
    on to its origin. Records each request line it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[str] = []

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        line, *rest = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, target, _ = line.split(" ")
        self.requests.append(f"{method} {target}")
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            upstream, upstream_writer = await asyncio.open_connection(host, int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            url = urlsplit(target)
            assert url.hostname is not None and url.port is not None
            upstream, upstream_writer = await asyncio.open_connection(url.hostname, url.port)
            path = url.path + (f"?{url.query}" if url.query else "")
            head = "\r\n".join([f"{method} {path} HTTP/1.1", *rest])
            upstream_writer.write(head.encode("latin-1"))
        await asyncio.gather(
            _pipe(reader, upstream_writer), _pipe(upstream, writer), return_exceptions=True
        )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


@pytest.fixture
async def proxy(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ForwardProxy]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        for variable in (name, name.lower()):
            monkeypatch.delenv(variable, raising=False)
    async with ForwardProxy() as server:
        yield server


HELLO = Conversation(
    messages=[
        ConversationMessage(role="user", content="hi"),
        ConversationMessage(role="assistant", content="through the proxy"),
    ]
)


def _provider(family: str, server: ReplayServer) -> Provider:
    config: dict[str, Any] = {"api_key": "k", "max_retries": 0}
    if family == "anthropic":
        config |= {"type": "anthropic", "base_url": server.root_url}
    else:
        wire_api = "responses" if family == "responses" else "completions"
        config |= {"type": "openai", "base_url": server.base_url, "wire_api": wire_api}
    return make_provider(ProviderConfig.model_validate(config))


async def _reply(provider: Provider) -> str:
    try:
        events = [event async for event in provider.stream(_request())]
    finally:
        await provider.aclose()
    response = events[-1]
    assert isinstance(response, ModelResponse)
    return response.content


@pytest.mark.parametrize("family", ["chat", "responses", "anthropic"])
async def test_s1_http_proxy_of_the_environment_carries_every_providers_requests(
    proxy: ForwardProxy, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.root_url)
    async with ReplayServer([HELLO]) as server:
        assert await _reply(_provider(family, server)) == "through the proxy"
        root = server.root_url

    assert len(server.received) == 1
    assert proxy.requests == [f"POST {root}{server.received[0].path}"]


async def test_s1_https_proxy_of_the_environment_tunnels_to_the_endpoint(
    proxy: ForwardProxy,
    authority: tuple[trustme.CA, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ca, pem = authority
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))
    monkeypatch.setenv("HTTPS_PROXY", proxy.root_url)
    async with FakeModel(reply="tunnelled", tls=server_tls(ca)) as model:
        events = await answer(model.base_url, stream=True)
        port = model.port

    assert isinstance(events[-1], ModelResponse) and events[-1].content == "tunnelled"
    assert proxy.requests == [f"CONNECT 127.0.0.1:{port}"]


async def test_s1_no_proxy_of_the_environment_goes_around_the_proxy(
    proxy: ForwardProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.root_url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    async with ReplayServer([HELLO]) as server:
        assert await _reply(_provider("chat", server)) == "through the proxy"

    assert len(server.received) == 1 and proxy.requests == []


# --- HTTP/2 ---------------------------------------------------------------------------------


CompletionApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def _completion_app(versions: list[str]) -> CompletionApp:
    """An ASGI app answering every request with a chat completion; records each request's
    HTTP version."""

    async def app(
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            return
        versions.append(scope["http_version"])
        while (await receive()).get("more_body"):
            pass
        message = {"role": "assistant", "content": f"HTTP/{scope['http_version']}"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        body = json.dumps({"id": "c", "choices": [choice]}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


async def test_http2_is_spoken_to_an_https_endpoint_when_h2_is_installed(
    authority: tuple[trustme.CA, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("h2")
    pytest.importorskip("hypercorn")
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    ca, pem = authority
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))
    certificate = ca.issue_cert("127.0.0.1")
    certificate.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    certificate.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{listening.detach()}"]  # the server's to close
    config.certfile, config.keyfile = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    config.accesslog = config.errorlog = None
    versions: list[str] = []
    stop = asyncio.Event()
    app: Any = _completion_app(versions)  # (hypercorn types each ASGI event; dicts here)
    server = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))
    try:
        events = await answer(f"https://127.0.0.1:{port}/v1", stream=False)
    finally:
        stop.set()
        await asyncio.wait_for(server, 10)

    assert versions == ["2"]
    assert isinstance(events[-1], ModelResponse) and events[-1].content == "HTTP/2"
