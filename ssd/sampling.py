"""Sampling: per-request parameters, the exact sampling distribution, and draws.

Contract
--------
* ``probs_from_logits(logits[B, V], params)`` returns, in float32, the exact
  distribution each row's token is drawn from; speculative verification
  compares against these rows, so nothing downstream may reshape them.
  - Greedy rows (``temperature == 0``) are one-hot on ``torch.argmax(logits)``
    (lowest index wins ties). An all-greedy batch never computes a softmax.
  - Other rows apply, in this order: ``softmax(logits / temperature)`` in
    float32; top-k (keep the k most probable, ties broken toward the lower
    token id); top-p on the top-k-renormalised distribution (keep the
    shortest most-probable prefix whose mass reaches ``top_p``, with a 1e-6
    tolerance for float rounding; ``top_p == 1`` is off); min-p (keep
    ``p >= min_p * p_max``); then renormalise. The most probable token is
    always kept. Rows may carry different parameters; work is vectorised over
    the batch.
* ``sample(probs[B, V], generators)`` draws one token per row by inverse CDF
  with one float64 uniform from that row's generator (the global RNG where
  the generator is None). A seeded row therefore yields the same tokens in any
  batch. Rows with a single nonzero entry return it and consume no randomness.
* ``to_sparse``/``to_dense``/``sample_sparse`` carry a distribution as its
  nonzero support sorted by token id; ``sample_sparse`` uses the same inverse
  CDF, so for the same generator state it picks the token ``sample`` would.
* ``is_stop``: a stop token always stops; an EOS token stops unless
  ``ignore_eos``.
* ``penalize(logits[T, V], params, tokens, prompt_len, ending, drafted)``
  applies a request's logit bias, ``min_tokens`` and its repetition,
  frequency and presence penalties (``ssd.params`` has the rules) to the
  logits of T consecutive positions after ``tokens`` (the prompt, its first
  ``prompt_len``, then the output so far): row i is the position after
  ``tokens + drafted[:i]``, penalised as if ``drafted[:i]`` were committed, so a
  verify's K+1 rows equal K+1 autoregressive steps. Float32 out; the
  operations are elementwise, so a row's values do not depend on T.
* ``token_logprobs(logits[T, V], tokens[T], n)``: each token's log-softmax
  (float32, of the logits as given) and the n most probable alternatives.
* Position-keyed draws (a seeded request's default, ``SamplingParams.coupled``):
  ``position_noise(seed, position, V)`` is a float64 vector of V independent
  Exp(1) variables that depends on the seed and the position alone (a
  splitmix64 mix of both seeds a fresh generator); ``coupled_tokens(probs[T, V],
  seed, positions)`` picks row i's token as ``argmax_x probs[i, x] / E_i(x)``
  over the support (the Gumbel-max trick in exponential form: exactly a draw
  from the row), ties to the lower id. The token at a position is then a
  function of that position's distribution, the seed and the position:
  whoever computes the distribution (AR, a verify of any K, any batch) picks
  the same token. A draft that picks with the same noise from its own q
  proposes the target's token whenever both argmaxes agree (coupling), and a
  verify accepts exactly the drafted tokens equal to the target's picks.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence

import torch
from torch import Tensor

from ssd.params import FinishReason, SamplingParams, TokenLogprob, finish_reason

__all__ = [
    "SamplingParams",
    "is_stop",
    "make_generator",
    "coupled_tokens",
    "penalize",
    "position_noise",
    "probs_from_logits",
    "sample",
    "sample_sparse",
    "to_dense",
    "token_logprobs",
    "to_sparse",
]

TOP_P_TOLERANCE = 1e-6


def _per_row(params: SamplingParams | Sequence[SamplingParams], batch: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * batch
    rows = list(params)
    if len(rows) != batch:
        raise ValueError(f"got {len(rows)} SamplingParams for a batch of {batch} rows")
    for row in rows:
        if not isinstance(row, SamplingParams):
            raise TypeError(f"expected SamplingParams, got {type(row).__name__}")
    return rows


def _one_hot_argmax(logits: Tensor) -> Tensor:
    out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    return out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)


def _filter(probs: Tensor, rows: list[SamplingParams]) -> Tensor:
    batch, vocab = probs.shape
    dev = probs.device
    top_k = torch.tensor([r.top_k if 0 < r.top_k < vocab else vocab for r in rows], device=dev)
    top_p = torch.tensor([r.top_p for r in rows], dtype=torch.float64, device=dev)
    min_p = torch.tensor([r.min_p for r in rows], dtype=torch.float32, device=dev)

    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    keep = torch.arange(vocab, device=dev)[None, :] < top_k[:, None]

    kept = (sorted_p * keep).double()
    mass = kept.sum(dim=-1, keepdim=True)
    before = torch.cat([kept.new_zeros(batch, 1), kept.cumsum(dim=-1)[:, :-1]], dim=-1) / mass
    within_p = before < (top_p - TOP_P_TOLERANCE)[:, None]
    keep &= within_p | (top_p >= 1.0)[:, None]

    keep &= sorted_p >= min_p[:, None] * sorted_p[:, :1]
    keep[:, 0] = True

    mask = torch.zeros_like(keep).scatter_(-1, order, keep)
    out = probs * mask
    return out / out.sum(dim=-1, keepdim=True)


def probs_from_logits(logits: Tensor, params: SamplingParams | Sequence[SamplingParams]) -> Tensor:
    """The float32 distribution each row's next token is drawn from (see module docstring)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    batch, vocab = logits.shape
    if vocab == 0:
        raise ValueError("logits has an empty vocabulary dimension")
    rows = _per_row(params, batch)
    greedy = [r.greedy for r in rows]
    if all(greedy):
        return _one_hot_argmax(logits)

    temps = torch.tensor([1.0 if g else r.temperature for g, r in zip(greedy, rows)],
                         dtype=torch.float32, device=logits.device)
    x = logits.float()
    x = (x - x.max(dim=-1, keepdim=True).values) / temps[:, None]
    probs = torch.softmax(x, dim=-1)
    if any(r.top_k > 0 or r.top_p < 1.0 or r.min_p > 0.0 for r in rows):
        probs = _filter(probs, rows)
    if any(greedy):
        idx = torch.tensor([i for i, g in enumerate(greedy) if g], device=logits.device)
        probs[idx] = _one_hot_argmax(logits[idx])
    return probs


