"""`Guard`: who may read the inspector's pages.

A request must carry the token (spec L9): once as `?token=` in the URL the inspector printed
(answered with a cookie and a redirect to the same page without it, so that it stays out of
the browser's history), then in that cookie, or as `Authorization: Bearer <token>`. The
cookie's name is the token's own, so that inspectors on other ports of the same host (which
a browser sends each other's cookies) keep theirs apart; a cookie is worth what its value
is, never its name. Only `--no-auth` serves without a token, on loopback only. On loopback
the `Host` header is checked as well: a web page elsewhere that points a name of its own at
127.0.0.1 (DNS rebinding) gets nothing, token or not.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["LOOPBACK_NAMES", "Guard"]

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
"""The names a browser on this machine uses for a loopback address."""


class Guard:
    """ASGI middleware: refuses requests without the token, or to a host not allowed.

    Args:
        app: What the allowed requests reach.
        token: The token requests must carry; None lets every request in.
        hosts: The host names requests may be addressed to; None allows any.
    """

    def __init__(self, app: ASGIApp, *, token: str | None, hosts: frozenset[str] | None) -> None:
        self._app = app
        self._token = token.encode() if token else None
        self._hosts = hosts
        # Per token, so that inspectors with different tokens on one host keep their cookies.
        digest = hashlib.sha256(self._token or b"").hexdigest()[:12]
        self.cookie = f"trimtab_inspect_{digest}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        response = self._refusal(Request(scope))
        await (response or self._app)(scope, receive, send)

    def _refusal(self, request: Request) -> Response | None:
        """The answer to a request that may not pass; None when it may."""
        if self._hosts is not None and _host_name(request.headers.get("host")) not in self._hosts:
            return PlainTextResponse("this inspector answers on its loopback address only", 421)
        if self._token is None:
            return None
        given = request.query_params.get("token")
        if given is not None and self._matches(given):
            return self._admit(request)
        header = request.headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        if scheme.lower() == "bearer" and self._matches(credential.strip()):
            return None
        if self._matches(request.cookies.get(self.cookie)):
            return None
        return PlainTextResponse(
            "missing or wrong token: open the URL that 'trimtab inspect' printed", 401
        )

    def _matches(self, given: str | None) -> bool:
        assert self._token is not None
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    def _admit(self, request: Request) -> Response:
        """Trade the token in the URL for a cookie, and go to the same page without it."""
        assert self._token is not None
        path = "/" + request.scope.get("raw_path", b"/").decode("latin-1").lstrip("/")
        query = "&".join(
            part for part in request.url.query.split("&") if part and not part.startswith("token=")
        )
        response = RedirectResponse(path + (f"?{query}" if query else ""), status_code=303)
        response.set_cookie(
            self.cookie, self._token.decode(), httponly=True, samesite="strict", path="/"
        )
        return response


def _host_name(header: str | None) -> str | None:
    """The host name of a `Host` header, without its port or IPv6 brackets."""
    try:
        return urlsplit(f"//{header}").hostname if header else None
    except ValueError:
        return None
