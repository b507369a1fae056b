"""The draft's proposal distribution q: what each drafted token is drawn from, and what verification uses.

Contract
--------
* ``proposal_probs(logits[N, V], temperature, top_k, saguaro_c, saguaro_f)`` returns float32 rows:
  temperature 0 is one-hot on the argmax (lowest id on ties) and nothing else applies; otherwise
  ``softmax(logits / T)``, optional top-k truncation renormalised (``ssd.sampling.probs_from_logits``,
  ties toward the lower id), then Saguaro reshaping.
* Saguaro reshaping (``saguaro_reshape``) multiplies the ``F+1`` most probable entries of each row by
  ``C`` and renormalises. On a rejection at position j the target's correction token is drawn from
  ``max(0, p - q)``; with ``C < 1`` the draft puts less mass on its own top tokens, so the residual there
  grows and the correction token more often lands among the draft's top-F forks (the F+1 most probable
  tokens minus the rejected drafted one): more cache hits, bought with some acceptance. ``C = 1`` is the
  identity. When a row's support has at most F+1 tokens every entry is scaled alike and it is unchanged.
* Any q keeps verification lossless provided the draft samples from exactly the q it ships and the
  verifier uses exactly that q. ``sparse_support`` returns the nonzero support ``(ids ascending, p)`` of
  each row: the wire form; with top-k it has at most k entries, without it the whole vocabulary.
* ``draw(logits, params, generators)`` is how the draft does that: one token per row from the q of the row's
  draft parameters, returned with q's sparse support as lists (the argmax and None when every row is greedy).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ssd.sampling import SamplingParams, probs_from_logits, sample

__all__ = ["densify", "draw", "proposal_probs", "saguaro_reshape", "sparse_support"]


def saguaro_reshape(probs: Tensor, c: float, f: int) -> Tensor:
    """Scale each row's top-(f+1) probabilities by ``c`` and renormalise (identity at ``c == 1``)."""
    if not c > 0.0:
        raise ValueError(f"Saguaro factor C must be > 0, got {c}")
    if f < 0:
        raise ValueError(f"Saguaro fan-out F must be >= 0, got {f}")
    if c == 1.0:
        return probs
    top = min(f + 1, probs.shape[-1])
    order = probs.sort(dim=-1, descending=True, stable=True).indices[..., :top]
    scale = torch.ones_like(probs).scatter_(-1, order, c)
    out = probs * scale
    return out / out.sum(dim=-1, keepdim=True)


def proposal_probs(logits: Tensor, temperature: float, top_k: int = 0, saguaro_c: float = 1.0,
                   saguaro_f: int = 0) -> Tensor:
    """The exact float32 distribution q each row's drafted token is drawn from (module docstring)."""
    probs = probs_from_logits(logits, SamplingParams(temperature=temperature, top_k=top_k))
    if temperature == 0.0:
        return probs
    return saguaro_reshape(probs, saguaro_c, saguaro_f)


def sparse_support(probs: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Per row of ``probs[N, V]``: ``(ids int64 ascending, p float32)`` over the nonzero entries."""
    if probs.dim() != 2:
        raise ValueError(f"probs must be [N, V], got shape {tuple(probs.shape)}")
    out = []
    for row in probs:
        ids = torch.nonzero(row, as_tuple=True)[0]
        out.append((ids, row[ids].to(torch.float32)))
    return out


def densify(support: list[tuple[Tensor, Tensor]], vocab_size: int) -> Tensor:
    """Inverse of ``sparse_support``: ``[N, vocab_size]`` float32 rows, zero off the support."""
    out = torch.zeros(len(support), vocab_size, dtype=torch.float32)
    for i, (ids, p) in enumerate(support):
        out[i, torch.as_tensor(ids, dtype=torch.int64)] = torch.as_tensor(p, dtype=torch.float32)
    return out


def draw(logits: Tensor, params: list, generators: list) -> tuple[list[int], list | None]:
    """One token per row of ``logits[N, V]`` from the q of ``params[n]`` (a draft's temperature, top_k,
    saguaro_c, saguaro_f) with ``generators[n]``; returns the tokens and each row's sparse support
    ``(ids, probs)`` as lists, or the argmax and None when every row is greedy."""
    if all(p.temperature == 0 for p in params):
        return logits.argmax(-1).tolist(), None
    groups: dict[tuple, list[int]] = {}
    for b, p in enumerate(params):
        groups.setdefault((p.temperature, p.top_k, p.saguaro_c, p.saguaro_f), []).append(b)
    if len(groups) == 1:
        q = proposal_probs(logits, *next(iter(groups)))
    else:
        q = torch.empty_like(logits)
        for key, rows in groups.items():
            q[rows] = proposal_probs(logits[rows], *key)
    tokens = sample(q, generators).tolist()
    support = [(ids.tolist(), ps.tolist()) for ids, ps in sparse_support(q)]
    return tokens, support
