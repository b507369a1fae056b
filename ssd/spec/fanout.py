"""Fan-out allocation: how many forks the draft prepares at each acceptance position.

Contract
--------
* A fan-out is a list ``F_0..F_K`` (K+1 non-negative ints) whose sum is the fixed branch budget ``B``.
  ``F_j`` is the number of candidate correction tokens the draft prepares for the outcome "j drafted
  tokens accepted"; ``F_K`` covers the bonus token after full acceptance.
* ``geometric_fanout`` is the paper's Theorem 12 allocation. With per-token acceptance rate ``a`` and a
  miss rate that falls as a power law of the fan-out, ``1 - p_hit(F) = F^(-r)``, the optimum is
  ``F_j ∝ a^(j/(1+r))`` for j < K and ``F_K ∝ a^(K/(1+r)) (1-a)^(-1/(1+r))``. The continuous shares are
  scaled to the budget and rounded by largest remainder (ties to the smaller j), so the result sums to
  the budget exactly and every ``F_j`` is within 1 of its continuous share.
* A budget smaller than K+1 cannot give every position a fork: the positions with the smallest shares get
  ``F_j = 0``, and those outcomes always miss the cache. ``min_fanout`` (default 0, the pure theorem)
  raises every position to at least that many forks, taken from the positions most above their share,
  whenever ``budget >= min_fanout * (K+1)``; otherwise it is ignored.
* ``fit_power_law`` and ``estimate_acceptance`` turn measured statistics into ``r`` and ``a``.

Plain Python and numpy: the router imports this module and must not import torch.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "acceptance_counts",
    "estimate_acceptance",
    "fit_power_law",
    "geometric_fanout",
    "geometric_weights",
    "uniform_fanout",
]


def _check(K: int, budget: int) -> None:
    if K < 0:
        raise ValueError(f"K must be >= 0, got {K}")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")


def uniform_fanout(K: int, budget: int) -> list[int]:
    """``budget`` split evenly over K+1 positions; the remainder goes to the earliest (likeliest) ones."""
    _check(K, budget)
    base, extra = divmod(budget, K + 1)
    return [base + (1 if j < extra else 0) for j in range(K + 1)]


def geometric_weights(K: int, a: float, r: float) -> list[float]:
    """The continuous Theorem-12 shares (sum 1) before scaling to a budget and rounding."""
    if not 0.0 < a < 1.0:
        raise ValueError(f"acceptance rate a must be in (0, 1), got {a}")
    if not r > 0.0:
        raise ValueError(f"power-law exponent r must be > 0, got {r}")
    if K < 0:
        raise ValueError(f"K must be >= 0, got {K}")
    e = 1.0 / (1.0 + r)
    w = [a ** (j * e) for j in range(K)]
    w.append(a ** (K * e) * (1.0 - a) ** (-e))
    total = sum(w)
    return [x / total for x in w]


def _largest_remainder(shares: Sequence[float], budget: int) -> list[int]:
    ideal = [s * budget for s in shares]
    out = [math.floor(x) for x in ideal]
    order = sorted(range(len(ideal)), key=lambda j: (-(ideal[j] - out[j]), j))
    for j in order[: budget - sum(out)]:
        out[j] += 1
    return out


def geometric_fanout(K: int, budget: int, a: float, r: float, min_fanout: int = 0) -> list[int]:
    """Theorem-12 fan-out for acceptance ``a`` and power law ``r``, summing exactly to ``budget``."""
    _check(K, budget)
    shares = geometric_weights(K, a, r)
    out = _largest_remainder(shares, budget)
    if min_fanout > 0 and budget >= min_fanout * (K + 1):
        ideal = [s * budget for s in shares]
        for j in range(K + 1):
            while out[j] < min_fanout:
                donor = max((i for i in range(K + 1) if out[i] > min_fanout),
                            key=lambda i: (out[i] - ideal[i], out[i], -i))
                out[donor] -= 1
                out[j] += 1
    return out


def fit_power_law(fanouts: Sequence[float], miss_rates: Sequence[float], eps: float = 1e-4) -> float:
    """Least-squares ``r`` in ``miss(F) = F^(-r)``: a line through the origin in log-log space.

    Points with ``F <= 1`` carry no information (``log F = 0``) and are skipped; miss rates are clipped to
    ``[eps, 1]`` so a perfect hit rate does not produce ``log 0``. Raises when no usable point remains.
    """
    if len(fanouts) != len(miss_rates):
        raise ValueError(f"got {len(fanouts)} fan-outs and {len(miss_rates)} miss rates")
    f = np.asarray(fanouts, dtype=np.float64)
    m = np.clip(np.asarray(miss_rates, dtype=np.float64), eps, 1.0)
    use = f > 1.0
    if not use.any():
        raise ValueError("fit_power_law needs at least one fan-out > 1")
    x, y = np.log(f[use]), np.log(m[use])
    return float(-(x @ y) / (x @ x))


def acceptance_counts(accepted_lengths: Iterable[int], K: int) -> tuple[list[int], list[int]]:
    """Per-position ``(accepted, offered)`` counts from round outcomes ``j`` of K-token speculations.

    Outcome ``j`` means positions ``0..j-1`` were offered and accepted and, when ``j < K``, position ``j``
    was offered and rejected; later positions were never verified.
    """
    accepted, offered = [0] * K, [0] * K
    for j in accepted_lengths:
        if not 0 <= j <= K:
            raise ValueError(f"accepted length {j} is outside 0..{K}")
        for i in range(min(j + 1, K)):
            offered[i] += 1
            accepted[i] += i < j
    return accepted, offered


def estimate_acceptance(accepted: Sequence[int], offered: Sequence[int], prior: float = 0.7,
                        prior_strength: float = 20.0, bounds: tuple[float, float] = (0.01, 0.99)) -> float:
    """Per-token acceptance rate ``a`` pooled over positions, shrunk toward ``prior``.

    Under the i.i.d. acceptance model every verified token is accepted with probability ``a``; the
    estimate is the Beta-posterior mean ``(sum accepted + prior * s) / (sum offered + s)`` with
    ``s = prior_strength`` pseudo-observations, so a handful of rounds moves it only a little. The result
    is clipped to ``bounds`` to stay a valid input to ``geometric_fanout``.
    """
    if len(accepted) != len(offered):
        raise ValueError(f"got {len(accepted)} accepted and {len(offered)} offered counts")
    acc, off = sum(accepted), sum(offered)
    if acc < 0 or acc > off:
        raise ValueError(f"accepted ({acc}) must lie in 0..offered ({off})")
    a = (acc + prior * prior_strength) / (off + prior_strength) if off + prior_strength > 0 else prior
    return min(max(a, bounds[0]), bounds[1])
