"""Verification of a speculation against the target: the outcome ``(j, t*)`` of one round.

Contract
--------
* ``j`` in 0..K is the number of drafted tokens accepted, ``t*`` the token the target emits after them:
  the correction token on a rejection, the bonus token when all K are accepted. K = 0 is a plain target
  step (``t*`` drawn from ``p[0]``).
* Greedy: accept while ``draft[i] == argmax p[i]``; ``t* = argmax p[j]``.
* Sampling (lossless; Leviathan et al. / Chen et al.): accept ``x_i`` with probability
  ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection draw ``t*`` from ``normalize(max(0, p_j - q_j))``;
  after full acceptance draw the bonus from ``p_K``. ``q`` must be exactly the distribution the draft drew
  from (``ssd.engine.proposal``). A drafted token with ``q(x) = 0`` cannot have been drawn: ValueError.
  Should the residual vanish numerically (``p_j == q_j``), ``t*`` is drawn from ``p_j``.
* Batches are padded: ``draft_tokens[B, K]`` with ``lengths[B]`` (each row's own K; None = all K);
  entries past a row's length are ignored but must be valid ids. Sparse proposals come padded as
  ``(ids[B, K, S], p[B, K, S])`` with zero probability in the padding.
* Randomness: every row consumes K+1 float64 uniforms (K = padded width), from one generator for the
  whole batch or from that row's own generator (None = the global RNG), so results are deterministic
  given the generators. ``t*`` is drawn by inverse CDF, the rule ``ssd.sampling.sample`` uses.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["verify_greedy", "verify_greedy_batch", "verify_sampling", "verify_sampling_batch"]

Generators = torch.Generator | Sequence[torch.Generator | None] | None
SparseQ = tuple[Tensor, Tensor]


def _active(lengths: Tensor | None, B: int, K: int, device: torch.device) -> tuple[Tensor, Tensor]:
    if lengths is None:
        lengths = torch.full((B,), K, dtype=torch.int64, device=device)
    lengths = torch.as_tensor(lengths, dtype=torch.int64, device=device)
    if lengths.shape != (B,) or bool((lengths < 0).any() | (lengths > K).any()):
        raise ValueError(f"lengths must be [{B}] ints in 0..{K}")
    return lengths, torch.arange(K, device=device)[None, :] < lengths[:, None]


def verify_greedy_batch(draft_tokens: Tensor, target_argmax: Tensor,
                        lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Greedy outcomes for ``draft_tokens[B, K]`` against ``target_argmax[B, K+1]``: ``(j[B], t*[B])``."""
    B, K = draft_tokens.shape
    if target_argmax.shape != (B, K + 1):
        raise ValueError(f"target_argmax must be [{B}, {K + 1}], got {tuple(target_argmax.shape)}")
    _, active = _active(lengths, B, K, draft_tokens.device)
    match = (draft_tokens == target_argmax[:, :K]) & active
    j = match.long().cumprod(dim=1).sum(dim=1)
    return j, target_argmax.gather(1, j[:, None]).squeeze(1)


def verify_greedy(draft_tokens: Tensor, target_argmax: Tensor) -> tuple[int, int]:
    """Greedy outcome for one sequence: ``draft_tokens[K]``, ``target_argmax[K+1]``."""
    j, t = verify_greedy_batch(draft_tokens.reshape(1, -1), target_argmax.reshape(1, -1))
    return int(j[0]), int(t[0])


def _uniforms(B: int, n: int, generators: Generators, device: torch.device) -> Tensor:
    def draw(shape: tuple[int, ...], g: torch.Generator | None) -> Tensor:
        on = g.device if g is not None else None
        return torch.rand(shape, dtype=torch.float64, generator=g, device=on).to(device)

    if generators is None or isinstance(generators, torch.Generator):
        return draw((B, n), generators)
    if len(generators) != B:
        raise ValueError(f"got {len(generators)} generators for a batch of {B} rows")
    if B == 0:
        return torch.empty((0, n), dtype=torch.float64, device=device)
    return torch.stack([draw((n,), g) for g in generators])


def _inverse_cdf(dist: Tensor, u: Tensor) -> Tensor:
    V = dist.shape[-1]
    cdf = dist.cumsum(dim=-1)
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
    last_nonzero = V - 1 - (dist > 0).flip(-1).long().argmax(dim=-1)
    return torch.minimum(drawn, last_nonzero)


