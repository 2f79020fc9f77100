"""Credentials go to the endpoint they were configured for, and nowhere a redirect points.

The HTTP clients follow redirects (a moved endpoint, a trailing slash), and httpx drops only
`Authorization` when one leaves the origin: an Azure `api-key`, an `x-api-key` or a header of
the provider's config would reach whatever host the answer named. An httpx request hook,
which runs for every request of a redirect chain, takes them off any request that leaves the
configured endpoint's origin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import httpx2

__all__ = ["credentials_stay_home"]

_CREDENTIALS = ("authorization", "api-key", "x-api-key", "proxy-authorization", "cookie")


def credentials_stay_home(
    base_url: str, headers: Iterable[str] = ()
) -> Callable[[httpx2.Request], Awaitable[None]]:
    """A request hook that drops the credential headers, and `headers` (the config's own),
    from a request to another origin than `base_url`'s."""
    home = _origin(httpx2.URL(base_url))
    names = {*_CREDENTIALS, *(name.lower() for name in headers)}

    async def hook(request: httpx2.Request) -> None:
        if _origin(request.url) != home:
            for name in names:
                request.headers.pop(name, None)

    return hook


def _origin(url: httpx2.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return (url.scheme, url.host, url.port or default)
