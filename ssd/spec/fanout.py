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
* ``outcome_fanout`` is the same optimum for any distribution of the outcome ``P(j)`` (Theorem 12 is its
  i.i.d. case): ``F_j ∝ P(j)^(1/(1+r))``; ``outcome_probabilities`` gives ``P(j)`` from the conditional
  acceptance at each position.
* ``fit_power_law`` and ``estimate_acceptance`` turn measured statistics into ``r`` and ``a``.
* ``FanoutPolicy`` adjusts one draft's fan-out online from what the router measures: the split by
  ``outcome_fanout`` with the acceptance measured at each position and the fitted ``r``, the total sized so
  the draft's round fits in the target's verify, and cut while the draft's entries arrive late. For a round of
  ``k < K`` drafted tokens (``fanouts``) the split is over its ``k + 1`` outcomes only, laid out as the draft
  reads it: ``F_0..F_{k-1}``, zeros, and the bonus token's count last.
* ``default_fanout`` is what a draft runs when told nothing: ``default_budget(K)`` = 16 (K+1) forks split by
  Theorem 12 with the priors. On the default pair the hit rate grows with the budget well past the paper's
  few forks per position (0.43 at 8 forks, 0.73 at 64, K = 3: ``bench/results/fanout.json``), and the
  miss rate falls as about ``F^-0.4``, not ``F^-1``.

Plain Python and numpy: the router imports this module and must not import torch.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "FanoutPolicy",
    "acceptance_counts",
    "default_budget",
    "default_fanout",
    "estimate_acceptance",
    "fit_power_law",
    "geometric_fanout",
    "geometric_weights",
    "outcome_fanout",
    "outcome_probabilities",
    "uniform_fanout",
]

PRIOR_ACCEPTANCE = 0.6   # per position, before any is measured
R_PRIOR = 0.4            # miss(F) ~ F^-r: measured on the default pair (bench/fanout.py), 0.3-0.5 by position
FORKS_PER_POSITION = 16  # the default budget per acceptance position
FIRST_WINDOW = 8         # the router's policies first adjust after this many lookups (then every 32): a new
                         # stack's draft starts at its whole budget, whose round outlasts a verify on the
                         # default pair (64 forks: 1.1 verifies), and one 32-lookup window of late rounds was
                         # most of a 128-token request (12 of 46 rounds hit on a fresh stack, 2026-12-04)


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


def outcome_probabilities(acceptance: Sequence[float]) -> list[float]:
    """``P(j)``, j = 0..K, for a K-token speculation whose token i+1 is accepted with probability
    ``acceptance[i]`` once tokens 1..i were: ``prod(a[:j]) (1 - a[j])``, and ``prod(a)`` at j = K."""
    if any(not 0.0 <= a <= 1.0 for a in acceptance):
        raise ValueError(f"acceptance rates must be in [0, 1], got {list(acceptance)}")
    out, reach = [], 1.0
    for a in acceptance:
        out.append(reach * (1.0 - a))
        reach *= a
    return out + [reach]


def outcome_fanout(budget: int, p_outcome: Sequence[float], r: float,
                   miss_scale: Sequence[float] | None = None) -> list[int]:
    """The fan-out maximising the hit rate ``sum_j P(j) (1 - c_j F_j^-r)`` for the outcome distribution
    ``p_outcome`` and a miss rate ``c_j F^-r`` at each position (``miss_scale`` = ``c_j``, default all 1):
    ``F_j ∝ (P(j) c_j)^(1/(1+r))``, rounded by largest remainder to sum to ``budget``. With
    ``P = outcome_probabilities([a] * K)`` and no scales it is ``geometric_fanout(K, budget, a, r)``."""
    if not p_outcome:
        raise ValueError("p_outcome needs one probability per acceptance position")
    _check(len(p_outcome) - 1, budget)
    if not r > 0.0:
        raise ValueError(f"power-law exponent r must be > 0, got {r}")
    if any(p < 0 for p in p_outcome) or not sum(p_outcome) > 0:
        raise ValueError(f"p_outcome must be >= 0 with a positive sum, got {list(p_outcome)}")
    scale = [1.0] * len(p_outcome) if miss_scale is None else list(miss_scale)
    if len(scale) != len(p_outcome) or any(not c > 0 for c in scale):
        raise ValueError(f"miss_scale needs one positive value per position, got {scale}")
    w = [(p * c) ** (1.0 / (1.0 + r)) for p, c in zip(p_outcome, scale)]
    return _largest_remainder([x / sum(w) for x in w], budget)


