"""Redirects (spec S1): credentials stay with the endpoint they were configured for (a redirect
to another origin reaches it without the key or the config's own headers), and a redirect loop
says it is one."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.fake_model import LocalServer
from trimtab._errors import ProviderError
from trimtab.providers import Message, ModelRequest, ProviderConfig, make_provider
from trimtab.providers._config import MAX_REDIRECTS

ANSWER = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "elsewhere"},
                "finish_reason": "stop",
            }
        ],
    }
).encode()


class Elsewhere(LocalServer):
    """Another origin: records the headers of what reaches it, and answers."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[dict[str, str]] = []

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        lines = head.split("\r\n")[1:]
        headers = dict(line.split(": ", 1) for line in lines if ": " in line)
        self.headers.append({k.lower(): v for k, v in headers.items()})
        length = int(headers.get("Content-Length", headers.get("content-length", "0")))
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
        )
        await writer.drain()


class Redirecting(LocalServer):
    """The configured endpoint: sends every request on to `target` (307 keeps the POST)."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        path = head.split(" ")[1]
        writer.write(
            f"HTTP/1.1 307 Moved\r\nLocation: {self.target}{path}\r\n"
            "Content-Length: 0\r\n\r\n".encode()
        )
        await writer.drain()
        await reader.read()


KINDS = ["openai", "azure", "responses", "anthropic"]


def _config(kind: str, root_url: str, **options: Any) -> ProviderConfig:
    config: dict[str, Any] = {"api_key": "SECRET-KEY", **options}
    if kind == "azure":
        config |= {"type": "azure", "base_url": root_url, "api_version": "v"}
    elif kind == "anthropic":
        config |= {"type": "anthropic", "base_url": root_url}
    else:
        config |= {"type": "openai", "base_url": f"{root_url}/v1"}
        config["wire_api"] = "responses" if kind == "responses" else "completions"
    return ProviderConfig.model_validate(config)


@pytest.mark.parametrize("kind", KINDS)
async def test_s1_a_redirect_to_another_origin_carries_no_credentials(kind: str) -> None:
    async with Elsewhere() as elsewhere:
        # The same host by another name is another origin: the port differs.
        async with Redirecting(elsewhere.root_url) as endpoint:
            config = _config(
                kind,
                endpoint.root_url,
                headers={"X-Custom-Token": "SECRET-HEADER"},
                max_retries=0,
            )
            model = make_provider(config)
            request = ModelRequest(model="m", messages=(Message(role="user", content="hi"),))
            try:
                async for _ in model.stream(request):
                    pass
            except Exception:
                pass  # (another origin's answer may not be the wire format's): not the point
            finally:
                await model.aclose()
    assert elsewhere.headers, "the redirect was not followed"
    for headers in elsewhere.headers:
        assert not any("SECRET" in value for value in headers.values()), headers


class Looping(LocalServer):
    """Redirects every request to itself (307 keeps the POST), and counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            lines = head.split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
            await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests += 1
            path = lines[0].split(" ")[1]
            writer.write(
                f"HTTP/1.1 307 Moved\r\nLocation: {path}\r\nContent-Length: 0\r\n\r\n".encode()
            )
            await writer.drain()


@pytest.mark.parametrize("kind", KINDS)
async def test_s1_a_redirect_loop_says_it_is_one_and_is_not_retried(kind: str) -> None:
    async with Looping() as endpoint:
        model = make_provider(_config(kind, endpoint.root_url, max_retries=2))
        request = ModelRequest(model="m", messages=(Message(role="user", content="hi"),))
        try:
            with pytest.raises(ProviderError) as caught:
                async with asyncio.timeout(30):
                    async for _ in model.stream(request):
                        pass
        finally:
            await model.aclose()
        root = endpoint.root_url

    error = caught.value
    assert (error.error_type, error.retryable) == ("provider_unavailable", False)
    assert error.message.startswith(f"a redirect loop: more than {MAX_REDIRECTS} redirects from ")
    assert root in error.message
    assert endpoint.requests == MAX_REDIRECTS + 1
