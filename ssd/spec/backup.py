"""Backup speculation on a cache miss, and the batch-size-aware choice between backups.

Contract
--------
* ``BackupPolicy``: ``JIT`` (the draft decodes K tokens now: good tokens, costs K draft steps on the
  critical path), ``NGRAM`` (prompt lookup from the sequence's history: free, weaker), ``NONE`` (verify
  with no draft tokens: a plain target step), ``AUTO`` (decide per round from measured timings).
* ``choose_backup(policy, batch_size, timings)`` returns JIT, NGRAM or NONE; a concrete policy is returned
  as is. AUTO follows the paper's Theorem 17 argument: a miss round costs one verify plus the backup's
  latency, so a backup is worth ``E_backup / (1 + T_backup)`` tokens per verify. With ``T_jit(b) =
  K t_d(b) / t_v(b)`` and the n-gram's latency taken as 0, JIT wins while
  ``K t_d(b) < g t_v(b)`` with ``g = E_jit / E_ngram - 1``. Both times are lines in the batch size b, so
  the crossing is a threshold ``b*`` (``jit_threshold``): JIT below it, NGRAM from it on (the caller
  verifies with no draft tokens, i.e. NONE, when the n-gram finds nothing).
* ``BackupTimings`` holds the measurements as exponential moving averages: per-step draft and verify
  times as exponentially weighted least-squares lines ``t(b) = c0 + c1 b``, and the per-token acceptance
  of each backup kind. Until a line has measurements at two distinct batch sizes its shape is the prior's,
  scaled to the measured mean. The defaults (draft step ~1/6 of a verify at b=1, growing faster with b;
  acceptance 0.7 for the model, 0.3 for the n-gram, K=4) give ``b* ~ 7``.
* The jit draft batch is taken to be the verify batch (every sequence missed), the worst case.

Plain Python: the router imports this module and must not import torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from ssd.spec.theory import expected_tokens

__all__ = ["BackupPolicy", "BackupTimings", "LinearEma", "choose_backup", "jit_threshold"]


class BackupPolicy(str, Enum):
    JIT = "jit"
    NGRAM = "ngram"
    NONE = "none"
    AUTO = "auto"


@dataclass(slots=True)
class LinearEma:
    """Exponentially weighted least-squares line ``seconds = c0 + c1 * batch_size``, with a prior line."""

    prior_intercept: float
    prior_slope: float
    decay: float = 0.95
    _w: float = field(default=0.0, repr=False)
    _sb: float = field(default=0.0, repr=False)
    _st: float = field(default=0.0, repr=False)
    _sbb: float = field(default=0.0, repr=False)
    _sbt: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if self.prior_intercept < 0 or self.prior_slope < 0 or self.prior_intercept + self.prior_slope <= 0:
            raise ValueError("the prior line must be non-negative and not identically zero")
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {self.decay}")

    def observe(self, batch_size: float, seconds: float) -> None:
        d = self.decay
        self._w = d * self._w + 1.0
        self._sb = d * self._sb + batch_size
        self._st = d * self._st + seconds
        self._sbb = d * self._sbb + batch_size * batch_size
        self._sbt = d * self._sbt + batch_size * seconds

    def coefficients(self) -> tuple[float, float]:
        if self._w == 0.0:
            return self.prior_intercept, self.prior_slope
        mb, mt = self._sb / self._w, self._st / self._w
        var = self._sbb / self._w - mb * mb
        if var > 1e-9 * (1.0 + mb * mb):
            c1 = (self._sbt / self._w - mb * mt) / var
            c0 = mt - c1 * mb
            if c1 >= 0.0 and c0 >= 0.0:
                return c0, c1
        scale = mt / (self.prior_intercept + self.prior_slope * mb)
        return self.prior_intercept * scale, self.prior_slope * scale

    def predict(self, batch_size: float) -> float:
        c0, c1 = self.coefficients()
        return c0 + c1 * batch_size


def _default_draft_step() -> LinearEma:
    return LinearEma(prior_intercept=4e-3, prior_slope=4e-4)


def _default_verify() -> LinearEma:
    return LinearEma(prior_intercept=25e-3, prior_slope=5e-4)


@dataclass(slots=True)
class BackupTimings:
    k: int = 4
    draft_step: LinearEma = field(default_factory=_default_draft_step)
    verify: LinearEma = field(default_factory=_default_verify)
    accept_jit: float = 0.7
    accept_ngram: float = 0.3
    accept_decay: float = 0.9

    def observe_draft_step(self, batch_size: int, seconds: float) -> None:
        self.draft_step.observe(batch_size, seconds)

    def observe_verify(self, batch_size: int, seconds: float) -> None:
        self.verify.observe(batch_size, seconds)

    def observe_acceptance(self, kind: BackupPolicy, accepted: int, proposed: int) -> None:
        """Fold one backup round into the EMA; record an n-gram round that found nothing as (0, K)."""
        if proposed <= 0:
            return
        rate = min(max(accepted / proposed, 0.0), 1.0)
        d = self.accept_decay
        if kind is BackupPolicy.JIT:
            self.accept_jit = d * self.accept_jit + (1.0 - d) * rate
        elif kind is BackupPolicy.NGRAM:
            self.accept_ngram = d * self.accept_ngram + (1.0 - d) * rate
        else:
            raise ValueError(f"acceptance is tracked for JIT and NGRAM backups, not {kind}")

    def relative_jit_latency(self, batch_size: int) -> float:
        """``T_jit(b)``: K draft steps in units of one verify at batch size b."""
        return self.k * self.draft_step.predict(batch_size) / self.verify.predict(batch_size)


def jit_threshold(timings: BackupTimings) -> float:
    """``b*``: JIT is the better backup for batch sizes below it; ``inf`` if always, 0 if never."""
    k = timings.k
    gain = expected_tokens(timings.accept_jit, k) / expected_tokens(timings.accept_ngram, k) - 1.0
    d0, d1 = timings.draft_step.coefficients()
    v0, v1 = timings.verify.coefficients()
    # JIT wins while  K * (d0 + d1 b) < gain * (v0 + v1 b),  i.e.  A + S b > 0:
    A = gain * v0 - k * d0
    S = gain * v1 - k * d1
    if S >= 0.0:
        return math.inf if A > 0.0 else 0.0
    return max(0.0, -A / S)


def choose_backup(policy: BackupPolicy | str, batch_size: int, timings: BackupTimings | None = None) -> BackupPolicy:
    policy = BackupPolicy(policy)
    if policy is not BackupPolicy.AUTO:
        return policy
    threshold = jit_threshold(timings if timings is not None else BackupTimings())
    return BackupPolicy.JIT if batch_size < threshold else BackupPolicy.NGRAM
