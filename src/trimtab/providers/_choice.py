"""Which provider a runtime uses when nobody names one (spec S6).

In order: `OPENAI_API_KEY`, then `ANTHROPIC_API_KEY`, then an Ollama server answering on this
machine, else the embedded model. `Client()` and the command line both choose here, and both
announce the choice in the same words, so that nobody wonders which model (and whose bill)
answered. What was chosen from the environment is the operator's own provider: it may use
the environment's keys (spec S1).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias
from urllib.parse import urlsplit

from trimtab.providers._names import DEFAULT_OLLAMA_URL, named_provider

__all__ = [
    "DEFAULT_MODELS",
    "DEFAULT_OLLAMA_URL",
    "OLLAMA_PROBE_TIMEOUT",
    "OLLAMA_URL_VARIABLE",
    "AutomaticChoice",
    "AutomaticProvider",
    "choose_automatically",
    "ollama_model",
    "ollama_url",
    "probe_ollama",
]

AutomaticProvider: TypeAlias = Literal["openai", "anthropic", "ollama", "local"]
"""What the environment can offer."""

DEFAULT_MODELS: dict[str, str] = {
    "openai": "gpt-4.1-mini",
    "anthropic": "claude-sonnet-4-5",
    "ollama": "qwen2.5:7b",
}
"""The model asked for when none is given; the embedded model (`local`) has its default
weights, and an Ollama server that lists its models is asked for the first of them."""

OLLAMA_URL_VARIABLE = "TRIMTAB_OLLAMA_URL"
"""Where to look for Ollama instead of `DEFAULT_OLLAMA_URL`."""

OLLAMA_PROBE_TIMEOUT = 0.3
"""Seconds to wait for Ollama: a local server answers in milliseconds or is not running."""

_KEY_VARIABLES: tuple[tuple[str, AutomaticProvider], ...] = (
    ("OPENAI_API_KEY", "openai"),
    ("ANTHROPIC_API_KEY", "anthropic"),
)
"""The API key variables that pick a provider, in order of preference."""


@dataclass(frozen=True, slots=True)
class AutomaticChoice:
    """The provider the environment offers, and why."""

    name: AutomaticProvider
    reason: str
    """Why this one: `OPENAI_API_KEY is set`, `Ollama answers at ...`, ..."""
    model: str | None
    """The model to ask for; None lets the provider decide (the embedded model's weights)."""
    ollama_url: str = DEFAULT_OLLAMA_URL
    """Where Ollama was looked for (and, when chosen, answered)."""

    def notice(self, change: str) -> str:
        """The one line that announces the choice; `change` says how to choose another."""
        what = "the embedded model (local)" if self.name == "local" else self.name
        model = f" with model {self.model}" if self.model else ""
        return f"trimtab: using {what}{model}: {self.reason}; {change}"

    def config(self) -> dict[str, Any]:
        """The provider config of the choice, as `create_session(provider=...)` takes it."""
        return named_provider(self.name, ollama_url=self.ollama_url)


def choose_automatically(
    env: Mapping[str, str], *, ollama_url: str = DEFAULT_OLLAMA_URL, model: str | None = None
) -> AutomaticChoice:
    """The first provider the environment offers (see the module's docstring); `model`
    overrides the chosen provider's default model.

    Never fails: the last resort is the embedded model, which reports itself if missing. May
    block for up to `OLLAMA_PROBE_TIMEOUT` per step of the probe: call it off the event loop.
    """
    for variable, name in _KEY_VARIABLES:
        if env.get(variable):
            return AutomaticChoice(name, f"{variable} is set", model or DEFAULT_MODELS[name])
    pulled = probe_ollama(ollama_url)
    if pulled is not None:
        chosen = model or (pulled[0] if pulled else DEFAULT_MODELS["ollama"])
        return AutomaticChoice("ollama", f"Ollama answers at {ollama_url}", chosen, ollama_url)
    reason = "found no OPENAI_API_KEY, ANTHROPIC_API_KEY or running Ollama"
    return AutomaticChoice("local", reason, model, ollama_url)


def ollama_url(env: Mapping[str, str]) -> str:
    """Where to look for Ollama: `TRIMTAB_OLLAMA_URL`, else `DEFAULT_OLLAMA_URL`.

    Raises:
        ValueError: The variable holds no http:// or https:// URL with a host.
    """
    value = env.get(OLLAMA_URL_VARIABLE) or DEFAULT_OLLAMA_URL
    try:
        parts = urlsplit(value)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number from 1 to 65535
        valid = False
    if not valid:
        raise ValueError(
            f"{OLLAMA_URL_VARIABLE}={value!r} is not an http:// or https:// URL,"
            " such as http://127.0.0.1:11434"
        )
    return value.rstrip("/")


def ollama_model(url: str) -> str:
    """The model to ask the Ollama server at `url` for: the first it has, when it says."""
    pulled = probe_ollama(url)
    return pulled[0] if pulled else DEFAULT_MODELS["ollama"]


def probe_ollama(url: str, timeout: float = OLLAMA_PROBE_TIMEOUT) -> list[str] | None:
    """The models of the Ollama server at `url` (possibly none), or None if it does not answer.

    Uses `GET /api/tags` with a short timeout; anything but a 200 with Ollama's JSON counts as
    "not Ollama", so another service on the port is not mistaken for it.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    connection_type = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_type(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("GET", parts.path.rstrip("/") + "/api/tags")
        response = connection.getresponse()
        if response.status != 200:
            return None
        body = json.loads(response.read(1_000_000))
        return [str(model["name"]) for model in body.get("models", []) if "name" in model]
    except (OSError, http.client.HTTPException, ValueError, TypeError, KeyError, AttributeError):
        return None
    finally:
        connection.close()
