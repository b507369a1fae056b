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
* ``FanoutPolicy`` adjusts one draft's fan-out online from what the router measures: the split by Theorem 12
  with the measured ``a`` and ``r``, the total shrunk while the draft's entries arrive late.

Plain Python and numpy: the router imports this module and must not import torch.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "FanoutPolicy",
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


class FanoutPolicy:
    """The fan-out one draft should use, adjusted online (the router keeps one per draft and sends it with each
    round; the draft's own fan-out sizes its scratch space, so that sum is the most it can take).

    * Split: ``geometric_fanout`` with the measured acceptance ``a`` (given to ``fanout``) and the exponent ``r``
      fitted to the measured miss rate at each fork count: ``observe_lookup(forks, hit)`` for an outcome the
      draft had published ``forks`` candidates for. ``r_prior`` until some fork count above 1 has
      ``min_lookups`` observations (counts decay by ``decay`` per observation, so ``r`` follows the text).
    * Budget: the draft's own while its entries arrive in time. ``observe_late(late)`` for every lookup of a
      drafted round; every ``window`` of them, a late fraction above ``late_high`` takes a quarter off the budget
      (at least one fork, down to K + 1: one fork per position), one below ``late_low`` gives one back.
    """

    def __init__(self, k: int, max_budget: int, r_prior: float = 1.0, window: int = 32, late_high: float = 0.2,
                 late_low: float = 0.05, decay: float = 0.98, min_lookups: float = 20.0):
        _check(k, max_budget)
        if not r_prior > 0:
            raise ValueError(f"r_prior must be > 0, got {r_prior}")
        if window < 1 or not 0 <= late_low <= late_high <= 1:
            raise ValueError("need window >= 1 and 0 <= late_low <= late_high <= 1")
        self.k, self.max_budget, self.r_prior = k, max_budget, r_prior
        self.min_budget = min(k + 1, max_budget)
        self.budget = max_budget
        self.window, self.late_high, self.late_low = window, late_high, late_low
        self.decay, self.min_lookups = decay, min_lookups
        self._lookups: dict[int, float] = {}
        self._misses: dict[int, float] = {}
        self._seen = self._late = 0

    def observe_lookup(self, forks: int, hit: bool) -> None:
        for f in self._lookups:
            self._lookups[f] *= self.decay
            self._misses[f] *= self.decay
        self._lookups[forks] = self._lookups.get(forks, 0.0) + 1.0
        self._misses[forks] = self._misses.get(forks, 0.0) + (0.0 if hit else 1.0)

    def observe_late(self, late: bool) -> None:
        self._seen += 1
        self._late += late
        if self._seen < self.window:
            return
        fraction = self._late / self._seen
        self._seen = self._late = 0
        if fraction > self.late_high:
            self.budget = max(self.min_budget, self.budget - max(1, self.budget // 4))
        elif fraction < self.late_low:
            self.budget = min(self.max_budget, self.budget + 1)

    def exponent(self) -> float:
        """``r`` fitted to the fork counts with enough lookups, else the prior (also when the fit is not > 0)."""
        points = [(f, self._misses[f] / n) for f, n in self._lookups.items() if f > 1 and n >= self.min_lookups]
        if not points:
            return self.r_prior
        r = fit_power_law([f for f, _ in points], [m for _, m in points])
        return r if r > 0 else self.r_prior

    def fanout(self, a: float) -> list[int]:
        return geometric_fanout(self.k, self.budget, min(max(a, 0.01), 0.99), self.exponent())
