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

``select_forks_batch(logits, specs, fanouts)`` is ``select_forks`` for a batch of sequences at once (the
draft's SSD round), with the same result.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["select_forks", "select_forks_batch"]


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


def select_forks_batch(logits: torch.Tensor, specs: list[list[int]],
                       fanouts: list[list[int]]) -> list[list[tuple[int, int]]]:
    """`select_forks` for every sequence at once (logits: the K_b + 1 rows of each sequence, in order; fanouts:
    each sequence's F_0..F_K), with one top-k over all rows. A row whose top-n boundary is tied goes to
    `select_forks`, whose tie rule decides."""
    V = logits.shape[1]
    counts, excluded, owner = [], [], []
    for b, sp in enumerate(specs):
        fanout = fanouts[b]
        fan = fanout[:len(sp)] + [fanout[-1]]
        for j, f in enumerate(fan):
            counts.append(min(f, V - (1 if j < len(sp) else 0)))
            excluded.append(sp[j] if j < len(sp) else -1)
            owner.append((b, j))
    scores = logits.float()
    if not counts or max(counts) == 0:
        return [[] for _ in specs]
    rows = [r for r, t in enumerate(excluded) if t >= 0]
    masked = scores.clone()
    masked[rows, [excluded[r] for r in rows]] = float("-inf")
    width = min(max(counts) + 1, V)
    values, indices = masked.topk(width, dim=1)
    n_t = torch.tensor(counts, device=logits.device)
    at = (n_t - 1).clamp(min=0)[:, None]
    last = values.gather(1, at)[:, 0]
    nxt = values.gather(1, n_t.clamp(max=width - 1)[:, None])[:, 0]
    tied = ((n_t < width) & (last == nxt)) | torch.isinf(last) | torch.isnan(last)
    out: list[list[tuple[int, int]]] = [[] for _ in specs]
    slow: set[int] = {owner[r][0] for r in tied.nonzero()[:, 0].tolist() if counts[r] > 0}
    for r, n in enumerate(counts):
        b, j = owner[r]
        if n == 0 or b in slow:
            continue
        chosen = indices[r, :n].sort().values
        order = scores[r, chosen].sort(descending=True, stable=True).indices
        out[b].extend((j, t) for t in chosen[order].tolist())
    start = 0
    for b, sp in enumerate(specs):
        if b in slow:
            fan = fanouts[b][:len(sp)] + [fanouts[b][-1]]
            out[b] = select_forks(logits[start:start + len(sp) + 1], torch.tensor(sp, dtype=torch.long), fan)
        start += len(sp) + 1
    return out