def penalize(logits: Tensor, params: SamplingParams, tokens: Sequence[int], prompt_len: int,
             ending: Collection[int] = (), drafted: Sequence[int] = ()) -> Tensor:
    """``logits[T, V]`` of the positions after ``tokens + drafted[:i]`` (i = 0..T-1) with ``params``'
    penalties and biases applied (see the module docstring); ``ending``: the ids ``min_tokens`` masks."""
    T, V = logits.shape
    if len(drafted) < T - 1:
        raise ValueError(f"{T} rows need {T - 1} drafted tokens, got {len(drafted)}")
    x = logits.float()
    dev = x.device
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], device=dev)
        x = x.index_add(1, ids, torch.tensor([[b for _, b in params.logit_bias]], device=dev).expand(T, -1))
    generated = len(tokens) - prompt_len
    if params.min_tokens > generated and ending:
        held = (torch.arange(T, device=dev) + generated < params.min_tokens)[:, None]   # rows still under it
        mask = torch.zeros(V, dtype=torch.bool, device=dev)
        mask[torch.tensor(sorted(ending), device=dev)] = True
        x = x.masked_fill(held & mask, float("-inf"))
    if params.repetition_penalty == 1.0 and not params.frequency_penalty and not params.presence_penalty:
        return x
    # counts[i]: each token's occurrences in the output before row i (the committed output, then drafted[:i])
    out = torch.tensor(list(tokens[prompt_len:]) + list(drafted[:T - 1]), dtype=torch.long, device=dev)
    steps = torch.zeros(T, out.numel(), device=dev)
    steps[:, :generated] = 1.0
    if T > 1:
        steps[1:, generated:] = torch.ones(T - 1, T - 1, device=dev).tril()
    counts = torch.zeros(T, V, device=dev).index_add_(1, out, steps) if out.numel() else torch.zeros(T, V, device=dev)
    if params.repetition_penalty != 1.0:
        seen = counts > 0
        if prompt_len:
            seen[:, torch.tensor(list(tokens[:prompt_len]), dtype=torch.long, device=dev)] = True
        p = params.repetition_penalty
        x = torch.where(seen, torch.where(x > 0, x / p, x * p), x)
    if params.frequency_penalty:
        x = x - params.frequency_penalty * counts
    if params.presence_penalty:
        x = x - params.presence_penalty * (counts > 0).float()
    return x


def token_logprobs(logits: Tensor, tokens: Sequence[int], n: int, ranks: bool = False) -> list[TokenLogprob]:
    """Row i's log-probability of ``tokens[i]`` and its ``n`` most probable tokens (float32 log-softmax); with
    ``ranks``, also each token's rank (1 + how many tokens are more probable)."""
    if logits.shape[0] != len(tokens):
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(tokens)} tokens")
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen_t = lp.gather(1, torch.tensor(list(tokens), dtype=torch.long, device=lp.device)[:, None])
    chosen = chosen_t[:, 0].tolist()
    rank = ((lp > chosen_t).sum(-1) + 1).tolist() if ranks else [None] * len(chosen)
    if not n:
        return [TokenLogprob(t, c, (), r) for t, c, r in zip(tokens, chosen, rank)]
    values, ids = lp.topk(n, dim=-1)
    return [TokenLogprob(t, c, tuple(zip(i, v)), r)
            for t, c, i, v, r in zip(tokens, chosen, ids.tolist(), values.tolist(), rank)]


