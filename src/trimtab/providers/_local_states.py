"""The embedded model's memory of conversations: what llama.cpp has read, kept for reuse.

Reading a prompt (prompt processing) is what a turn of a long conversation costs on a small
model: tens to hundreds of tokens per second on a laptop's cores, against the few tokens a
turn adds. llama.cpp keeps the key/value state of the tokens it has read, and
llama-cpp-python reuses it when the next prompt starts with the same tokens (`Llama.generate`
matches the longest common prefix and only reads the rest). That covers one conversation
going on; `PromptStates` covers the rest:

- Before each generation it decides how much of the prompt is read already: the longest
  common prefix with what the model holds now, or with a state saved earlier, whichever is
  longer (a saved one is then restored). At least the last token is always read again, so
  that sampling starts from fresh logits whatever llama-cpp-python version runs it.
- When a prompt is about to throw away most of what the model holds (another session's
  turn, a new conversation), that state is saved first: only sequence 0's key/value cells
  (`llama_state_seq_get_data`, ~20 KB per token for SmolLM2-135M), not `Llama.save_state`,
  which also copies up to 100 MB of logits.
- Saved states are bounded in bytes and evicted least recently used first; a state that
  another one extends (an earlier turn of the same conversation) is dropped when the longer
  one is saved.

Everything here runs under the engine's lock, in its worker thread.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llama_cpp
import numpy as np

if TYPE_CHECKING:
    from llama_cpp.llama import Llama

__all__ = ["PromptStates", "common_prefix"]

_SEQUENCE = 0
"""The one sequence llama-cpp-python's `Llama` decodes into."""

SAVE_FROM = 32
"""Tokens a state must stand to lose before it is saved: re-reading fewer is cheap."""

SUBSUMED_SLACK = 8
"""A saved state is dropped for a new one that extends all of it but its last few tokens (a
reply re-tokenized slightly differently when the conversation went on)."""


def common_prefix(a: Any, b: Any) -> int:
    """The number of leading tokens two token arrays share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


@dataclass(frozen=True, slots=True)
class _Saved:
    tokens: Any
    """The tokens whose state this is (an `np.intc` array)."""
    data: Any
    """The sequence's state, as `llama_state_seq_get_data` wrote it (a ctypes byte array)."""
    size: int


@dataclass(slots=True)
class Reuse:
    """What preparing one prompt did."""

    reused: int
    """Prompt tokens whose state was kept or restored: not read again."""
    restored: bool
    """A saved state was restored (another conversation's turn had replaced it)."""
    saved: bool
    """The state the model held was saved before it was replaced."""


class PromptStates:
    """The model's current state and the saved ones: `prepare` each prompt before decoding
    it, and say when its generation is `finished`.

    Args:
        llama: The loaded model.
        budget: The most bytes saved states may take together.
    """

    def __init__(self, llama: Llama, budget: int) -> None:
        self._llama = llama
        self._budget = budget
        self._saved: OrderedDict[int, _Saved] = OrderedDict()
        """Least recently used first."""
        self._bytes = 0
        self._next_key = 0
        self._conversation = 0
        """How many of the tokens the model holds are a conversation a later prompt may go on
        with: all of them after a reply; after a step (a tool choice, arguments) only those
        before its instruction, which no later prompt repeats."""
        self._reused = 0

    @property
    def saved_bytes(self) -> int:
        """The bytes the saved states take."""
        return self._bytes

    def prepare(self, prompt: list[int]) -> Reuse:
        """Make the model hold the longest known prefix of `prompt` (all of it but its last
        token at most) and nothing after it; `Llama.generate` then reads only the rest."""
        llama = self._llama
        target = np.asarray(prompt, dtype=np.intc)
        reused = common_prefix(llama.input_ids[: llama.n_tokens], target)
        conversation = min(self._conversation, llama.n_tokens)
        saved = restored = False
        if conversation - reused >= SAVE_FROM:
            # Another conversation's turn (or a new one) replaces this one's state: it may
            # come back to it.
            saved = self._save(conversation)
        # Looked for after the save, which may drop saved states (one the saved state
        # extends, the least recently used).
        key, best = self._best(target)
        if key is not None and best > reused:
            restored = self._restore(key)
            reused = best if restored else 0
        keep = min(reused, len(prompt) - 1)
        llama._ctx.kv_cache_seq_rm(_SEQUENCE, keep, -1)
        llama.n_tokens = keep
        self._reused = keep
        return Reuse(reused=keep, restored=restored, saved=saved)

    def finished(self, *, reply: bool) -> None:
        """The generation of the prompt last prepared ended: a reply (whose whole state a
        next turn goes on from), or a step (of which only the reused prefix is)."""
        self._conversation = self._llama.n_tokens if reply else self._reused

    def _best(self, target: Any) -> tuple[int | None, int]:
        """The saved state sharing the longest prefix with `target`, and that length."""
        best_key, best = None, 0
        for key, saved in self._saved.items():
            shared = common_prefix(saved.tokens, target)
            if shared > best:
                best_key, best = key, shared
        return best_key, best

    def _save(self, count: int) -> bool:
        """Save the state of the first `count` tokens the model holds (the rest is dropped)."""
        llama = self._llama
        llama._ctx.kv_cache_seq_rm(_SEQUENCE, count, -1)
        llama.n_tokens = count
        tokens = llama.input_ids[:count].copy()
        ctx = llama.ctx
        size = int(llama_cpp.llama_state_seq_get_size(ctx, _SEQUENCE))
        if size == 0 or size > self._budget:
            return False
        data = (ctypes.c_uint8 * size)()
        written = int(llama_cpp.llama_state_seq_get_data(ctx, data, size, _SEQUENCE))
        if written == 0:
            return False
        for key, other in list(self._saved.items()):
            if common_prefix(other.tokens, tokens) >= len(other.tokens) - SUBSUMED_SLACK:
                self._drop(key)
        self._saved[self._next_key] = _Saved(tokens, data, written)
        self._next_key += 1
        self._bytes += written
        while self._bytes > self._budget:
            self._drop(next(iter(self._saved)))
        return True

    def _restore(self, key: int) -> bool:
        """Load a saved state into the sequence; False (and the sequence empty) if llama.cpp
        refuses it."""
        saved = self._saved[key]
        self._saved.move_to_end(key)
        llama = self._llama
        llama._ctx.kv_cache_seq_rm(_SEQUENCE, -1, -1)
        loaded = llama_cpp.llama_state_seq_set_data(llama.ctx, saved.data, saved.size, _SEQUENCE)
        if not loaded:
            self._drop(key)
            llama._ctx.kv_cache_seq_rm(_SEQUENCE, -1, -1)
            llama.n_tokens = 0
            return False
        count = len(saved.tokens)
        llama.input_ids[:count] = saved.tokens
        llama.n_tokens = count
        return True

    def _drop(self, key: int) -> None:
        self._bytes -= self._saved.pop(key).size
