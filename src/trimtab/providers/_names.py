"""Providers by name: what `--provider openai` (or `anthropic`, `ollama`, `local`) means.

`trimtab run` and `trimtab serve` take the same names, so the meaning lives here, below both.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias, assert_never, get_args

__all__ = ["DEFAULT_OLLAMA_URL", "PROVIDER_NAMES", "ProviderName", "named_provider"]

ProviderName: TypeAlias = Literal["openai", "anthropic", "ollama", "local"]

PROVIDER_NAMES: tuple[ProviderName, ...] = get_args(ProviderName)

DEFAULT_OLLAMA_URL = "http://127.0.0.1:11434"
"""Where Ollama listens unless told otherwise."""


def named_provider(
    name: ProviderName,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    model_path: str | None = None,
    ollama_url: str = DEFAULT_OLLAMA_URL,
) -> dict[str, Any]:
    """The provider config (`ProviderConfig`'s keys, no None values) that `name` stands for.

    Args:
        name: `openai` and `anthropic` are the vendors' APIs (their keys from the environment,
            or `api_key`); `ollama` is Chat Completions at `ollama_url`; `local` is the
            embedded model.
        base_url: Another API root for `openai`, `anthropic` or `ollama`.
        api_key: The key to send; Ollama takes any.
        model_path: The embedded model's GGUF file (None: its default weights).
        ollama_url: Where Ollama listens, when `base_url` does not say.
    """
    match name:
        case "openai" | "anthropic":
            spec: dict[str, Any] = {"type": name, "base_url": base_url, "api_key": api_key}
        case "ollama":  # its OpenAI-compatible API, which takes any key
            base_url = base_url or f"{ollama_url}/v1"
            spec = {"type": "openai", "base_url": base_url, "api_key": api_key or "ollama"}
        case "local":
            spec = {"type": "local", "model_path": model_path}
        case _:
            assert_never(name)
    return {key: value for key, value in spec.items() if value is not None}
