"""Which model provider a command uses, and the provider config that reaches it.

When the person names none: `OPENAI_API_KEY`, then `ANTHROPIC_API_KEY`, then an Ollama server
answering on this machine, else the embedded model. The choice is announced on one line of
stderr, so that nobody wonders which model (and whose bill) answered.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, assert_never
from urllib.parse import urlsplit

from trimtab.cli.config import CliConfig, ProviderName, Resolved
from trimtab.cli.errors import EXIT_USAGE, CliError
from trimtab.providers import Provider

__all__ = [
    "DEFAULT_MODELS",
    "OLLAMA_PROBE_TIMEOUT",
    "ProviderChoice",
    "choose_provider",
    "probe_ollama",
    "provider_spec",
    "timeouts",
]

DEFAULT_MODELS: dict[str, str] = {
    "openai": "gpt-4.1-mini",
    "anthropic": "claude-sonnet-4-5",
    "ollama": "qwen2.5:7b",
    "scripted": "scripted",
}
"""The model used when none is given; the embedded model (`local`) has its default weights,
and takes a GGUF file's path as `--model`."""

OLLAMA_PROBE_TIMEOUT = 0.3
"""Seconds to wait for Ollama: a local server answers in milliseconds or is not running."""


_KEY_VARIABLES: tuple[tuple[str, ProviderName], ...] = (
    ("OPENAI_API_KEY", "openai"),
    ("ANTHROPIC_API_KEY", "anthropic"),
)
"""The API key variables that pick a provider, in order of preference."""


@dataclass(frozen=True, slots=True)
class ProviderChoice:
    """The provider a command uses, and why."""

    name: ProviderName
    reason: str
    """Why this one: `--provider`, `OPENAI_API_KEY is set`, ..."""
    auto: bool
    """Chosen from the environment rather than named by the person."""
    model: str | None
    """The model to ask for; None lets the provider decide."""

    def notice(self) -> str:
        """The one line that announces an automatic choice."""
        what = "the embedded model (local)" if self.name == "local" else self.name
        model = f" with model {self.model}" if self.model else ""
        return f"trimtab: using {what}{model}: {self.reason}; choose another with --provider"


def choose_provider(resolved: Resolved, env: Mapping[str, str]) -> ProviderChoice:
    """The provider of a new session: the configured one, else the first the environment offers.

    Never fails: the last resort is the embedded model, which reports itself if missing.
    """
    config = resolved.config
    if config.provider is not None:
        reason = f"set by {resolved.sources['provider']}"
        return ProviderChoice(config.provider, reason, False, _model(config))
    if config.base_url is not None:
        reason = f"{resolved.sources['base_url']} names an OpenAI-compatible server"
        return ProviderChoice("openai", reason, False, config.model or DEFAULT_MODELS["openai"])
    for variable, name in _KEY_VARIABLES:
        if env.get(variable):
            return ProviderChoice(name, f"{variable} is set", True, _model(config, name))
    pulled = probe_ollama(config.ollama_url)
    if pulled is not None:
        model = config.model or (pulled[0] if pulled else DEFAULT_MODELS["ollama"])
        return ProviderChoice("ollama", f"Ollama answers at {config.ollama_url}", True, model)
    reason = "found no OPENAI_API_KEY, ANTHROPIC_API_KEY or running Ollama"
    return ProviderChoice("local", reason, True, config.model)


def _model(config: CliConfig, name: ProviderName | None = None) -> str | None:
    name = name or config.provider
    if config.model is not None or name is None:
        return config.model
    if name == "ollama":
        # Ask for a model the server actually has, when it says which.
        pulled = probe_ollama(config.ollama_url)
        if pulled:
            return pulled[0]
    return DEFAULT_MODELS.get(name)


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


def provider_spec(choice: ProviderChoice, config: CliConfig) -> dict[str, Any] | Provider:
    """What `Client.create_session(provider=...)` takes for this choice.

    Raises:
        CliError: The scripted provider's script is missing or invalid.
    """
    key = config.api_key_value
    match choice.name:
        case "openai":
            spec: dict[str, Any] = {"type": "openai", "base_url": config.base_url, "api_key": key}
        case "ollama":
            base_url = config.base_url or f"{config.ollama_url}/v1"
            spec = {"type": "openai", "base_url": base_url, "api_key": key or "ollama"}
        case "anthropic":
            spec = {"type": "anthropic", "base_url": config.base_url, "api_key": key}
        case "local":
            # The weights are the model: a --model for the embedded provider is a GGUF file.
            spec = {"type": "local", "model_path": config.model}
        case "scripted":
            return _scripted(config.script)
        case _:
            assert_never(choice.name)
    if choice.name != "local":  # the embedded model is no HTTP server: nothing to wait for
        spec |= timeouts(config)
    return {name: value for name, value in spec.items() if value is not None}


def timeouts(config: CliConfig) -> dict[str, float]:
    """The provider config keys `--timeout` sets (none without it)."""
    if config.timeout is None:
        return {}
    return {"timeout": config.timeout, "stallTimeout": config.timeout}


def _scripted(path: Path | None) -> Provider:
    if path is None:
        raise CliError(
            "the scripted provider needs a script",
            hint="pass --script FILE (a JSON or YAML list of replies)",
            exit_code=EXIT_USAGE,
        )
    # Imported here: the testing helpers are only needed by this hidden provider.
    from trimtab.cli.script import load_script

    return load_script(path)
