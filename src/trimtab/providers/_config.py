"""Provider configuration, and the factory that turns it into a `Provider`.

The config mirrors the Copilot SDK's BYOK `provider` object (`{type, baseUrl, apiKey, wireApi}`),
so it accepts camelCase keys as sent over the wire and snake_case keys as written in Python.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from trimtab.providers._base import Provider

__all__ = ["ProviderConfig", "make_provider"]

_SECRET_HEADER = re.compile(r"auth|key|token|secret|cookie|password|credential|signature", re.I)
"""Header names that (probably) carry a credential."""


class ProviderConfig(BaseModel):
    """How to reach a model provider.

    Unknown keys are rejected (a typo such as `baseURL` would otherwise be silently ignored and
    the provider would talk to the default endpoint).
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    type: Literal["openai", "azure", "anthropic", "local"]
    base_url: str | None = None
    """The API root, such as `http://localhost:11434/v1`; `None` means the vendor default."""
    api_key: str | None = Field(default=None, repr=False)
    """The secret key; never shown by `repr` nor by `public_dict()`."""
    wire_api: Literal["completions", "responses"] = "completions"
    timeout: float | None = None
    """Seconds a request may wait to connect and between bytes of the answer (a non-streamed
    answer arrives all at once, so this bounds the whole call); `None` keeps the library's default.
    """
    stall_timeout: float | None = None
    """Seconds a stream may go without a chunk before the call fails with `timeout`."""
    max_retries: int = 2
    """Retries of failed requests (429, 5xx, connection errors) done by the client library."""
    deployment: str | None = None
    """Azure: the deployment name."""
    api_version: str | None = None
    """Azure: the API version."""
    model_path: str | None = None
    """Local: the path of the model weights."""
    headers: dict[str, str] | None = Field(default=None, repr=False)
    """Extra HTTP headers sent with every request; hidden like the key, as they often carry one."""

    def public_dict(self) -> dict[str, Any]:
        """The config without secrets, in wire (camelCase) form, for the event log.

        Secrets are left out rather than masked, so that a session resumed from the log
        rebuilds a working provider that takes its credentials from the environment: the API
        key, headers whose name suggests a credential (`Authorization`, `api-key`, ...) and a
        `user:password@` in the base URL.
        """
        data = self.model_dump(by_alias=True, exclude_none=True, exclude={"api_key"})
        if self.headers is not None:
            data["headers"] = {
                name: value
                for name, value in self.headers.items()
                if not _SECRET_HEADER.search(name)
            }
        if self.base_url is not None:
            data["baseUrl"] = _without_userinfo(self.base_url)
        return data


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def make_provider(config: ProviderConfig) -> Provider:
    """Build the provider `config` describes.

    Provider modules are imported here, not at the top: the `openai` package alone takes
    about 0.6 s to import and `import trimtab` must stay fast.

    Raises:
        ValueError: The type or wire API is not available.
    """
    if config.type == "openai":
        if config.wire_api != "completions":
            raise ValueError(
                f"wire_api {config.wire_api!r} is not available yet for provider type 'openai'"
            )
        from trimtab.providers.openai import OpenAIProvider

        return OpenAIProvider(config)
    raise ValueError(f"provider type {config.type!r} is not available yet")
