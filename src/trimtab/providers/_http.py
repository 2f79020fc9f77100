"""The HTTP client every provider sends through: httpx2's `AsyncClient`, as trimtab sets it up.

Chat Completions sends its requests with it, and the `openai` and `anthropic` libraries are
given it as their `http_client` (with their own retries off), so every HTTP provider has the
same stack: httpx2's client, with its own redirects, cookies and hooks, and on top of them

- the environment's proxies (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`), as httpx
  reads them, and HTTP/2 to an `https://` endpoint when the `h2` package is installed (the
  `http2` extra);
- every answer's body read under the limits of `_bodies` (spec M3);
- credentials kept off a request that a redirect sends to another origin (`_origin`, spec S1),
  and at most `MAX_REDIRECTS` redirects a request;
- the retries of `_retries`, within the call's deadline (spec M1).

Its transport is the one a caller injects, else httpx2's own (httpcore2) where a proxy or
HTTP/2 applies, else trimtab's HTTP/1.1 pool (`_http11`): with a thousand sessions' calls in
flight, httpcore2 held three budget lines out of reach (docs/performance.md, item 18).
"""

from __future__ import annotations

import importlib.util
import ssl
import urllib.request
from collections.abc import Iterable
from typing import Any

import httpx2

from trimtab.providers._bodies import ACCEPT_ENCODING, bounded_answers
from trimtab.providers._config import MAX_REDIRECTS
from trimtab.providers._http11 import Transport
from trimtab.providers._origin import credentials_stay_home
from trimtab.providers._retries import retrying

__all__ = ["HttpClient", "h2_installed"]

_LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=20)
"""Up to 1,000 requests at once, as the `openai` client allows; of the idle connections, httpx's
default 20 are kept rather than the `openai` client's 100, each of which the pool checks
whenever a request starts or ends (docs/performance.md, many sessions)."""


class HttpClient(httpx2.AsyncClient):
    """httpx2's client for one provider's endpoint `home`, sending each request again as the
    retry policy says, up to `max_retries` times.

    `credentials` names the headers of the provider's config, which stay with `home`'s origin
    as the keys do. Other keyword arguments are `httpx2.AsyncClient`'s.
    """

    def __init__(
        self,
        home: str,
        *,
        max_retries: int,
        credentials: Iterable[str] = (),
        transport: httpx2.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
        **options: Any,
    ) -> None:
        https = home.startswith("https://")
        http2 = https and h2_installed()
        # A plain http:// endpoint (a local model) trusts no certificate: HTTPS there (a
        # redirect) then fails verification instead of being trusted. trimtab's pool makes
        # that empty context only if it ever connects over HTTPS (`None`); httpx2's own
        # transport, for a proxy, is given it.
        verify: ssl.SSLContext | bool = True
        if transport is None and not http2 and not _proxied():
            transport = Transport(verify=True if https else None, limits=_LIMITS)
        elif not https:
            verify = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        super().__init__(
            headers={"Accept-Encoding": ACCEPT_ENCODING, **(headers or {})},
            limits=_LIMITS,
            http2=http2,
            verify=verify,
            follow_redirects=True,
            max_redirects=MAX_REDIRECTS,
            event_hooks=bounded_answers(credentials_stay_home(home, credentials)),
            transport=transport,
            **options,
        )
        self._max_retries = max_retries

    async def send(
        self, request: httpx2.Request, *, stream: bool = False, **options: Any
    ) -> httpx2.Response:
        """`httpx2.AsyncClient.send`, retried; an answer still failed at the end is returned
        (its body read unless `stream`), as the client library expects."""
        response = await retrying(
            lambda: super(HttpClient, self).send(request, stream=True, **options),
            self._max_retries,
        )
        if not stream:
            try:
                await response.aread()
            except BaseException:
                await response.aclose()
                raise
        return response


def _proxied() -> bool:
    """Whether the environment names a proxy (for any host: httpx2's transport then decides,
    by `NO_PROXY`, which requests go through it)."""
    proxies = urllib.request.getproxies()
    return any(proxies.get(scheme) for scheme in ("http", "https", "all"))


def h2_installed() -> bool:
    """Whether the `h2` package is installed (the `http2` extra): HTTP/2 can be spoken."""
    return importlib.util.find_spec("h2") is not None
