"""Which model provider a command uses, and the provider config that reaches it.

The configured one (`--provider`, `TRIMTAB_PROVIDER`, trimtab.toml; a base URL alone means an
OpenAI-compatible server), else the one the environment offers, chosen and announced as
`Client()` chooses (`trimtab.providers._choice`, spec S6), in the command line's words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trimtab.cli.config import CliConfig, ProviderName, Resolved
from trimtab.cli.errors import EXIT_USAGE, CliError
from trimtab.providers import Provider, named_provider
from trimtab.providers._choice import (
    DEFAULT_MODELS,
    AutomaticChoice,
    choose_automatically,
    ollama_model,
)

__all__ = ["ProviderChoice", "choose_provider", "provider_spec", "timeouts"]

_CHANGE = "choose another with --provider"
"""How a person chooses another provider than the automatic one."""


@dataclass(frozen=True, slots=True)
class ProviderChoice:
    """The provider a command uses, and why."""

    name: ProviderName
    reason: str
    """Why this one: `--provider`, `OPENAI_API_KEY is set`, ..."""
    model: str | None
    """The model to ask for; None lets the provider decide."""
    automatic: AutomaticChoice | None = None
    """The environment's choice, when the person named none."""

    @property
    def auto(self) -> bool:
        """Chosen from the environment rather than named by the person."""
        return self.automatic is not None

    def notice(self) -> str:
        """The one line that announces an automatic choice."""
        assert self.automatic is not None, "only an automatic choice is announced"
        return self.automatic.notice(_CHANGE)


def choose_provider(resolved: Resolved, env: Mapping[str, str]) -> ProviderChoice:
    """The provider of a new session: the configured one, else the first the environment offers.

    Never fails: the last resort is the embedded model, which reports itself if missing.
    """
    config = resolved.config
    if config.provider is not None:
        reason = f"set by {resolved.sources['provider']}"
        return ProviderChoice(config.provider, reason, _model(config, config.provider))
    if config.base_url is not None:
        reason = f"{resolved.sources['base_url']} names an OpenAI-compatible server"
        return ProviderChoice("openai", reason, config.model or DEFAULT_MODELS["openai"])
    found = choose_automatically(env, ollama_url=config.ollama_url, model=config.model)
    return ProviderChoice(found.name, found.reason, found.model, found)


def _model(config: CliConfig, name: ProviderName) -> str | None:
    if config.model is not None:
        return config.model
    if name == "ollama":
        # Ask for a model the server actually has, when it says which.
        return ollama_model(config.ollama_url)
    if name == "scripted":
        return "scripted"
    return DEFAULT_MODELS.get(name)


def provider_spec(choice: ProviderChoice, config: CliConfig) -> dict[str, Any] | Provider:
    """What `Client.create_session(provider=...)` takes for this choice.

    Raises:
        CliError: The scripted provider's script is missing or invalid.
    """
    if choice.name == "scripted":
        return _scripted(config.script)
    spec = named_provider(
        choice.name,
        base_url=config.base_url,
        api_key=config.api_key_value,
        # The weights are the model: a --model for the embedded provider is a GGUF file.
        model_path=config.model if choice.name == "local" else None,
        ollama_url=config.ollama_url,
    )
    if choice.name != "local":  # the embedded model is no HTTP server: nothing to wait for
        spec |= timeouts(config)
    return spec


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
