"""When a model call's request is sent again: one policy for every HTTP provider.

A request that got no answer (the connection failed, or dropped before the answer's head) or
whose answer asks for another try (408, 409, 429 and 5xx, unless the server's `x-should-retry`
says otherwise) is sent again, up to the config's `max_retries` times: after the wait the
answer asks for (`retry-after-ms`, `retry-after`), else after an exponential backoff with
jitter, as the `openai` and `anthropic` libraries wait. Never past the call's deadline
(`answer_within`, spec M1): a wait that would not end before it is not begun, and the call
fails at once with what it got (a 429 keeps its `retry_after`).

The decision is made on the HTTP answer itself (its status and headers), which a retry
library (`stamina`, `tenacity`) only sees as an exception: this loop is shorter than the
wrapping it would take, and hands the last answer back to be read as the call's error.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping

import httpx2

from trimtab.providers._common import retry_after, time_left

__all__ = ["retrying"]

_RETRIED_STATUSES = frozenset({408, 409, 429})
"""Besides every 5xx: a request timeout, a lock conflict (OpenAI's), a rate limit."""


async def retrying(
    send: Callable[[], Awaitable[httpx2.Response]], max_retries: int
) -> httpx2.Response:
    """The answer of `send()`, called again while the policy says so; its body unread."""
    attempt = 0
    while True:
        last = attempt >= max_retries
        try:
            response = await send()
        except httpx2.TransportError:
            if last or not _in_time(wait := _backoff(attempt)):
                raise
        else:
            if last or not _should_retry(response):
                return response
            if not _in_time(wait := _wait(attempt, response)):
                return response
            await response.aclose()
        await asyncio.sleep(wait)
        attempt += 1


def _should_retry(response: httpx2.Response) -> bool:
    if not response.is_error:
        return False
    should_retry = response.headers.get("x-should-retry")
    if should_retry in ("true", "false"):
        return bool(should_retry == "true")
    status = response.status_code
    return status in _RETRIED_STATUSES or status >= 500


def _wait(attempt: int, response: httpx2.Response) -> float:
    asked = _asked(response.headers)
    return _backoff(attempt) if asked is None else asked


def _asked(headers: Mapping[str, str]) -> float | None:
    asked = retry_after(headers)
    return asked if asked is not None and asked > 0 else None


def _backoff(attempt: int) -> float:
    return min(0.5 * 2.0**attempt, 8.0) * (1 - 0.25 * random.random())


def _in_time(wait: float) -> bool:
    left = time_left()
    return left is None or wait < left
