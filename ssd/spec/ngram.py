"""Prompt-lookup (n-gram) backup speculation: propose what followed the last n-gram before.

Contract
--------
``ngram_propose(history, k, max_ngram, min_ngram)`` takes the sequence's committed token ids (prompt and
output). For ``n`` from ``max_ngram`` down to ``min_ngram`` it looks for an earlier occurrence of the
last ``n`` tokens (occurrences may overlap the suffix but must be followed by at least one token), takes
the most recent one, and returns the up to ``k`` tokens that followed it. The longest n-gram that occurs
wins; an empty list means no proposal (the caller verifies without draft tokens).

Cost: one vectorised comparison per n-gram length and offset, O(max_ngram^2 * L) element compares for a
history of L tokens, plus O(L) to convert a Python list (pass a numpy int array to skip that). For a few
thousand tokens that is tens of microseconds. No model, no torch: the router runs this.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ngram_propose"]


def ngram_propose(history: Sequence[int] | np.ndarray, k: int, max_ngram: int = 3,
                  min_ngram: int = 1) -> list[int]:
    if k <= 0:
        return []
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
    tokens = np.asarray(history, dtype=np.int64)
    L = tokens.shape[0]
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        starts = L - n
        suffix = tokens[starts:]
        match = tokens[:starts] == suffix[0]
        for t in range(1, n):
            match &= tokens[t:starts + t] == suffix[t]
        hits = np.flatnonzero(match)
        if hits.size:
            follow = int(hits[-1]) + n
            return tokens[follow:follow + k].tolist()
    return []
