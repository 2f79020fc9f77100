"""The clients both OpenAI wire formats use: Chat Completions and Responses.

They cover `type: "openai"` (OpenAI and every compatible server) and `type: "azure"` (Azure
OpenAI, where the deployment names the model and an API version is required).

Chat Completions bodies are plain JSON, sent with trimtab's HTTP client (`ChatClient`) as the
`openai` client would send them: that library walks every message of a request through its
typed models, and importing its hundreds of models takes long, which a server that only
speaks Chat Completions would pay for nothing. Responses goes through the `openai` client
itself (`OpenAIClient`, `map_openai_error`), imported on first use, given the same HTTP
client (`_http`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx2

from trimtab._errors import ProviderError
from trimtab.providers._common import (
    answer_within,
    attempt_timeout,
    connection_error,
    environment_header_names,
    own_key_needed,
    read_body,
    require_event_stream,
    retry_after,
    status_error,
    stream_error,
)
from trimtab.providers._config import ProviderConfig
from trimtab.providers._http import HttpClient

if TYPE_CHECKING:
    import openai

__all__ = ["ChatClient", "OpenAIClient", "map_openai_error", "stream_events"]

_PLACEHOLDER_KEY = "unused"
"""Sent to keyless local servers: the client library refuses to start without some key."""

_BASE_URL = "https://api.openai.com/v1"
_DRAIN_TIMEOUT = 0.1


def _key_variable(config: ProviderConfig) -> str:
    return "AZURE_OPENAI_API_KEY" if config.type == "azure" else "OPENAI_API_KEY"


def _api_key(config: ProviderConfig, environment: Mapping[str, str]) -> str:
    """The key to send; raise `ProviderError("authentication")` when none is configured.

    `environment` is where a key may come from when the config has none (see
    `credentials_environment`).
    """
    variable = _key_variable(config)
    api_key = config.api_key or environment.get(variable)
    if api_key is None and config.type == "azure":
        error = ProviderError("authentication", f"no API key: set api_key or {variable}")
        raise error if environment is os.environ else own_key_needed(error, variable)
    if api_key is None and config.base_url is None:
        raise ProviderError("authentication", "no API key: set api_key or OPENAI_API_KEY")
    # Keyless local servers (Ollama, llama.cpp) still get some key: the clients insist.
    return api_key or _PLACEHOLDER_KEY


def _azure_endpoint(config: ProviderConfig) -> str:
    # Only without a base_url, which is when the environment's credentials apply too.
    endpoint = config.base_url or os.environ.get("AZURE_OPENAI_ENDPOINT")
    if endpoint is None:
        raise ProviderError(
            "bad_request", "no Azure endpoint: set base_url or AZURE_OPENAI_ENDPOINT"
        )
    return endpoint


def _openai_base_url(config: ProviderConfig) -> str:
    # The environment's, as the `openai` client takes it, only without a base_url: which is
    # when the environment's credentials apply too.
    return config.base_url or os.environ.get("OPENAI_BASE_URL") or _BASE_URL


class OpenAIClient:
    """Owns one `openai.AsyncOpenAI` (or `AsyncAzureOpenAI`), created on first use.

    `environment` is where credentials may come from (see `credentials_environment`); when it
    is withheld, the headers the `openai` library would add from this process's environment
    (organisation, project, `OPENAI_CUSTOM_HEADERS`) are switched off too.
    """

    def __init__(
        self,
        config: ProviderConfig,
        environment: Mapping[str, str],
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self._environment = environment
        self._transport = transport
        self._client: openai.AsyncOpenAI | None = None

    def model(self, requested: str) -> str:
        """The model to name in the request: on Azure, the deployment when one is given;
        else the configured `wire_model`, if any."""
        return self.config.deployment or self.config.wire_model or requested

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

    def map_error(self, exc: Exception) -> ProviderError | None:
        """`map_openai_error`, saying why a keyless config failed to authenticate."""
        error = map_openai_error(exc)
        if (
            error is not None
            and self.config.api_key is None
            and self._environment is not os.environ
        ):
            return own_key_needed(error, _key_variable(self.config))
        return error

    def _headers(self) -> dict[str, Any] | None:
        import openai

        if self._environment is os.environ:
            return self.config.headers
        names = ["OpenAI-Organization", "OpenAI-Project"]
        names += environment_header_names("OPENAI_CUSTOM_HEADERS")
        # Omitted headers are left out of every request: the library's own merge drops them.
        omitted: dict[str, Any] = {name: openai.Omit() for name in names}
        if self.config.type != "azure":
            # The key as the header: an `Authorization` from the environment would replace it.
            omitted["Authorization"] = f"Bearer {_api_key(self.config, self._environment)}"
        return {**omitted, **(self.config.headers or {})}

    def _create(self) -> openai.AsyncOpenAI:
        import openai

        config = self.config
        api_key = _api_key(config, self._environment)
        headers = self._headers()
        # Each call passes its own (`ProviderConfig.deadline`); this is for any other.
        timeout = openai.Timeout(**attempt_timeout(config.deadline(stream=False)))
        # Where the library sends its requests, as it decides it.
        home = _azure_endpoint(config) if config.type == "azure" else _openai_base_url(config)
        # trimtab's HTTP client, with its retries: the library's own are off.
        http_client = HttpClient(
            home,
            max_retries=config.max_retries,
            credentials=(headers or {}).keys(),
            transport=self._transport,
        )
        if config.type == "azure":
            # No `azure_deployment`: the client then puts the request's model, which is the
            # deployment (see `model`), in the path of the endpoints that need it.
            return openai.AsyncAzureOpenAI(
                api_key=api_key,
                api_version=config.api_version,
                azure_endpoint=_azure_endpoint(config),
                timeout=timeout,
                max_retries=0,
                default_headers=headers,
                http_client=http_client,
            )
        return openai.AsyncOpenAI(
            api_key=api_key,
            base_url=config.base_url,
            timeout=timeout,
            max_retries=0,
            default_headers=headers,
            http_client=http_client,
        )


def map_openai_error(exc: Exception) -> ProviderError | None:
    """The `ProviderError` for an exception of the `openai` client (after its own retries)."""
    import openai

    if not isinstance(exc, openai.OpenAIError):
        return None
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError("timeout", "the request timed out", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        return connection_error(exc.request.url, exc)
    if isinstance(exc, openai.APIResponseValidationError):
        return ProviderError("bad_response", f"malformed response: {exc.message}")
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        detail = body.get("message") if isinstance(body.get("message"), str) else exc.message
        return _status_error(exc.status_code, str(detail), body, exc.response)
    if isinstance(exc, openai.APIError):
        # An `error` object inside a 200 stream: the server failed while generating.
        return stream_error(f"{exc.code or ''} {exc.type or ''}".strip(), exc.message)
    return ProviderError("bad_request", str(exc))


def _status_error(
    status: int, detail: str, error: Mapping[str, Any], response: Any
) -> ProviderError:
    """The error of an HTTP error `response` (`httpx` or `httpx2`, whichever the client uses)."""
    code = error.get("code")
    return status_error(
        status,
        detail,
        url=response.request.url,
        kind=f"{code or ''} {error.get('type') or ''}",
        retry_after=retry_after(response.headers),
        # Out of quota is a 429 too, but waiting does not help it.
        retryable=False if code == "insufficient_quota" else None,
    )


# --- Chat Completions over plain HTTP ---------------------------------------------------------


class ChatClient:
    """Sends Chat Completions requests through one HTTP client (`_http`), created on first use.

    Requests and errors follow the `openai` client's. `environment` is where credentials may
    come from (see `credentials_environment`).
    """

    def __init__(
        self,
        config: ProviderConfig,
        environment: Mapping[str, str],
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self._environment = environment
        self._transport = transport
        self._client: HttpClient | None = None

    def model(self, requested: str) -> str:
        """The model to name in the request: on Azure, the deployment when one is given;
        else the configured `wire_model`, if any."""
        return self.config.deployment or self.config.wire_model or requested

    async def post(
        self, body: bytes, *, model: str, headers: dict[str, str] | None = None
    ) -> bytes:
        """The body of the successful answer to `body` (JSON, for `model`), at most
        `MAX_ANSWER_BYTES` (`_bodies`); raise `ProviderError` on any failure, or once
        `ProviderConfig.deadline` has passed."""
        request, seconds = self._request(body, model, headers, stream=False)
        async with answer_within(seconds, stream=False):
            return await read_body(await self._send(request))

    async def open_stream(
        self, body: bytes, *, model: str, headers: dict[str, str] | None = None
    ) -> httpx2.Response:
        """The successful streamed answer to `body`, checked to be an event stream, its body
        unread: the caller closes it. Raises as `post`."""
        request, seconds = self._request(body, model, headers, stream=True)
        async with answer_within(seconds, stream=True):
            response = await self._send(request)
            await require_event_stream(response)
            return response

    def _request(
        self, body: bytes, model: str, headers: dict[str, str] | None, *, stream: bool
    ) -> tuple[httpx2.Request, float]:
        """The request of `body`, and the seconds it may take (`ProviderConfig.deadline`)."""
        client = self._get()
        path = "/chat/completions"
        if self.config.type == "azure" and "/deployments" not in client.base_url.path:
            path = f"/deployments/{quote(model, safe='')}{path}"
        seconds = self.config.deadline(stream=stream)
        request = client.build_request(
            "POST",
            path,
            content=body,
            headers={"Content-Type": "application/json", **(headers or {})},
            timeout=httpx2.Timeout(**attempt_timeout(seconds)),
        )
        return request, seconds

    async def _send(self, request: httpx2.Request) -> httpx2.Response:
        """Send `request` (retried as `_retries` says); the successful answer, its body
        unread."""
        try:
            response = await self._get().send(request, stream=True)
        except httpx2.TimeoutException as exc:
            raise ProviderError("timeout", "the request timed out", retryable=True) from exc
        except (httpx2.RequestError, ssl.SSLError) as exc:
            raise connection_error(request.url, exc) from exc
        if response.is_error:
            body = await read_body(response)
            raise self._explained(_http_error(response, body))
        return response

    async def aclose(self) -> None:
        """Close the HTTP client, if one was created."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def _explained(self, error: ProviderError) -> ProviderError:
        if self.config.api_key is None and self._environment is not os.environ:
            return own_key_needed(error, _key_variable(self.config))
        return error

    def _get(self) -> HttpClient:
        # Created on first use so that building a provider never touches the network or the
        # environment, and a provider that is never called costs nothing.
        if self._client is None:
            self._client = self._create()
        return self._client

    def _create(self) -> HttpClient:
        config = self.config
        api_key = _api_key(config, self._environment)
        params: dict[str, str] = {}
        if config.type == "azure":
            base_url = f"{_azure_endpoint(config).rstrip('/')}/openai"
            headers = {"api-key": api_key}
            if config.api_version is not None:
                params["api-version"] = config.api_version
        else:
            base_url = _openai_base_url(config)
            headers = {"Authorization": f"Bearer {api_key}"}
        for name, variable in (
            ("OpenAI-Organization", "OPENAI_ORG_ID"),
            ("OpenAI-Project", "OPENAI_PROJECT_ID"),
        ):
            if value := self._environment.get(variable):
                headers[name] = value
        return HttpClient(
            base_url,
            max_retries=config.max_retries,
            credentials=config.headers or (),
            transport=self._transport,
            base_url=base_url,
            params=params,
            headers={"Accept": "application/json", **headers, **(config.headers or {})},
            # Each request passes its own (`ProviderConfig.deadline`).
            timeout=httpx2.Timeout(**attempt_timeout(config.deadline(stream=False))),
        )


