"""A small table of model limits, so that compaction works for every provider (users override
it per session with `model_limits=`)."""

from __future__ import annotations

import functools

from trimtab.events import ModelLimits

__all__ = ["limits_for"]

# (context window, max output tokens), matched by the longest prefix of the model name.
_KNOWN: dict[str, tuple[int, int]] = {
    "gpt-5": (400_000, 128_000),
    "gpt-4.1": (1_047_576, 32_768),
    "gpt-4o": (128_000, 16_384),
    "gpt-4-turbo": (128_000, 4_096),
    "gpt-3.5-turbo": (16_385, 4_096),
    "o1": (200_000, 100_000),
    "o3": (200_000, 100_000),
    "o4-mini": (200_000, 100_000),
    "claude-opus-4": (200_000, 32_000),
    "claude-sonnet-4": (200_000, 64_000),
    "claude-3-7-sonnet": (200_000, 64_000),
    "claude-3-5-sonnet": (200_000, 8_192),
    "claude-3-5-haiku": (200_000, 8_192),
    "claude-haiku-4": (200_000, 64_000),
    "qwen2.5": (32_768, 8_192),
    "qwen3": (32_768, 8_192),
    "llama3": (131_072, 8_192),
    "gemma": (8_192, 2_048),
    "mistral": (32_768, 8_192),
    "smollm2": (8_192, 2_048),
}


def limits_for(model: str | None, override: ModelLimits | None = None) -> ModelLimits:
    """The session's limits: its override, else the table, else a conservative default."""
    if override is not None:
        return override
    return _from_table((model or "").lower().rsplit("/", 1)[-1])


@functools.lru_cache(maxsize=1024)
def _from_table(name: str) -> ModelLimits:
    """The table's limits for a model name (shared: a session's turns all ask for them)."""
    matches = [prefix for prefix in _KNOWN if name.startswith(prefix)]
    if not matches:
        return ModelLimits()
    context, output = _KNOWN[max(matches, key=len)]
    return ModelLimits(context_window=context, max_output_tokens=output)
