"""Every answer's body is read with a limit, whichever provider reads it (spec M3).

A model server, or a proxy in front of one, can send without end: an answer that never
closes, an event stream whose events keep coming, one line that never ends. The stall timeout
does not fire while bytes arrive, and the client libraries buffer what they are sent (a line
of an event stream, a JSON body, an error's body), so the limit sits under all of them: an
httpx event hook puts a counting stream in place of each response's body before anything
reads it. The three HTTP clients (the Chat Completions client's own, and those of the `openai`
and `anthropic` libraries, which use httpx2 too) are built with `bounded_answers()`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import httpx2

from trimtab._errors import ProviderError

__all__ = ["ERROR_BODY_LIMIT", "MAX_ANSWER_BYTES", "MAX_EVENT_BYTES", "bounded_answers"]

MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The most bytes one answer may hold, streamed or not: past it, a `bad_response`. A stream of
128k tokens, one chunk of JSON per token, is ~30 MB."""

MAX_EVENT_BYTES = 8 * 1024 * 1024
"""The longest line of an event stream. One event is one line of JSON; the longest is the
Responses API's last, which repeats the whole answer. The `anthropic` library joins a line's
pieces one copy at a time, so that an endless line would cost time as the square of its length."""

ERROR_BODY_LIMIT = 64 * 1024
"""The bytes of an error's body read for its message; the rest is not read."""

_Hook = Callable[[httpx2.Response], Awaitable[None]]


def bounded_answers() -> dict[str, list[_Hook]]:
    """The `event_hooks` of an httpx2 client whose answers' bodies are read with a limit."""
    return {"response": [_bound]}


async def _bound(response: httpx2.Response) -> None:
    if isinstance(response.stream, httpx2.AsyncByteStream):  # an async client's always is
        content_type = response.headers.get("content-type", "")
        response.stream = _BoundedBody(
            response.stream,
            error=response.is_error,
            stream=content_type.split(";")[0].strip().lower() == "text/event-stream",
        )


class _BoundedBody(httpx2.AsyncByteStream):
    """A response's body that ends (an error's) or fails (an answer's) past its limit."""

    def __init__(self, body: httpx2.AsyncByteStream, *, error: bool, stream: bool) -> None:
        self._body = body
        self._error = error
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        line = 0  # bytes since the last line break
        async for chunk in self._body:
            total += len(chunk)
            if self._error:
                if total >= ERROR_BODY_LIMIT:
                    yield chunk[: len(chunk) - (total - ERROR_BODY_LIMIT)]
                    return  # its start says what went wrong
            elif total > MAX_ANSWER_BYTES:
                raise ProviderError(
                    "bad_response", f"the answer is larger than {MAX_ANSWER_BYTES} bytes"
                )
            elif self._stream:
                end = chunk.rfind(b"\n")
                line = line + len(chunk) if end < 0 else len(chunk) - end - 1
                if line > MAX_EVENT_BYTES:
                    raise ProviderError(
                        "bad_response",
                        f"an event of the stream is longer than {MAX_EVENT_BYTES} bytes",
                    )
            yield chunk

    async def aclose(self) -> None:
        await self._body.aclose()
