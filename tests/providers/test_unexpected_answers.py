"""Successful (200) answers of the wrong kind (issue 14, item 7; spec M2), for every wire
format, against a real HTTP server.

A streamed call answered with something that is not an event stream (a JSON body, an HTML
page from a proxy) fails with `bad_response`, which is not retried, rather than as a stream
cut short (`provider_unavailable`, retried). A 200 whose body is an error object, as some
proxies send, keeps the server's message, streamed or not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from trimtab._errors import ProviderError
from trimtab.providers import Message, ModelRequest, ProviderConfig, make_provider
from trimtab.testing import ReplayServer

FAMILIES = ("chat", "responses", "anthropic")

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
}
QUOTA = {"error": {"message": "You exceeded your current quota.", "type": "insufficient_quota"}}


@pytest.fixture
async def server() -> AsyncIterator[ReplayServer]:
    async with ReplayServer([]) as replay:
        yield replay


async def failure(server: ReplayServer, family: str, *, stream: bool) -> ProviderError:
    """The error of one call (with the default two retries) to the server."""
    config: dict[str, Any] = {"api_key": "test-key"}
    if family == "anthropic":
        config |= {"type": "anthropic", "base_url": server.root_url}
    else:
        wire_api = "responses" if family == "responses" else "completions"
        config |= {"type": "openai", "base_url": server.base_url, "wire_api": wire_api}
    model = make_provider(ProviderConfig.model_validate(config))
    request = ModelRequest(
        model="test-model", messages=(Message(role="user", content="Say hello"),), stream=stream
    )
    try:
        with pytest.raises(ProviderError) as caught:
            async for _ in model.stream(request):
                pass
    finally:
        await model.aclose()
    return caught.value


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    ("body", "content_type", "shown"),
    [
        (COMPLETION, None, "got application/json"),
        (b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html", "502 Bad Gateway"),
    ],
    ids=["json", "html"],
)
async def test_m2_a_streamed_call_answered_without_an_event_stream_is_a_bad_response(
    server: ReplayServer, family: str, body: Any, content_type: str | None, shown: str
) -> None:
    server.fail_next(200, body=body, content_type=content_type, times=3)

    error = await failure(server, family, stream=True)

    assert (error.error_type, error.retryable) == ("bad_response", False)
    assert "expected an event stream" in error.message
    assert shown in error.message
    assert len(server.requests) == 1  # not retried


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "unstreamed"])
async def test_m2_an_error_object_in_a_200_keeps_the_servers_message(
    server: ReplayServer, family: str, stream: bool
) -> None:
    server.fail_next(200, body=QUOTA, times=3)

    error = await failure(server, family, stream=stream)

    assert (error.error_type, error.retryable) == ("bad_response", False)
    assert "You exceeded your current quota." in error.message
    assert len(server.requests) == 1


@pytest.mark.parametrize("family", FAMILIES)
async def test_m2_an_error_object_in_a_200_is_typed_by_its_error_type(
    server: ReplayServer, family: str
) -> None:
    # Anthropic's error shape, as a proxy might pass it on with a 200.
    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "Slow down."}}
    server.fail_next(200, body=body, times=3)

    error = await failure(server, family, stream=True)

    assert (error.error_type, error.retryable) == ("rate_limit", True)
    assert "Slow down." in error.message


@pytest.mark.parametrize("family", ["responses", "anthropic"])
async def test_m2_an_unstreamed_answer_of_the_wrong_kind_is_a_bad_response_not_an_empty_reply(
    server: ReplayServer, family: str
) -> None:
    # The client libraries build any JSON (or text) into their response type, unchecked.
    server.fail_next(200, body=COMPLETION)

    error = await failure(server, family, stream=False)

    assert (error.error_type, error.retryable) == ("bad_response", False)
    assert "chat.completion" in error.message