_M64 = 2**64 - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit ints that scatters nearby inputs."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=64)   # a verify's positions come back in the next rounds (the draft's forks too)
def position_noise(seed: int, position: int, vocab: int) -> Tensor:
    """V independent Exp(1) draws (float64, CPU) keyed by (seed, position) alone. Cached: do not modify it."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(_mix64(_mix64(seed) ^ position) >> 1)
    return -torch.rand(vocab, dtype=torch.float64, generator=gen).log()


def coupled_tokens(probs: Tensor, seed: int, positions: Sequence[int]) -> list[int]:
    """Row i's position-keyed Gumbel-max token: ``argmax probs[i] / position_noise(seed, positions[i])`` (see
    the module docstring)."""
    positions = list(positions)
    if probs.dim() != 2 or probs.shape[0] != len(positions):
        raise ValueError(f"probs must be [{len(positions)}, V], got shape {tuple(probs.shape)}")
    if not positions:
        return []
    e = torch.stack([position_noise(seed, pos, probs.shape[1]) for pos in positions]).to(probs.device)
    return (probs.double() / e).argmax(dim=-1).tolist()


def make_generator(seed: int | None) -> torch.Generator | None:
    """A CPU generator seeded with ``seed``; None when ``seed`` is None."""
    if seed is None:
        return None
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return gen


def _uniform(generator: torch.Generator | None) -> float:
    if generator is None:
        return torch.rand((), dtype=torch.float64).item()
    return torch.rand((), dtype=torch.float64, generator=generator, device=generator.device).item()


def sample(probs: Tensor, generators: Sequence[torch.Generator | None] | None = None) -> Tensor:
    """One token id per row of ``probs[B, V]``, each row using its own generator."""
    if probs.dim() != 2:
        raise ValueError(f"probs must be [batch, vocab], got shape {tuple(probs.shape)}")
    batch, vocab = probs.shape
    if generators is None:
        generators = [None] * batch
    elif len(generators) != batch:
        raise ValueError(f"got {len(generators)} generators for a batch of {batch} rows")

    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1]
    support = (probs > 0).sum(dim=-1)
    if batch and not bool(torch.all(torch.isfinite(total) & (total > 0))):
        raise ValueError("every row of probs must have finite, positive total mass")
    single = support.eq(1).tolist()

    u = [0.0 if one else _uniform(gen) for one, gen in zip(single, generators)]
    target = torch.tensor(u, dtype=torch.float64, device=probs.device) * total
    drawn = torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1).clamp_(max=vocab - 1)
    return torch.where(support.eq(1), probs.argmax(dim=-1), drawn)


def to_sparse(probs_row: Tensor) -> tuple[Tensor, Tensor]:
    """The nonzero support of a [V] distribution: (ids int64 sorted ascending, p float32)."""
    if probs_row.dim() != 1:
        raise ValueError(f"probs_row must be [vocab], got shape {tuple(probs_row.shape)}")
    ids = torch.nonzero(probs_row, as_tuple=True)[0]
    return ids.to(torch.int64), probs_row[ids].to(torch.float32)


def to_dense(ids: Tensor, p: Tensor, vocab_size: int) -> Tensor:
    """Scatter a sparse support back into a float32 [vocab_size] distribution."""
    if ids.shape != p.shape or ids.dim() != 1:
        raise ValueError(f"ids and p must be matching 1-D tensors, got {tuple(ids.shape)} and {tuple(p.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size})")
    out = torch.zeros(vocab_size, dtype=torch.float32, device=p.device)
    return out.index_put_((ids.to(torch.int64),), p.to(torch.float32))


def sample_sparse(ids: Tensor, p: Tensor, generator: torch.Generator | None = None) -> int:
    """Draw one token id from a sparse support; the same rule as :func:`sample`."""
    if ids.shape != p.shape or ids.dim() != 1 or ids.numel() == 0:
        raise ValueError("ids and p must be matching, non-empty 1-D tensors")
    nonzero = torch.nonzero(p > 0, as_tuple=True)[0]
    if nonzero.numel() == 1:
        return int(ids[nonzero[0]])
    cdf = p.double().cumsum(dim=0)
    total = cdf[-1]
    if not (torch.isfinite(total) and total > 0):
        raise ValueError("p must have finite, positive total mass")
    target = torch.tensor([_uniform(generator)], dtype=torch.float64, device=cdf.device) * total
    pos = int(torch.searchsorted(cdf, target, right=True).clamp_(max=ids.numel() - 1))
    return int(ids[pos])


def is_stop(token_id: int, params: SamplingParams, eos_token_ids: Collection[int] | int = ()) -> bool:
    """True when ``token_id`` ends the request: a stop id always, EOS unless ``ignore_eos`` (the rule of
    ``ssd.params.finish_reason``, without the length limits)."""
    eos = (eos_token_ids,) if isinstance(eos_token_ids, int) else eos_token_ids
    return finish_reason(token_id, params, eos, 0, 0, 1) in (FinishReason.STOP, FinishReason.EOS)
