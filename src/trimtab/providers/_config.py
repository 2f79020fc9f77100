"""Provider configuration, and the factory that turns it into a `Provider`.

The config mirrors the Copilot SDK's BYOK `provider` object (`{type, baseUrl, apiKey, wireApi}`),
so it accepts camelCase keys as sent over the wire and snake_case keys as written in Python.

Credentials from this process's environment (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`,
`AZURE_OPENAI_API_KEY`, organisation ids, the client libraries' custom-header variables) are
the operator's. They go with a config only when whoever built the provider said so
(`make_provider(..., env_credentials=True)`: the runtime's own default provider), or when the
config names no `base_url` and so goes to the vendor's own endpoint, which those keys are for
(spec S1). A config that a session or a client chose, with a `base_url` of its own, brings its
own key or none.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from trimtab.providers._base import Provider
from trimtab.providers._headers import checked_headers

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_STALL_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "MAX_REDIRECTS",
    "ModelPrice",
    "ProviderConfig",
    "credentials_environment",
    "make_provider",
]

# How long a model call may wait, by default (README, "Providers"; spec M1). A person waits for
# a model, but not for ever: past these the call fails with `timeout` (retryable), instead of
# the client libraries' 600 s per attempt, three attempts for an unstreamed call.

CONNECT_TIMEOUT = 10.0
"""Seconds each attempt may take to connect (TCP and TLS): a reachable server takes well under
one, so waiting longer only delays the retry or the error."""

MAX_REDIRECTS = 20
"""Redirects one request follows (httpx's default); one more is a redirect loop (spec S1)."""

DEFAULT_STALL_TIMEOUT = 120.0
"""Seconds a streamed call may go without data: until its answer starts (retries included),
then before each event. Reasoning models think before their first token, with nothing to
stream meanwhile on Chat Completions (and between their reasoning and their answer on the
Responses API), and a local model reads a long prompt before it writes: two minutes covers
both in practice, and a person watching a silent stream would not wait much longer."""

DEFAULT_TIMEOUT = 300.0
"""Seconds an unstreamed call may take in all, retries included. Its answer arrives all at
once, after the model wrote all of it: thinking, then some 8,000 tokens at 30 a second take
about four and a half minutes."""

_SECRET_HEADER = re.compile(r"auth|key|token|secret|cookie|password|credential|signature", re.I)
"""Header names that (probably) carry a credential."""


class ModelPrice(BaseModel):
    """What one model's tokens cost, per million, in the unit the table's author chose (USD
    by convention: spec U1)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        defer_build=True,
    )

    input: float = Field(ge=0, allow_inf_nan=False)
    output: float = Field(ge=0, allow_inf_nan=False)
    cached_input: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Input tokens read from the provider's prompt cache; None: the `input` price."""

    def cost(self, input_tokens: int, cache_read_tokens: int, output_tokens: int) -> float:
        """The cost of one call; cached tokens are a part of its input tokens."""
        cached = min(cache_read_tokens, input_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        per_million = (
            (input_tokens - cached) * self.input
            + cached * cached_price
            + output_tokens * self.output
        )
        return per_million / 1_000_000


class ProviderConfig(BaseModel):
    """How to reach a model provider.

    Unknown keys are rejected (a typo such as `baseURL` would otherwise be silently ignored and
    the provider would talk to the default endpoint).
    """

    # Schemas built on first use, as for the event models: a faster start-up. An error names
    # the field and what is wrong, never the value given: it may be the key, or hold it.
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        defer_build=True,
        hide_input_in_errors=True,
    )

    type: Literal["openai", "azure", "anthropic", "local"]
    base_url: str | None = None
    """The API root, such as `http://localhost:11434/v1`; `None` means the vendor default."""
    api_key: str | None = Field(default=None, repr=False)
    """The secret key; never shown by `repr` nor by `public_dict()`."""
    wire_api: Literal["completions", "responses"] = "completions"
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Seconds an unstreamed call may take in all, retries included (its answer arrives all
    at once); `None`: `DEFAULT_TIMEOUT` (300 s)."""
    stall_timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Seconds a streamed call may go without data, before it fails with `timeout`: until the
    answer starts (retries included), then before each event; `None`: `DEFAULT_STALL_TIMEOUT`
    (120 s)."""
    max_retries: int = 2
    """Retries of failed requests (429, 5xx, connection errors), as the client libraries do them."""
    deployment: str | None = None
    """Azure: the deployment name."""
    wire_model: str | None = None
    """The model named in requests when the provider's name for it differs from the
    session's model (a fine-tune, a proxy's alias); the session's model still decides its
    limits and is what events report. The Copilot SDKs' `wireModel` (spec D9)."""
    api_version: str | None = None
    """Azure: the API version."""
    model_path: str | None = None
    """Local: the path of the model weights."""
    headers: dict[str, str] | None = Field(default=None, repr=False)
    """Extra HTTP headers sent with every request; hidden like the key, as they often carry one."""
    prices: dict[str, ModelPrice] | None = None
    """What each model's tokens cost, by the session's model name (spec U1): `{"gpt-4.1":
    {"input": 2.0, "cached_input": 0.5, "output": 8.0}}` per million tokens. None (the
    default): no call has a cost. Logged with the configuration (prices are no secret)."""

    def deadline(self, *, stream: bool) -> float:
        """Seconds a call may wait for its answer, retries included: for a streamed call until
        the answer starts (`stall_timeout`), for an unstreamed one all of it (`timeout`)."""
        if stream:
            return self.stall_seconds
        return self.timeout or DEFAULT_TIMEOUT

    @property
    def stall_seconds(self) -> float:
        """`stall_timeout`, or its default."""
        return self.stall_timeout or DEFAULT_STALL_TIMEOUT

    @field_validator("headers")
    @classmethod
    def _sendable_headers(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return None if value is None else checked_headers(value, "headers")

    @field_validator("base_url")
    @classmethod
    def _absolute_http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            # `port` raises for a port that is not a number between 0 and 65535.
            valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
        except ValueError:
            valid = False
        if not valid:
            raise ValueError(
                f"{value!r} is not an http:// or https:// URL with a host,"
                " such as http://localhost:11434/v1"
            )
        return value

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


def credentials_environment(config: ProviderConfig, *, env_credentials: bool) -> Mapping[str, str]:
    """The environment a provider may take credentials from: this process's, when the config
    is the operator's (`env_credentials`) or names no `base_url` (the vendor's endpoint, which
    the environment's keys are for); else none (spec S1)."""
    return os.environ if env_credentials or config.base_url is None else {}


def make_provider(
    config: ProviderConfig,
    *,
    env_credentials: bool = False,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> Provider:
    """Build the provider `config` describes.

    Provider modules are imported here, not at the top: the `openai` package alone takes
    about 0.6 s to import and `import trimtab` must stay fast.

    Args:
        config: The provider's configuration.
        env_credentials: Let credentials from this process's environment (`OPENAI_API_KEY`
            and the like) go to the config's `base_url`. Only for a config the operator
            chose; a config with no `base_url` goes to the vendor's own endpoint and gets
            them anyway (spec S1).
        transport: What the provider's HTTP client sends requests through, instead of the
            network (an `httpx2.MockTransport`, or `ReplayServer.transport()` in tests).
            Every type but "local", which has no HTTP client.

    Raises:
        ValueError: The type or wire API is not available, or an option does not fit the type.
        ImportError: The type needs an optional package that is not installed.
    """
    _check_options(config)
    if config.type in ("openai", "azure"):
        if config.wire_api == "responses":
            from trimtab.providers.openai_responses import OpenAIResponsesProvider

            return OpenAIResponsesProvider(
                config, env_credentials=env_credentials, transport=transport
            )
        from trimtab.providers.openai import OpenAIProvider

        return OpenAIProvider(config, env_credentials=env_credentials, transport=transport)
    if config.type == "anthropic":
        try:
            from trimtab.providers.anthropic import AnthropicProvider
        except ModuleNotFoundError as exc:
            if exc.name != "anthropic":
                raise
            from trimtab.providers._install import install_command

            raise ImportError(
                "provider type 'anthropic' needs the anthropic package: "
                + install_command("anthropic")
            ) from exc
        return AnthropicProvider(config, env_credentials=env_credentials, transport=transport)
    if config.type == "local":
        if transport is not None:
            raise ValueError("provider type 'local' has no HTTP client to give a transport")
        # Found, not imported (that takes 0.3 s, on the first request, with the weights): a
        # missing package fails here like anthropic's, before a session starts. Weights that
        # are missing or unreadable fail the first request with a ProviderError.
        import importlib.util

        if importlib.util.find_spec("llama_cpp") is None:
            from trimtab.providers._install import install_command

            raise ImportError(
                "provider type 'local' needs llama-cpp-python: " + install_command("local")
            )
        from trimtab.providers.local import LocalProvider

        return LocalProvider(config)
    raise ValueError(f"provider type {config.type!r} is not available yet")


def _check_options(config: ProviderConfig) -> None:
    """Refuse options that the provider type would silently ignore, or that it lacks."""
    if config.type == "azure" and config.api_version is None:
        raise ValueError("provider type 'azure' needs api_version (such as '2024-10-21')")
    for key in ("deployment", "api_version"):
        if config.type != "azure" and getattr(config, key) is not None:
            raise ValueError(f"{key} applies only to provider type 'azure', not {config.type!r}")
    if config.type not in ("openai", "azure") and config.wire_api != "completions":
        raise ValueError(f"wire_api {config.wire_api!r} applies only to types 'openai', 'azure'")
