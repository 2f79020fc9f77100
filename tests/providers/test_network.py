"""The HTTP stack every provider shares (`providers/_http.py`), against real servers on
127.0.0.1: its own HTTP/1.1 pool (`providers/_http11.py`) on asyncio connections
(`providers/_network.py`) over HTTP and HTTPS, and httpx2's transport where the environment
names a proxy or HTTP/2 applies."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
import trustme

from tests.fake_model import FakeModel, LocalServer
from tests.providers.test_redirects import Redirecting
from tests.requirements import require_import
from trimtab._errors import ProviderError
from trimtab.events import Message
from trimtab.providers import Provider, ProviderConfig, _common, _http, make_provider
from trimtab.providers import _network as network
from trimtab.providers._base import ModelRequest, ModelResponse, TextDelta
from trimtab.providers._http11 import Transport
from trimtab.providers.openai import OpenAIProvider
from trimtab.testing import Conversation, ConversationMessage, ReplayServer


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The connections `network.connect` opens, as (host, port)."""
    opened: list[tuple[str, int]] = []
    connect = network.connect

    async def counted(host: str, port: int, *args: Any) -> Any:
        opened.append((host, port))
        return await connect(host, port, *args)

    monkeypatch.setattr(network, "connect", counted)
    return opened


@pytest.fixture
def http11(monkeypatch: pytest.MonkeyPatch) -> None:
    """As without the `http2` extra: HTTPS goes through the providers' own HTTP/1.1 pool."""
    monkeypatch.setattr(_http, "h2_installed", lambda: False)


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


async def failure(base_url: str, **config: Any) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        async with asyncio.timeout(30):
            await answer(base_url, stream=False, **config)
    return caught.value


async def answer(base_url: str, *, stream: bool, **config: Any) -> list[Any]:
    provider = OpenAIProvider(
        ProviderConfig(type="openai", base_url=base_url, api_key="k", max_retries=0, **config)
    )
    try:
        return [event async for event in provider.stream(_request(stream))]
    finally:
        await provider.aclose()


@pytest.mark.parametrize("stream", [False, True])
async def test_https_answers_come_over_asyncio_connections(
    stream: bool,
    authority: tuple[trustme.CA, Path],
    connects: list[tuple[str, int]],
    monkeypatch: pytest.MonkeyPatch,
    http11: None,
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
    authority: tuple[trustme.CA, Path], connects: list[tuple[str, int]], http11: None
) -> None:
    ca, _ = authority  # not trusted: SSL_CERT_FILE is not set
    async with FakeModel(tls=server_tls(ca)) as model:
        with pytest.raises(ProviderError) as caught:
            await answer(model.base_url, stream=False)

    assert caught.value.error_type == "provider_unavailable"
    assert "certificate" in caught.value.message.lower()
    assert connects


async def test_a_plain_http_endpoint_trusts_no_certificate_it_is_redirected_to(
    authority: tuple[trustme.CA, Path], monkeypatch: pytest.MonkeyPatch, http11: None
) -> None:
    """A local model's http:// endpoint has no certificate store: HTTPS a redirect leads to
    fails verification, even for a certificate the environment trusts."""
    ca, pem = authority
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))  # an https:// endpoint would trust it
    async with FakeModel(reply="over TLS", tls=server_tls(ca)) as secure:
        async with Redirecting(secure.root_url) as plain:
            error = await failure(f"{plain.root_url}/v1")

    assert error.error_type == "provider_unavailable"
    assert "certificate" in error.message.lower()
    assert not secure.requests  # nothing reached the HTTPS server


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
    stream = await network.connect("127.0.0.1", flood.port, timeout=5)
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
        stream.close()


class _Deaf(LocalServer):
    """Accepts connections, and neither reads nor writes."""

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await asyncio.sleep(60)


async def test_a_read_that_gets_nothing_times_out() -> None:
    async with _Deaf() as silent:
        stream = await network.connect("127.0.0.1", silent.port, timeout=5)
        try:
            with pytest.raises(httpx2.ReadTimeout):
                await stream.read(1024, timeout=0.1)
        finally:
            stream.close()


async def test_a_refused_connection_is_a_connect_error() -> None:
    async with _Deaf() as closed:
        port = closed.port
    with pytest.raises(httpx2.ConnectError):
        await network.connect("127.0.0.1", port, timeout=5)


async def test_a_write_the_peer_does_not_take_times_out() -> None:
    async with _Deaf() as deaf:
        stream = await network.connect("127.0.0.1", deaf.port, timeout=5)
        try:
            with pytest.raises(httpx2.WriteTimeout):
                # More than the kernel's buffers on both ends take: the rest waits here.
                await stream.write(bytes(64 * 1024 * 1024), timeout=0.2)
        finally:
            stream.close()


async def test_a_tls_handshake_nobody_answers_times_out() -> None:
    async with _Deaf() as deaf:
        stream = await network.connect("127.0.0.1", deaf.port, timeout=5)
        with pytest.raises(httpx2.ConnectTimeout):
            await stream.start_tls(
                ssl.create_default_context(), server_hostname="127.0.0.1", timeout=0.2
            )


class _Plain(LocalServer):
    """Answers every request on a connection with `body` (keep-alive), and counts the
    connections; `hold` keeps each answer's end back until it is set."""

    def __init__(self, body: bytes = b"ok", *, close: bool = False) -> None:
        super().__init__()
        self.body = body
        self.close = close
        self.connections = 0
        self.hold: asyncio.Event | None = None

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.connections += 1
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")  # (GETs: no body)
            except asyncio.IncompleteReadError:
                return
            closing = b"Connection: close\r\n" if self.close else b""
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(self.body), closing)
                + self.body[:1]
            )
            if self.hold is not None:
                await self.hold.wait()
            writer.write(self.body[1:])
            await writer.drain()
            if self.close:
                writer.close()
                return


