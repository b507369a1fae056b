"""Fork selection: the candidate outcomes ``(j, t*)`` the draft prepares speculations for.

Contract
--------
``select_forks(draft_probs[K+1, V], drafted[K], fanout[K+1])`` returns ``(j, token)`` pairs: for each
acceptance position j the ``F_j`` most probable tokens under the draft's distribution for ``t*`` after
accepting j drafted tokens. For j < K the token drafted at position j+1 (``drafted[j]``) is excluded: if
the target rejected it, it cannot be the correction token, and if it accepted it the outcome has a larger
j. At j = K (the bonus token) nothing is excluded. A row yields ``min(F_j, V - excluded)`` tokens, zero-
probability ones included when the fan-out asks for that many. Order: by j, then probability descending,
ties to the lower token id, so the result is deterministic. ``draft_probs`` may equally be logits: only
the ranking matters.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["select_forks"]


def select_forks(draft_probs: Tensor, drafted: Tensor, fanout: Sequence[int]) -> list[tuple[int, int]]:
    K = drafted.shape[0]
    if draft_probs.dim() != 2 or draft_probs.shape[0] != K + 1:
        raise ValueError(f"draft_probs must be [{K + 1}, V], got {tuple(draft_probs.shape)}")
    if len(fanout) != K + 1 or any(f < 0 for f in fanout):
        raise ValueError(f"fanout must be {K + 1} non-negative ints, got {list(fanout)}")
    V = draft_probs.shape[1]
    scores = draft_probs.float()
    allowed = torch.ones(K + 1, V, dtype=torch.bool, device=scores.device)
    allowed[torch.arange(K), drafted.long()] = False
    counts = [min(f, V - (1 if j < K else 0)) for j, f in enumerate(fanout)]
    widest = max(counts, default=0)
    if widest == 0:
        return []
    masked = scores.masked_fill(~allowed, float("-inf"))
    thresholds = masked.topk(widest, dim=1).values

    forks: list[tuple[int, int]] = []
    for j, n in enumerate(counts):
        if n == 0:
            continue
        row, ok, thr = scores[j], allowed[j], thresholds[j, n - 1]
        above = torch.nonzero((row > thr) & ok, as_tuple=True)[0]
        tied = torch.nonzero((row == thr) & ok, as_tuple=True)[0][: n - above.numel()]
        chosen = torch.cat([above, tied]).sort().values
        order = row[chosen].sort(descending=True, stable=True).indices
        forks.extend((j, int(t)) for t in chosen[order])
    return forks