def verify_sampling_batch(draft_tokens: Tensor, target_probs: Tensor, q: Tensor | SparseQ,
                          generators: Generators = None, lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Lossless outcomes ``(j[B], t*[B])`` for ``draft_tokens[B, K]``, ``target_probs[B, K+1, V]`` and the
    proposal ``q``: dense ``[B, K, V]`` or sparse ``(ids[B, K, S], p[B, K, S])``."""
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    if target_probs.shape != (B, K + 1, V):
        raise ValueError(f"target_probs must be [{B}, {K + 1}, V], got {tuple(target_probs.shape)}")
    dense = isinstance(q, Tensor)
    q_shape = q.shape if dense else q[0].shape
    if q_shape[:2] != (B, K) or (dense and q_shape[2] != V) or (not dense and q[0].shape != q[1].shape):
        raise ValueError(f"q must be [{B}, {K}, {V}] or matching (ids, p) of [{B}, {K}, S]")
    lengths, active = _active(lengths, B, K, draft_tokens.device)
    u = _uniforms(B, K + 1, generators, target_probs.device)
    p = target_probs.double()
    x = draft_tokens.long()[..., None]

    p_x = p[:, :K].gather(2, x).squeeze(2)
    if dense:
        q_x = q.double().gather(2, x).squeeze(2)
    else:
        ids, q_p = q[0].long(), q[1].double()
        q_x = torch.where(ids == x, q_p, 0.0).sum(dim=2)
    if bool(((q_x <= 0) & active).any()):
        raise ValueError("a drafted token has q(x) = 0 under the proposal it came with: wrong q for these tokens")

    # Accept x_i with probability min(1, p(x_i) / q(x_i)): u < p/q, written u*q < p to avoid dividing.
    accept = (u[:, :K] * q_x < p_x) & active
    j = accept.long().cumprod(dim=1).sum(dim=1)
    rejected = j < lengths

    rows = torch.arange(B, device=p.device)
    p_j = p[rows, j]
    at = j.clamp(max=max(K - 1, 0))
    if K == 0:
        q_j = torch.zeros_like(p_j)
    elif dense:
        q_j = q.double()[rows, at]
    else:
        q_j = torch.zeros_like(p_j).scatter_add_(1, ids[rows, at], q_p[rows, at])
    # On rejection t* ~ normalize(max(0, p - q)): together with the accepted mass min(p, q) this restores p.
    # After full acceptance the bonus token is a fresh draw from p.
    residual = (p_j - q_j).clamp_min(0.0)
    dist = torch.where(rejected[:, None], residual, p_j)
    dist = torch.where((dist.sum(dim=1) > 0)[:, None], dist, p_j)
    return j, _inverse_cdf(dist, u[:, K])


def verify_sampling(draft_tokens: Tensor, target_probs: Tensor,
                    q: Tensor | Sequence[tuple[Sequence[int] | Tensor, Sequence[float] | Tensor]],
                    generator: torch.Generator | None = None) -> tuple[int, int]:
    """One sequence: ``draft_tokens[K]``, ``target_probs[K+1, V]``, ``q`` dense ``[K, V]`` or a list of K
    sparse ``(ids, p)`` supports."""
    K = draft_tokens.shape[0]
    if isinstance(q, Tensor):
        q_b: Tensor | SparseQ = q.reshape(1, K, q.shape[-1])
    else:
        if len(q) != K:
            raise ValueError(f"got {len(q)} proposal rows for {K} drafted tokens")
        S = max((len(ids) for ids, _ in q), default=0)
        ids = torch.zeros(1, K, S, dtype=torch.int64)
        probs = torch.zeros(1, K, S, dtype=torch.float64)
        for i, (row_ids, row_p) in enumerate(q):
            ids[0, i, :len(row_ids)] = torch.as_tensor(row_ids, dtype=torch.int64)
            probs[0, i, :len(row_p)] = torch.as_tensor(row_p, dtype=torch.float64)
        q_b = (ids, probs)
    j, t = verify_sampling_batch(draft_tokens.reshape(1, K), target_probs[None], q_b, generator)
    return int(j[0]), int(t[0])
