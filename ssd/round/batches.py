"""The batches the core has out: verify batches per target (and when each went), JIT batches, and the two rules
that decide when ready sequences go to their target. No torch, no sockets.

Verify hold (`busy`): a target with `verify_inflight` batches out takes no new one. Sequences that become ready
meanwhile wait instead of queueing at the target as batches of their own: the target runs one forward at a time,
so they would wait as long either way, and sent together when its answer arrives they join the answered
sequences in one forward. Without this, sequences that fall out of step (a prefill, a cache miss) stay in
separate cohorts for good, each a forward of its own, every round. A batch out longer than `verify_hold` seconds
stops counting (a lost answer must not stall its target).

JIT linger (`linger`): a free target whose sequences partly wait for a JIT waits about one JIT round trip
(measured; at most `jit_linger`) before verifying the rest, so the two groups go together instead of staying
apart (each a forward every round).
"""
from __future__ import annotations

import itertools
import logging
from typing import Callable

log = logging.getLogger("ssd.round")

MAX_JITS_KEPT = 4096   # JIT batches remembered: answers lost with a draft that died are forgotten, oldest first


class BatchLedger:
    def __init__(self, clock: Callable[[], float], verify_inflight: int, verify_hold: float, jit_linger: float):
        self.clock = clock
        self.verify_inflight, self.verify_hold, self.jit_linger = verify_inflight, verify_hold, jit_linger
        self._ids = itertools.count(1)
        self._sent_at: dict[int, tuple[float, int]] = {}   # verify batch id -> (sent at, positions)
        self._out: dict[object, set[int]] = {}            # target -> its verify batches not answered yet
        self._lingering: dict[object, float] = {}         # target -> since when it waits for JITs of its sequences
        self._jit_sent: dict[int, float] = {}             # JIT batch id -> sent at
        self.jit_latency = 0.02                           # EMA of a JIT's round trip, seconds (prior 20 ms)

    # ---- verify batches ---------------------------------------------------------------------------
    def verify_sent(self, target, positions: int) -> int:
        """A new verify batch id for `target`, holding `positions` verified positions."""
        batch_id = next(self._ids)
        self._lingering.pop(target, None)
        self._sent_at[batch_id] = (self.clock(), positions)
        self._out.setdefault(target, set()).add(batch_id)
        return batch_id

    def verify_answered(self, target, batch_id: int) -> tuple[float, int] | None:
        """(sent at, positions) of an answered batch, or None if it was not out (answered before or never sent)."""
        self._out.get(target, set()).discard(batch_id)
        return self._sent_at.pop(batch_id, None)

    def target_lost(self, target) -> None:
        """Whatever `target` had out will not be answered (it died or failed) or was lost (it came back)."""
        for batch_id in self._out.pop(target, set()):
            self._sent_at.pop(batch_id, None)

    def busy(self, target) -> bool:
        """Whether `target` already has `verify_inflight` verify batches out (see the module docstring)."""
        out = self._out.get(target) if target is not None else None
        if not self.verify_inflight or not out:
            return False
        now = self.clock()
        for batch_id in [b for b in out if now - self._sent_at.get(b, (now,))[0] > self.verify_hold]:
            out.discard(batch_id)
            log.debug("verify batch %d to %s unanswered for over %.1f s: no longer holding sequences back", batch_id,
                      getattr(target, "address", target), self.verify_hold)
        return len(out) >= self.verify_inflight

    def linger(self, target) -> bool:
        """Whether free `target` should wait before verifying what is ready, because some of its sequences wait
        for a JIT (see the module docstring)."""
        now = self.clock()
        since = self._lingering.setdefault(target, now)
        return now - since < min(self.jit_linger, 1.5 * self.jit_latency)

    def linger_ends(self) -> float | None:
        """When the earliest linger still running ends (the clock's time), None when no target lingers: the
        loop that carries the core must pass again then, even if no message comes."""
        now, window = self.clock(), min(self.jit_linger, 1.5 * self.jit_latency)
        ends = [since + window for since in self._lingering.values() if since + window > now]
        return min(ends, default=None)

    # ---- JIT batches ------------------------------------------------------------------------------
    def jit_sent(self) -> int:
        batch_id = next(self._ids)
        self._jit_sent[batch_id] = self.clock()
        if len(self._jit_sent) > MAX_JITS_KEPT:
            del self._jit_sent[next(iter(self._jit_sent))]
        return batch_id

    def jit_answered(self, batch_id: int) -> float | None:
        """The round trip of an answered JIT batch (None if it was not out); feeds the latency EMA."""
        sent = self._jit_sent.pop(batch_id, None)
        if sent is None:
            return None
        roundtrip = self.clock() - sent
        self.jit_latency = 0.9 * self.jit_latency + 0.1 * roundtrip
        return roundtrip
