"""The clients both OpenAI wire formats use: Chat Completions and Responses.

They cover `type: "openai"` (OpenAI and every compatible server) and `type: "azure"` (Azure
OpenAI, where the deployment names the model and an API version is required).

Chat Completions goes over plain HTTP (`ChatClient`), as the `openai` client would send it and
with its retries: importing `openai` alone takes ~15 MB and ~0.3 s (hundreds of typed models),
which a long-lived server that only speaks Chat Completions would carry for nothing. Responses
goes through the `openai` client itself (`OpenAIClient`, `map_openai_error`), imported on first
use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx2

from trimtab._errors import ProviderError
from trimtab.providers._bodies import ACCEPT_ENCODING, bound_answer, bounded_answers
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
from trimtab.providers._http11 import Transport
from trimtab.providers._origin import credentials_stay_home

if TYPE_CHECKING:
    import openai

__all__ = ["ChatClient", "OpenAIClient", "map_openai_error", "stream_events"]

_PLACEHOLDER_KEY = "unused"
"""Sent to keyless local servers: the client library refuses to start without some key."""

# The `openai` client's defaults (its timeouts excepted: see `ProviderConfig.deadline`), but
# for the idle connections kept: httpx's own default of 20 rather than the `openai` client's
# 100 (docs/performance.md, many sessions), while up to 1000 requests still run at once.
_BASE_URL = "https://api.openai.com/v1"
_LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=20)
_MAX_RETRY_AFTER = 120.0
"""The longest `retry-after` waited for; a server asking for more is not retried."""
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
        # The library's own client, with its defaults (its environment's proxies too), but for
        # bounded answers.
        home = _azure_endpoint(config) if config.type == "azure" else config.base_url
        http_client = openai.DefaultAsyncHttpxClient(
            event_hooks=bounded_answers(
                credentials_stay_home(home or _BASE_URL, (headers or {}).keys())
            ),
            headers={"Accept-Encoding": ACCEPT_ENCODING},
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
                max_retries=config.max_retries,
                default_headers=headers,
                http_client=http_client,
            )
        return openai.AsyncOpenAI(
            api_key=api_key,
            base_url=config.base_url,
            timeout=timeout,
            max_retries=config.max_retries,
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
    """Sends Chat Completions requests through one HTTP client, created on first use.

    Requests, retries (408, 409, 429, 5xx and failed connections, waiting as `retry-after`
    asks or backing off exponentially) and errors follow the `openai` client's. `environment`
    is where credentials may come from (see `credentials_environment`).
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
        self._client: httpx2.AsyncClient | None = None
        self._wire: httpx2.AsyncBaseTransport | None = None
        """The client's transport, which `_exchange` sends through itself."""
        self._url: tuple[str, httpx2.URL, httpx2.Headers] | None = None
        """The last path requested, its whole URL, and the headers each request has."""

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
        if self._url is None or self._url[0] != path:
            # What `build_request` would merge for every request, merged once: the URL on the
            # client's base URL with its parameters, and the headers every request has, which
            # each request's headers then share (~0.7 KB less a call in flight).
            base = client.base_url
            url = base.copy_with(raw_path=base.raw_path + path[1:].encode())
            url = url.copy_merge_params(client.params)
            shared = httpx2.Headers(client.headers)
            shared["Content-Type"] = "application/json"
            if "Host" not in shared:
                shared = httpx2.Headers([(b"Host", url.netloc), *shared.raw])
            self._url = path, url, shared
        _, url, shared = self._url
        own = httpx2.Headers(shared)  # (a copy of the list: the headers themselves are shared)
        own.update(headers or {})
        own["Content-Length"] = str(len(body))
        seconds = self.config.deadline(stream=stream)
        timeout = httpx2.Timeout(**attempt_timeout(seconds)).as_dict()
        request = httpx2.Request(
            "POST",
            url,
            headers=own,
            stream=httpx2.ByteStream(body),
            extensions={"timeout": timeout},
        )
        request.read()  # (`request.content` is the body, as `build_request` makes it)
        if client.cookies:
            client.cookies.set_cookie_header(request)
        return request, seconds

    async def _send(self, request: httpx2.Request) -> httpx2.Response:
        """Send `request`, retrying as the `openai` client would; the answer's body unread."""
        client = self._get()
        attempt = 0
        while True:
            last = attempt >= self.config.max_retries
            headers = None
            try:
                response = await self._exchange(client, request)
            except httpx2.TimeoutException as exc:
                if last:
                    raise ProviderError("timeout", "the request timed out", retryable=True) from exc
            except (httpx2.RequestError, ssl.SSLError) as exc:
                if last:
                    raise connection_error(request.url, exc) from exc
            else:
                if not response.is_error:
                    return response
                if last or not _should_retry(response):
                    body = await read_body(response)
                    raise self._explained(_http_error(response, body))
                await response.aclose()
                headers = response.headers
            await asyncio.sleep(_retry_delay(attempt, headers))
            attempt += 1

    async def aclose(self) -> None:
        """Close the HTTP client, if one was created."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def _explained(self, error: ProviderError) -> ProviderError:
        if self.config.api_key is None and self._environment is not os.environ:
            return own_key_needed(error, _key_variable(self.config))
        return error

    async def _exchange(
        self, client: httpx2.AsyncClient, request: httpx2.Request
    ) -> httpx2.Response:
        """One exchange, through the client's transport itself: the client's layers (its auth
        flow, redirect loop and hooks, each a frame) held ~2 KB more for every call in flight,
        a thousand at once in a busy server. What they would do to an answer is done here: its
        body bounded (the response hook), its cookies kept. A redirect goes to the client, which
        follows it (the request sent again: a server that redirects has not taken it in)."""
        assert self._wire is not None
        try:
            response = await self._wire.handle_async_request(request)
        except httpx2.RequestError as exc:
            exc.request = request  # (as the client's own `request_context` does)
            raise
        response.request = request
        if response.has_redirect_location:
            await response.aclose()
            return await client.send(request, stream=True)
        client.cookies.extract_cookies(response)
        await bound_answer(response)
        return response

    def _get(self) -> httpx2.AsyncClient:
        # Created on first use so that building a provider never touches the network or the
        # environment, and a provider that is never called costs nothing.
        if self._client is None:
            self._client = self._create()
        return self._client

    def _create(self) -> httpx2.AsyncClient:
        config = self.config
        api_key = _api_key(config, self._environment)
        params: dict[str, str] = {}
        if config.type == "azure":
            base_url = f"{_azure_endpoint(config).rstrip('/')}/openai"
            headers = {"api-key": api_key}
            if config.api_version is not None:
                params["api-version"] = config.api_version
        else:
            base_url = config.base_url or os.environ.get("OPENAI_BASE_URL") or _BASE_URL
            headers = {"Authorization": f"Bearer {api_key}"}
        for name, variable in (
            ("OpenAI-Organization", "OPENAI_ORG_ID"),
            ("OpenAI-Project", "OPENAI_PROJECT_ID"),
        ):
            if value := self._environment.get(variable):
                headers[name] = value
        # The certificate store is loaded only for HTTPS (docs/performance.md, the `openai`
        # package): not for a server reached over plain HTTP (a local model). HTTPS there (a
        # redirect, a TLS proxy) then fails verification instead of being trusted.
        verify: ssl.SSLContext | bool = True
        if base_url.startswith("http://"):
            verify = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._wire = self._transport or Transport(verify=verify, limits=_LIMITS)
        return httpx2.AsyncClient(
            base_url=base_url,
            params=params,
            headers={
                "Accept": "application/json",
                "Accept-Encoding": ACCEPT_ENCODING,
                **headers,
                **(config.headers or {}),
            },
            # Each request passes its own (`ProviderConfig.deadline`).
            timeout=httpx2.Timeout(**attempt_timeout(config.deadline(stream=False))),
            limits=_LIMITS,
            follow_redirects=True,
            verify=verify,
            event_hooks=bounded_answers(credentials_stay_home(base_url, config.headers or ())),
            transport=self._wire,
        )


def _should_retry(response: httpx2.Response) -> bool:
    asked = retry_after(response.headers)
    if asked is not None and asked > _MAX_RETRY_AFTER:
        return False
    should_retry: str | None = response.headers.get("x-should-retry")
    if should_retry in ("true", "false"):
        return should_retry == "true"
    return response.status_code in (408, 409, 429) or response.status_code >= 500


def _retry_delay(attempt: int, headers: httpx2.Headers | None) -> float:
    asked = retry_after(headers) if headers is not None else None
    if asked is not None and 0 < asked <= _MAX_RETRY_AFTER:
        return asked
    return min(0.5 * 2.0**attempt, 8.0) * (1 - 0.25 * random.random())


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