def _http_error(response: httpx2.Response, content: bytes) -> ProviderError:
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    error = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {}
    message = error.get("message")
    status = response.status_code
    # Not the body itself, which may be a whole HTML error page.
    detail = message if isinstance(message, str) and message else f"Error code: {status}"
    return _status_error(status, detail, error, response)


async def stream_events(response: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects a server-sent event stream carries, up to `data: [DONE]`.

    Raises:
        ProviderError: The stream carries an `error` object.
        ValueError: An event's data is not a JSON object.
    """
    # The event's size is bounded under the reader, as every provider's (`_bodies`).
    events = aiter(httpx2.EventSource(response, max_event_size=None))
    async for sse in events:
        if sse.data.startswith("[DONE]"):
            # Reading the end of the body lets the connection be reused; a server slow to end
            # it, or failing to, costs only that.
            with contextlib.suppress(httpx2.HTTPError, ssl.SSLError, TimeoutError):
                async with asyncio.timeout(_DRAIN_TIMEOUT):
                    async for _ in events:
                        pass
            return
        if not sse.data:
            continue  # a comment or a keep-alive
        event = json.loads(sse.data)
        if not isinstance(event, dict):
            raise ValueError(f"a stream event is not a JSON object: {sse.data[:100]!r}")
        if error := event.get("error"):
            raise _stream_error(error)
        yield event


def _stream_error(error: object) -> ProviderError:
    fields = error if isinstance(error, dict) else {}
    message = fields.get("message")
    if not isinstance(message, str) or not message:
        message = "An error occurred during streaming"
    kind = f"{fields.get('code') or ''} {fields.get('type') or ''}".strip()
    return stream_error(kind, message)