def default_budget(K: int) -> int:
    """The forks per round a draft prepares when told nothing: ``FORKS_PER_POSITION`` per acceptance position."""
    _check(K, 0)
    return FORKS_PER_POSITION * (K + 1)


def default_fanout(K: int, budget: int | None = None) -> list[int]:
    """A draft's own fan-out: ``budget`` (default ``default_budget(K)``) split by Theorem 12 with the priors."""
    return geometric_fanout(K, default_budget(K) if budget is None else budget, PRIOR_ACCEPTANCE, R_PRIOR)


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

    * Split: ``outcome_fanout`` over ``P(j)`` from the conditional acceptance measured at each position
      (``observe_outcome(j, offered)`` for each drafted round's outcome; decayed counts with ``prior_acceptance``
      as a prior of ``prior_strength`` rounds per position), and the exponent ``r`` fitted to the measured miss
      rate at each fork count: ``observe_lookup(forks, hit, position)`` for an outcome ``j = position`` the draft
      had published ``forks`` candidates for. ``r_prior`` until some fork count above 1 has ``min_lookups``
      observations (counts decay by ``decay`` per observation, so ``r`` follows the text). Each position's miss
      rate is ``c_j F^-r``, ``c_j`` its measured misses over what ``F^-r`` predicted for its lookups (``miss_scale``;
      decayed by ``position_decay`` per lookup, ``position_prior`` lookups of ``c = 1`` as a prior), and the split
      is ``F_j ∝ (P(j) c_j)^(1/(1+r))``: the positions are not alike. With the second H200 draft at K = 3 the
      draft's top candidate after full acceptance (the bonus token) was the target's 73% of the time and after a
      rejection of the first token 31% (bench/results/fanout_h200_draft2.json), so one curve for all gave the
      bonus position forks it did not need (the best split of 32 there: [18, 6, 5, 3] against [11, 8, 6, 7]).
    * Budget: forks per draft round, shared by its sequences (``fanout(sequences)``: each gets an equal share,
      between one fork per position and the draft's own ``max_budget``), since the draft's time follows their
      sum: a batch that grows shrinks every share at once. Every ``window`` lookups of drafted rounds
      (``observe_late(late)``; the first time after ``first_window``, so a new draft's first request need not wait
      a whole window of late rounds), a late fraction above ``late_high`` takes a quarter off the forks the
      window's rounds asked for, or more when the times below say fewer fit. Otherwise they are scaled so the
      draft's round takes ``headroom`` of the target's verify: by ``headroom / (draft time / verify time)`` over the window (``observe_draft(s)`` per round the
      draft published, ``observe_verify(s)`` per verify batch; at most x2 up, /4 down, never up while
      ``late_low`` or more of the window was late). The draft's time grows with its forks, so this settles where
      the round fits. With no times measured, a window under ``late_low`` late gives an eighth back (at least
      one fork). The budget stays within one fork per position (per sequence) and ``max_budget`` a round,
      however many sequences share it: a wider round does not widen the draft's work. Where draft and target
      share a memory bus (two cores of one CPU) a draft kept busy through the verify slows it, and a wide
      batch gains little from hits, since its verify waits for any one miss's JIT. On the default pair at
      batch 8, a budget grown to ``max_budget`` per sequence left SSD's verify 1.06-1.13x SD's and SSD at
      0.95-0.99x SD; capped a round, 0.96-1.03x and 1.02-1.06x (interleaved stacks, K = 3:
      bench/results/round_cap_ab.jsonl).
    """

    def __init__(self, k: int, max_budget: int, r_prior: float = R_PRIOR, window: int = 32, late_high: float = 0.1,
                 late_low: float = 0.03, decay: float = 0.98, min_lookups: float = 20.0,
                 prior_acceptance: float = PRIOR_ACCEPTANCE, prior_strength: float = 4.0, headroom: float = 0.8,
                 first_window: int | None = None, position_decay: float = 0.998, position_prior: float = 4.0):
        _check(k, max_budget)
        if not r_prior > 0:
            raise ValueError(f"r_prior must be > 0, got {r_prior}")
        if window < 1 or not 0 <= late_low <= late_high <= 1:
            raise ValueError("need window >= 1 and 0 <= late_low <= late_high <= 1")
        if first_window is not None and first_window < 1:
            raise ValueError(f"first_window must be >= 1, got {first_window}")
        if not 0 < prior_acceptance < 1 or not prior_strength > 0:
            raise ValueError(f"need 0 < prior_acceptance < 1 and prior_strength > 0, got {prior_acceptance}, "
                             f"{prior_strength}")
        if not headroom > 0:
            raise ValueError(f"headroom must be > 0, got {headroom}")
        if not 0 < position_decay <= 1 or not position_prior > 0:
            raise ValueError(f"need 0 < position_decay <= 1 and position_prior > 0, got {position_decay}, "
                             f"{position_prior}")
        self.k, self.max_budget, self.r_prior = k, max_budget, r_prior
        self.min_budget = min(k + 1, max_budget)
        self.budget = max_budget      # forks per draft round, over its sequences
        self.window, self.late_high, self.late_low = window, late_high, late_low
        self.first_window = first_window or window   # lookups before the first adjustment
        self._due = self.first_window                # lookups the current window takes
        self.decay, self.min_lookups = decay, min_lookups
        self.prior_acceptance, self.prior_strength, self.headroom = prior_acceptance, prior_strength, headroom
        self._lookups: dict[int, float] = {}
        self._misses: dict[int, float] = {}
        self.position_decay, self.position_prior = position_decay, position_prior
        # per outcome position j: decayed lookups and misses by the forks it had
        self._pos_lookups: list[dict[int, float]] = [{} for _ in range(k + 1)]
        self._pos_misses: list[dict[int, float]] = [{} for _ in range(k + 1)]
        self._accepted = [0.0] * k
        self._offered = [0.0] * k
        self._seen = self._late = 0
        self._draft_s, self._draft_n, self._verify_s, self._verify_n = 0.0, 0, 0.0, 0
        self._asked = self._rounds = 0   # this window: forks asked for, draft rounds

    def observe_lookup(self, forks: int, hit: bool, position: int | None = None) -> None:
        """An outcome the draft had published ``forks`` candidates for, hit or not; ``position``: its j (0..K),
        for the position's own miss scale (None: only the shared exponent learns from it)."""
        for f in self._lookups:
            self._lookups[f] *= self.decay
            self._misses[f] *= self.decay
        self._lookups[forks] = self._lookups.get(forks, 0.0) + 1.0
        self._misses[forks] = self._misses.get(forks, 0.0) + (0.0 if hit else 1.0)
        if position is None:
            return
        if not 0 <= position <= self.k:
            raise ValueError(f"position must be in 0..{self.k}, got {position}")
        for lookups, misses in zip(self._pos_lookups, self._pos_misses):
            for f in lookups:
                lookups[f] *= self.position_decay
                misses[f] *= self.position_decay
        lookups, misses = self._pos_lookups[position], self._pos_misses[position]
        lookups[forks] = lookups.get(forks, 0.0) + 1.0
        misses[forks] = misses.get(forks, 0.0) + (0.0 if hit else 1.0)

    def observe_outcome(self, accepted: int, offered: int) -> None:
        """A drafted round's outcome: ``accepted`` of its ``offered`` tokens (positions past K are not counted)."""
        if not 0 <= accepted <= offered:
            raise ValueError(f"accepted ({accepted}) must lie in 0..offered ({offered})")
        for i in range(self.k):
            self._accepted[i] *= self.decay
            self._offered[i] *= self.decay
        for i in range(min(accepted + 1, offered, self.k)):
            self._offered[i] += 1.0
            self._accepted[i] += i < accepted

    def observe_draft(self, seconds: float) -> None:
        """The draft's compute for a round it published."""
        self._draft_s += seconds
        self._draft_n += 1

    def observe_verify(self, seconds: float) -> None:
        """The target's compute for a verify batch."""
        self._verify_s += seconds
        self._verify_n += 1

    def observe_late(self, late: bool) -> None:
        self._seen += 1
        self._late += late
        if self._seen < self._due:
            return
        self._due = self.window
        fraction = self._late / self._seen
        used = self._asked / self._rounds if self._rounds else self.budget   # forks per draft round
        b = self.budget
        scaled = None   # the forks whose round would take `headroom` of a verify, by this window's times
        if self._draft_n and self._verify_n and self._draft_s > 0 and self._verify_s > 0:
            ratio = (self._draft_s / self._draft_n) / (self._verify_s / self._verify_n)
            scaled = min(2.0 * used, max(used / 4.0, used * self.headroom / ratio))
        if fraction > self.late_high:   # a quarter off, or down to what the times say fits when that is less
            b = used - max(1, used // 4)
            b = b if scaled is None else min(b, scaled)
        elif scaled is not None:
            b = min(used, scaled) if fraction >= self.late_low else scaled
        elif fraction < self.late_low:
            b = used + max(1, used // 8)
        self.budget = min(self.max_budget, max(self.min_budget, round(b)))
        self._seen = self._late = 0
        self._draft_s, self._draft_n, self._verify_s, self._verify_n = 0.0, 0, 0.0, 0
        self._asked = self._rounds = 0

    def per_sequence(self, sequences: int = 1) -> int:
        """Each sequence's forks in a draft round of ``sequences``."""
        return min(self.max_budget, max(self.min_budget, self.budget // max(1, sequences)))

    def exponent(self) -> float:
        """``r`` fitted to the fork counts with enough lookups, else the prior (also when the fit is not > 0)."""
        points = [(f, self._misses[f] / n) for f, n in self._lookups.items() if f > 1 and n >= self.min_lookups]
        if not points:
            return self.r_prior
        r = fit_power_law([f for f, _ in points], [m for _, m in points])
        return r if r > 0 else self.r_prior

    def acceptance(self) -> list[float]:
        """The conditional acceptance at each position 1..K: measured, shrunk toward the prior."""
        s, a0 = self.prior_strength, self.prior_acceptance
        return [(acc + a0 * s) / (off + s) for acc, off in zip(self._accepted, self._offered)]

    def miss_scale(self, r: float | None = None) -> list[float]:
        """``c_j`` at each outcome position: its decayed misses over the misses ``F^-r`` predicted for its lookups
        (``r``: the fitted exponent by default), with ``position_prior`` lookups at ``c = 1`` as a prior."""
        r = self.exponent() if r is None else r
        out = []
        for lookups, misses in zip(self._pos_lookups, self._pos_misses):
            n = sum(lookups.values())
            expected = sum(w * max(f, 1) ** -r for f, w in lookups.items())
            prior = self.position_prior * (expected / n if n else 1.0)   # prior lookups, at the position's own forks
            out.append((sum(misses.values()) + prior) / (expected + prior))
        return out

    def fanout(self, sequences: int = 1, k: int | None = None) -> list[int]:
        """The fan-out of each sequence of a draft round of ``sequences`` that speculates on the outcomes of a
        speculation of ``k`` drafted tokens (None: K); counted toward the window (`fanouts`)."""
        k = self.k if k is None else k
        return self.fanouts(sequences, (k,))[k]

    def fanouts(self, sequences: int, ks) -> dict[int, list[int]]:
        """For each ``k`` in ``ks`` (0..K): the fan-out of a sequence of a draft round of ``sequences`` whose
        speculation being verified drafted ``k`` tokens, counted once toward the window. K+1 counts, laid out as
        the draft reads them (``ssd.engine.forks``: ``F_0..F_{k-1}`` for the rejections at positions 1..k, the last
        count for the bonus token after all k): the budget split over the ``k + 1`` outcomes such a round can have,
        ``F_k..F_{K-1}`` zero. A split over all K+1 put forks on outcomes a shorter round cannot have, which the
        draft then never grew, and sized the bonus token's for full acceptance of K, rarer than of k. In process with
        K = 5, rounds of 1 and 3 left 56% and 22% of the forks unused, and split over their own outcomes hit 0.874
        and 0.727 of the time against 0.790 and 0.713 (`bench/results/fanout_by_round_k.json`)."""
        per = self.per_sequence(sequences)
        self._asked += per * max(1, sequences)
        self._rounds += 1
        r = self.exponent()
        acceptance, scale = self.acceptance(), self.miss_scale(r)
        out = {}
        for k in ks:
            if not 0 <= k <= self.k:
                raise ValueError(f"k must be in 0..{self.k}, got {k}")
            split = outcome_fanout(per, outcome_probabilities(acceptance[:k]), r, scale[:k] + [scale[self.k]])
            out[k] = split[:k] + [0] * (self.k - k) + [split[k]]
        return out
