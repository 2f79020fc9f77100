"""A model server's answer cannot fill the process's memory (spec M3: every buffer has a limit).

The Chat Completions client reads an unstreamed answer whole, and an error's body for its
message: a server (or a proxy) that sends without end gets a typed error once the limit is
passed, and the connection is closed, instead of the process buffering for as long as the
deadline lets it.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from tests.fake_model import LocalServer
from trimtab._errors import ProviderError
from trimtab.providers import Message, ModelRequest, ProviderConfig, make_provider
from trimtab.providers._openai_client import MAX_ANSWER_BYTES

CHUNK = b"x" * 65536


class EndlessServer(LocalServer):
    """Answers every request with `status` and a chunked body that never ends."""

    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status
        self.sent = 0

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            f"HTTP/1.1 {self.status} X\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        try:
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
                self.sent += len(CHUNK)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # the client closed the connection: what is tested


@pytest.fixture(params=[200, 400], ids=["answer", "error"])
async def endless(request: pytest.FixtureRequest) -> AsyncIterator[EndlessServer]:
    async with EndlessServer(request.param) as server:
        yield server


async def test_m3_an_endless_answer_is_a_typed_error_past_the_limit(endless: EndlessServer) -> None:
    config = {"type": "openai", "base_url": f"{endless.root_url}/v1", "api_key": "k"}
    model = make_provider(ProviderConfig.model_validate({**config, "timeout": 60}))
    request = ModelRequest(model="m", messages=(Message(role="user", content="hi"),), stream=False)
    tracemalloc.start()
    try:
        with pytest.raises(ProviderError) as caught:
            async with asyncio.timeout(30):
                async for _ in model.stream(request):
                    pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await model.aclose()
    if endless.status == 200:
        assert caught.value.error_type == "bad_response"
        assert f"larger than {MAX_ANSWER_BYTES} bytes" in caught.value.message
        assert peak < 3 * MAX_ANSWER_BYTES
    else:
        assert caught.value.error_type == "bad_request"
        assert caught.value.status_code == 400
        assert endless.sent < MAX_ANSWER_BYTES  # an error's body: only its start is read
        assert peak < MAX_ANSWER_BYTES
