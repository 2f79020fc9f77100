"""The `openai` client both OpenAI wire formats use (Chat Completions and Responses).

It covers `type: "openai"` (OpenAI and every compatible server) and `type: "azure"` (Azure
OpenAI, where the deployment names the model and an API version is required), and maps the
library's exceptions to `ProviderError`s.
"""

from __future__ import annotations

import os

import openai

from trimtab._errors import ProviderError
from trimtab.providers._common import connection_error, retry_after, status_error, stream_error
from trimtab.providers._config import ProviderConfig

__all__ = ["OpenAIClient", "map_openai_error"]

_PLACEHOLDER_KEY = "unused"
"""Sent to keyless local servers: the client library refuses to start without some key."""


class OpenAIClient:
    """Owns one `openai.AsyncOpenAI` (or `AsyncAzureOpenAI`), created on first use."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self._client: openai.AsyncOpenAI | None = None

    def model(self, requested: str) -> str:
        """The model to name in the request: on Azure, the deployment when one is given."""
        return self.config.deployment or requested

    def get(self) -> openai.AsyncOpenAI:
        """The client; raise `ProviderError("authentication")` when no key is configured."""
        # Created on first use so that building a provider never touches the network or the
        # environment, and a provider that is never called costs nothing.
        if self._client is None:
            self._client = self._create()
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client, if one was created."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    def _create(self) -> openai.AsyncOpenAI:
        config = self.config
        timeout = openai.DEFAULT_TIMEOUT if config.timeout is None else config.timeout
        if config.type == "azure":
            api_key = config.api_key or os.environ.get("AZURE_OPENAI_API_KEY")
            if api_key is None:
                raise ProviderError(
                    "authentication", "no API key: set api_key or AZURE_OPENAI_API_KEY"
                )
            endpoint = config.base_url or os.environ.get("AZURE_OPENAI_ENDPOINT")
            if endpoint is None:
                raise ProviderError(
                    "bad_request", "no Azure endpoint: set base_url or AZURE_OPENAI_ENDPOINT"
                )
            # No `azure_deployment`: the client then puts the request's model, which is the
            # deployment (see `model`), in the path of the endpoints that need it.
            return openai.AsyncAzureOpenAI(
                api_key=api_key,
                api_version=config.api_version,
                azure_endpoint=endpoint,
                timeout=timeout,
                max_retries=config.max_retries,
                default_headers=config.headers,
            )
        api_key = config.api_key or os.environ.get("OPENAI_API_KEY")
        if api_key is None and config.base_url is None:
            raise ProviderError("authentication", "no API key: set api_key or OPENAI_API_KEY")
        return openai.AsyncOpenAI(
            api_key=api_key or _PLACEHOLDER_KEY,
            base_url=config.base_url,
            timeout=timeout,
            max_retries=config.max_retries,
            default_headers=config.headers,
        )


def map_openai_error(exc: Exception) -> ProviderError | None:
    """The `ProviderError` for an exception of the `openai` client (after its own retries)."""
    if not isinstance(exc, openai.OpenAIError):
        return None
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError("timeout", "the request timed out", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        return connection_error(exc.request.url.host, exc)
    if isinstance(exc, openai.APIResponseValidationError):
        return ProviderError("bad_response", f"malformed response: {exc.message}")
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        detail = body.get("message") if isinstance(body.get("message"), str) else exc.message
        return status_error(
            exc.status_code,
            str(detail),
            kind=f"{exc.code or ''} {exc.type or ''}",
            retry_after=retry_after(exc.response.headers),
            # Out of quota is a 429 too, but waiting does not help it.
            retryable=False if exc.code == "insufficient_quota" else None,
        )
    if isinstance(exc, openai.APIError):
        # An `error` object inside a 200 stream: the server failed while generating.
        return stream_error(f"{exc.code or ''} {exc.type or ''}".strip(), exc.message)
    return ProviderError("bad_request", str(exc))
