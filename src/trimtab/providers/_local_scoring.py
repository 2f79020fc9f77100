"""How likely the embedded model finds a text: the log-probability of tokens given those before
them, read from one pass over the prompt (no sampling).

`Llama.eval` keeps the logits of a batch's last token only (unless the model was loaded with
`logits_all`, which keeps a row per token of the context: 8,192 x 49,152 floats for SmolLM2),
so the batch is decoded here, asking llama.cpp for the logits of just the positions scored.
Runs under the engine's lock, in its worker thread, after `PromptStates.prepare`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from llama_cpp.llama import Llama

__all__ = ["log_likelihood"]


def log_likelihood(llama: Llama, tokens: list[int], start: int) -> float:
    """The log-probability of `tokens[start:]` given `tokens[:start]`, in natural log units.

    The model must hold a prefix of `tokens` shorter than `start` (`llama.n_tokens` of them);
    it reads the rest, and holds all of `tokens` afterwards.
    """
    held = llama.n_tokens
    if not 0 < start <= len(tokens) or held >= start:
        raise ValueError(f"cannot score from token {start} of {len(tokens)} with {held} held")
    total = 0.0
    n_vocab = llama.n_vocab()
    batch = llama._batch
    for first in range(held, len(tokens), llama.n_batch):
        part = tokens[first : first + llama.n_batch]
        batch.set_batch(batch=part, n_past=first, logits_all=False)
        # The logits at position p predict token p + 1: those of the scored tokens are wanted.
        wanted = [start - 1 <= first + i < len(tokens) - 1 for i in range(len(part))]
        for i, want in enumerate(wanted):
            batch.batch.logits[i] = want
        llama._ctx.decode(batch)
        llama.input_ids[first : first + len(part)] = part
        llama.n_tokens = first + len(part)
        for i, want in enumerate(wanted):
            if want:
                logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(i), shape=(n_vocab,))
                total += _log_softmax_at(logits, tokens[first + i + 1])
    return total


def _log_softmax_at(logits: Any, token: int) -> float:
    """log(softmax(logits)[token]), computed stably in float64."""
    values = logits.astype(np.float64)
    top = values.max()
    return float(values[token] - top - np.log(np.exp(values - top).sum()))
