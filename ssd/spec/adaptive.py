"""Adaptive speculation: the K that maximises predicted throughput, from what the router measures.

Contract
--------
* ``AdaptiveK(k_max, mode)`` folds in measurements as they arrive:
  - ``observe_round(offered, accepted)``: one verification of ``offered`` draft tokens (from the draft:
    cache entries or JIT, not n-gram) of which the first ``accepted`` were accepted. Kept per position as
    the conditional acceptance ``a_i = P(token i accepted | tokens 1..i-1 accepted)``, an EMA with a prior.
  - ``observe_verify(tokens, seconds)``: one verify batch of ``tokens`` positions (sum over its sequences of
    drafted + 1) and its round trip as the router saw it: a line ``t_v(n) = c0 + c1 n`` (``LinearEma``).
  - ``observe_draft_step(batch, seconds)``: one draft step (a JIT batch's time / K): a line in the batch size.
  - ``observe_lookup(hit)``: whether a speculation-cache lookup hit (ssd mode).
* ``choose(batch)`` returns the K in ``0..k_max`` that maximises the predicted tokens per second of a batch of
  ``batch`` sequences (Theorem 7 with measured terms):

      E(K) = 1 + a_1 + a_1 a_2 + ... + a_1...a_K                 (tokens per sequence per round)
      T(K) = t_v(batch (K + 1)) + D(K)                           (seconds per round)
      D(K) = K t_d(batch)            in sd mode (the draft runs before every verify)
           = (1 - h) K t_d(batch)    in ssd mode (only a cache miss waits for a JIT draft; h = hit rate)

  K = 0 is plain decoding (E = 1, no draft work): speculation is turned off where it does not pay, which
  depends on the batch size through ``t_v`` and ``t_d``.
* While K = 0 is chosen, ``probe(rounds_since_probe)`` says when a sequence should run one round at ``k_max``
  anyway, so the acceptance estimate stays current and speculation comes back when the draft starts paying
  (a different kind of text, a better draft). The interval starts at ``probe_every`` rounds and doubles with
  each probe that leaves speculation off, up to ``max_probe_every`` (a draft that never pays costs ever less);
  it returns to ``probe_every`` as soon as K > 0 is chosen again.
* With no measurement yet, the prior (acceptance 0.6 per position, a draft step 1/6 of a verify) picks a
  K > 0: speculation starts on and turns itself down from evidence.

Output never depends on K (the target decides every token); only speed does. Plain Python: the router
imports this module.
"""
from __future__ import annotations

from ssd.spec.backup import LinearEma

__all__ = ["AdaptiveK"]


class AdaptiveK:
    def __init__(self, k_max: int, mode: str = "ssd", probe_every: int = 16, prior_acceptance: float = 0.6,
                 decay: float = 0.97, max_probe_every: int = 256, verify: LinearEma | None = None,
                 draft_step: LinearEma | None = None):
        """`verify` and `draft_step`: measurement lines shared with other users (the router feeds each once);
        by default this instance keeps its own."""
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        if mode not in ("sd", "ssd"):
            raise ValueError(f"mode must be sd or ssd, got {mode!r}")
        self.k_max, self.mode, self.probe_every, self.decay = k_max, mode, probe_every, decay
        self.max_probe_every = max(probe_every, max_probe_every)
        self.probe_interval = probe_every
        self.acceptance = [prior_acceptance] * k_max   # conditional, per position 1..k_max
        self.hit = 0.5 if mode == "ssd" else 0.0
        self.verify = verify if verify is not None else self.default_verify_line()
        self.draft_step = draft_step if draft_step is not None else LinearEma(prior_intercept=4e-3, prior_slope=4e-4)
        self.rounds = 0

    @staticmethod
    def default_verify_line() -> LinearEma:
        """Verify round trip in seconds against the positions in the batch, with its prior."""
        return LinearEma(prior_intercept=25e-3, prior_slope=1e-3)

    # ---- measurements ---------------------------------------------------------------------------
    def observe_round(self, offered: int, accepted: int) -> None:
        if offered <= 0:
            return
        d = self.decay
        self.rounds += 1
        for i in range(min(offered, self.k_max)):  # position i+1 was reached iff the first i were accepted
            if i > accepted:
                break
            self.acceptance[i] = d * self.acceptance[i] + (1 - d) * (1.0 if accepted > i else 0.0)

    def observe_verify(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.verify.observe(tokens, seconds)

    def observe_draft_step(self, batch: int, seconds: float) -> None:
        if batch > 0 and seconds > 0:
            self.draft_step.observe(batch, seconds)

    def observe_lookup(self, hit: bool) -> None:
        d = self.decay
        self.hit = d * self.hit + (1 - d) * (1.0 if hit else 0.0)

    # ---- the decision ----------------------------------------------------------------------------
    def expected_tokens(self, k: int) -> float:
        total, p = 1.0, 1.0
        for a in self.acceptance[:k]:
            p *= a
            total += p
        return total

    def round_seconds(self, batch: int, k: int) -> float:
        draft = k * self.draft_step.predict(batch)
        if self.mode == "ssd":
            draft *= 1.0 - self.hit
        return self.verify.predict(batch * (k + 1)) + draft

    def throughput(self, batch: int, k: int) -> float:
        """Predicted tokens per second of a batch running K."""
        return batch * self.expected_tokens(k) / self.round_seconds(batch, k)

    def choose(self, batch: int) -> int:
        batch = max(1, batch)
        k = max(range(self.k_max + 1), key=lambda k: (self.throughput(batch, k), -k))
        if k > 0:
            self.probe_interval = self.probe_every
        return k

    def probe(self, rounds_since_probe: int) -> bool:
        """Whether a sequence that ran `rounds_since_probe` rounds with speculation off should probe now (a probe
        lengthens the interval for the next ones)."""
        if rounds_since_probe < self.probe_interval:
            return False
        self.probe_interval = min(self.max_probe_every, 2 * self.probe_interval)
        return True

    def summary(self, batch: int) -> dict:
        return {"k": self.choose(batch), "acceptance": [round(a, 3) for a in self.acceptance],
                "hit": round(self.hit, 3), "verify": self.verify.coefficients(),
                "draft_step": self.draft_step.coefficients(),
                "throughput": [round(self.throughput(max(1, batch), k), 2) for k in range(self.k_max + 1)]}
