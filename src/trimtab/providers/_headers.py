"""HTTP headers callers give (a provider's, a send's), checked before a request carries them:
one the HTTP client cannot send would otherwise fail every model call of the session."""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["FRAMING", "checked_headers"]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A header name (RFC 9110's token)."""

_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")
"""A header value the HTTP client sends as it is: printable ASCII and tabs."""

FRAMING = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer",
     "upgrade", "expect"}
)  # fmt: skip
"""Headers the HTTP client sets from the request itself: given, they break its framing."""


def checked_headers(
    given: Mapping[str, str], what: str, *, refused: frozenset[str] = FRAMING
) -> dict[str, str]:
    """`given` as a dict, or `ValueError` naming the first header HTTP cannot carry as it is,
    or that is one of `refused` (lower-case names)."""
    headers = dict(given)
    for name, value in headers.items():
        if not (isinstance(name, str) and isinstance(value, str)) or not name.strip():
            raise ValueError(f"{what} must map header names to text values")
        if not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
            raise ValueError(f"{what}: header {name!r} holds a character HTTP cannot carry")
        if name.lower() in refused:
            raise ValueError(f"{what}: header {name!r} is the HTTP client's to set")
    return headers