def _client(**limits: Any) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=Transport(verify=True, limits=httpx2.Limits(**limits)))


async def test_a_connection_is_reused_for_the_next_request() -> None:
    async with _Plain() as server, _client(max_keepalive_connections=5) as client:
        for _ in range(3):
            assert (await client.get(server.root_url)).content == b"ok"

    assert server.connections == 1


@pytest.mark.parametrize("close", [False, True])
async def test_a_connection_is_not_reused_when_it_cannot_be(close: bool) -> None:
    """Not after an answer abandoned half read, nor after the server said it closes."""
    async with _Plain(b"x" * 100_000, close=close) as server, _client() as client:
        for _ in range(2):
            if close:
                assert len((await client.get(server.root_url)).content) == 100_000
            else:
                async with client.stream("GET", server.root_url) as response:
                    async for _ in response.aiter_raw():
                        break  # the rest is never read

    assert server.connections == 2


async def test_no_more_connections_than_the_limit_and_the_wait_is_bounded() -> None:
    async with _Plain() as server, _client(max_connections=1) as client:
        server.hold = asyncio.Event()
        first = asyncio.create_task(client.get(server.root_url))
        await asyncio.sleep(0.1)
        with pytest.raises(httpx2.PoolTimeout):
            await client.get(server.root_url, timeout=httpx2.Timeout(5, pool=0.1))
        server.hold.set()
        assert (await first).content == b"ok"
        # The slot came back: the next request gets the connection.
        assert (await client.get(server.root_url)).content == b"ok"

    assert server.connections == 1


async def test_a_cancelled_request_gives_its_connection_slot_back() -> None:
    async with _Plain() as server, _client(max_connections=1) as client:
        server.hold = asyncio.Event()
        first = asyncio.create_task(client.get(server.root_url))
        await asyncio.sleep(0.1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        server.hold.set()
        async with asyncio.timeout(5):
            assert (await client.get(server.root_url)).content == b"ok"

    assert server.connections == 2  # the cancelled answer's connection was closed


class _Truncates(LocalServer):
    """Promises 10 bytes and closes after 2."""

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab")
        await writer.drain()
        writer.close()


async def test_an_answer_cut_short_is_a_protocol_error() -> None:
    async with _Truncates() as server, _client() as client:
        with pytest.raises(httpx2.RemoteProtocolError):
            await client.get(server.root_url)


async def test_an_idle_connection_older_than_its_expiry_is_not_reused() -> None:
    async with _Plain() as server, _client(keepalive_expiry=0.05) as client:
        await client.get(server.root_url)
        await asyncio.sleep(0.1)
        await client.get(server.root_url)

    assert server.connections == 2


class _EndlessHead(LocalServer):
    """Answers with a head that never ends (one header line after another)."""

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for n in range(100_000):
            writer.write(b"X-Filler-%d: %s\r\n" % (n, b"x" * 100))
            await writer.drain()


async def test_a_head_that_never_ends_is_refused_not_buffered() -> None:
    async with _EndlessHead() as server, _client() as client:
        with pytest.raises(httpx2.RemoteProtocolError):
            await client.get(server.root_url, timeout=5)


async def test_a_body_that_stops_coming_times_out() -> None:
    async with _Plain(b"0123456789") as server, _client() as client:
        server.hold = asyncio.Event()  # the head and one byte, then nothing
        with pytest.raises(httpx2.ReadTimeout):
            await client.get(server.root_url, timeout=httpx2.Timeout(5, read=0.2))
        server.hold.set()


# --- through the providers -------------------------------------------------------------------


class _TruncatesAnswer(LocalServer):
    """Promises 10 bytes and closes after 2."""

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab")
        await writer.drain()
        writer.close()


async def test_an_answer_cut_short_is_unavailable() -> None:
    async with _TruncatesAnswer() as server:
        error = await failure(f"{server.root_url}/v1")

    assert (error.error_type, error.retryable) == ("provider_unavailable", True)


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
    proxy: ForwardProxy,
    monkeypatch: pytest.MonkeyPatch,
    family: str,
    connects: list[tuple[str, int]],
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.root_url)
    async with ReplayServer([HELLO]) as server:
        assert await _reply(_provider(family, server)) == "through the proxy"
        root = server.root_url

    assert len(server.received) == 1
    assert proxy.requests == [f"POST {root}{server.received[0].path}"]
    assert connects == []  # httpx2's transport, which goes through proxies


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


async def test_a_plain_http_endpoint_behind_a_proxy_trusts_no_certificate_either(
    proxy: ForwardProxy, authority: tuple[trustme.CA, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As without a proxy: httpx2's own transport, which a proxy takes, is given the same
    empty trust for a plain endpoint."""
    ca, pem = authority
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))
    monkeypatch.setenv("HTTP_PROXY", proxy.root_url)
    monkeypatch.setenv("HTTPS_PROXY", proxy.root_url)
    async with FakeModel(reply="over TLS", tls=server_tls(ca)) as secure:
        async with Redirecting(secure.root_url) as plain:
            error = await failure(f"{plain.root_url}/v1")
        port = secure.port

    assert error.error_type == "provider_unavailable"
    assert "certificate" in error.message.lower()
    assert f"CONNECT 127.0.0.1:{port}" in proxy.requests  # the redirect was followed
    assert not secure.requests


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
    require_import("h2", "needs h2 (the dev extra)")
    require_import("hypercorn", "needs hypercorn (the dev extra)")
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
