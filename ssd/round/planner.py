"""How much to speculate: K per round (the adaptive policy, per mode) and the fan-out each DraftRound asks a draft
for (per replica). Both learn from what rounds measure. No torch, no sockets.

K: a request that pins K always gets it; otherwise the adaptive policy's choice for the current batch size
(`ssd.spec.adaptive`), with a probe round now and then while it is 0 and an explore round at a neighbouring K.
Probes and explore rounds are decided once per verify batch and mode: sequences deciding on counters of their own
ran different K within one batch, and the target then verified it as more than one forward (the ones at K = 0 at
once, the others after their JITs), every round. At batch 16 the policy's K = 0 rounds took 1.5x the model's time
that way. An explore round holds every sequence of that mode the batch answered at the K decided for it. A probe
holds only `PROBE_SEQUENCES` of them (in turn), the rest stay at K = 0: the batch still goes as one forward (the
target lingers for the probe's JIT, ssd/round/batches.py), and a probe costs one JIT and K more positions at any
batch size. Probing the whole batch cost a whole batch's JITs and a K-times larger verify: at batch 16 three
probes in 128 rounds took 3% of the run, all of adaptive SSD's gap to plain decoding there. Rounds of such a
mixed batch are not timed for the policy's realized-time correction: the model has no term for a batch of two K.
Fan-out: the split by the acceptance measured at each position, the total by the draft's round time against the
target's verify time and by its lateness (`ssd.spec.fanout.FanoutPolicy`).
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Callable

from ssd.spec.adaptive import AdaptiveK, CostTable
from ssd.spec.backup import BackupTimings
from ssd.spec.cache import LookupReason
from ssd.spec.fanout import FIRST_WINDOW, FanoutPolicy

log = logging.getLogger("ssd.round")

PROBE_SEQUENCES = 1   # sequences of a verify batch that run a probe round (the others stay at K = 0)
HOLD_ROUNDS = 4       # verify round trips a smaller batch size must last before the choice is for it (`batch_size`)
START_K = 3           # the adaptive choice's K before anything is measured, at most the pool's (`SpeculationPlanner`)


class SpeculationPlanner:
    def __init__(self, k: int, adaptive: bool, adaptive_fanout: bool, probe_every: int, timings: BackupTimings,
                 metrics, clock: Callable[[], float], batch_seqs: Callable[[int, str], list[int]] | None = None):
        """`batch_seqs(batch, mode)`: the sequences of `mode` the verify batch `batch` holds (those a probe picks
        from)."""
        self.k = k   # the draft pool's K: the most any round drafts
        self.batch_seqs = batch_seqs or (lambda batch, mode: [])
        self.metrics, self.clock = metrics, clock
        self.adaptive: dict[str, AdaptiveK] = {}
        self.choice: dict[str, int] = {}
        self.adaptive_fanout = adaptive_fanout
        self._fanout: dict[object, FanoutPolicy] = {}   # per draft replica, made at its first round
        self._fanout_logged: dict[object, list[int]] = {}
        self._logged_at = 0.0
        if k and adaptive:
            # One set of measurements serves both modes: the verify cost table here, the draft-step line of the
            # backup timings (both fed once per message).
            self.verify_cost = CostTable()
            self.adaptive = {m: AdaptiveK(k, m, probe_every, verify=self.verify_cost, draft_step=timings.draft_step)
                             for m in ("sd", "ssd")}
            # The choice starts at the draft's default K, not the pool's deepest: nothing is measured yet, and a K > 0
            # in use stays against another whose verify size was not measured lately, so a start at K = 5 (`--k 5`)
            # came down only as explore rounds measured K = 4 and 3 (rounds of K = 5 hit 0.34 of the time at batch 1
            # on a 2-core host, K = 3's 0.67-0.69). Explore rounds climb from here where deeper pays. Alone this
            # changed nothing measurable (`bench/results/adaptive_start_ab_k5.jsonl`); with the verify costs read
            # monotone (`ssd.spec.adaptive.monotone`) the choice stayed at K = 3
            # (`bench/results/adaptive_start_monotone_ab_k5.jsonl`).
            self.choice = {m: min(k, START_K) for m in self.adaptive}
            for m in self.adaptive:   # exported from the start, not only once the choice first changes
                self.metrics.set_speculation_k(m, self.choice[m])
        # per mode: rounds at K = 0 since a probe, rounds at K > 0 since an explore round (counted per verify
        # batch), and the last decision (the verify batch it was for, the K its sequences run next)
        self.since_probe: dict[str, int] = {m: 0 for m in self.adaptive}
        self.since_explore: dict[str, int] = {m: 0 for m in self.adaptive}
        self._decided: dict[str, tuple[int, int, frozenset | None]] = {}   # (batch, K, the probing sequences)
        self._probe_turn: dict[str, int] = {m: 0 for m in self.adaptive}
        # per target: the spans (start, end) of its recent prefills and restores, by the router's clock
        self._target_busy: dict[object, deque] = {}
        # the batch size the choice is for (`batch_size`): the size held, when it was last seen at least that, and
        # a verify's round trip (decayed mean), how long a smaller size must last to be taken
        self._held_batch, self._held_at, self.round_s = 0, 0.0, 0.0

    # ---- K ----------------------------------------------------------------------------------------
    def plan_k(self, req) -> int:
        """Draft tokens for the sequence's next round: the same for every sequence of one mode whose round the same
        verify batch answered, but a probe's (a sequence just prefilled runs the choice itself). Marks the round
        `mixed` when its batch's sequences run different K."""
        req.round.mixed = False
        req.round.cached = self._cached(req)
        if req.mode == "ar":
            return 0
        if req.pinned_k or req.mode not in self.adaptive:
            return req.pinned_k or self.k
        batch = req.round.verify_batch
        if not batch:
            return self.choice.get(req.mode, self.k)
        decided = self._decided.get(req.mode)
        if decided is None or decided[0] != batch:
            decided = self._decided[req.mode] = (batch, *self._decide(req.mode, batch))
        _, k, probing = decided
        if probing is None:
            return k
        req.round.mixed = True   # not timed: a probe's batch ran two K, a measuring round's by JIT whatever `cached`
        return k if req.seq in probing else 0

    def _decide(self, mode: str, batch: int) -> tuple[int, frozenset | None]:
        """The K for the next round of one verify batch's sequences of `mode`: the choice, or a probe or an explore
        round when one is due; and for a probe by part of the batch or a measuring round of all of it, the sequences
        that run it."""
        k, policy = self.choice.get(mode, self.k), self.adaptive[mode]
        if k == 0:
            self.since_probe[mode] += 1
            if policy.measure_k:   # the whole batch at the K to be measured, as one forward (`AdaptiveK.measure_k`)
                self.since_probe[mode] = 0
                log.debug("measuring round (%s): K = %d for the whole batch", mode, policy.measure_k)
                return policy.measure_k, frozenset(self.batch_seqs(batch, mode))
            if policy.probe(self.since_probe[mode]):
                self.since_probe[mode] = 0
                return self.k, self._probers(mode, batch)
            return 0, None
        self.since_explore[mode] += 1
        other = policy.explore(self.since_explore[mode], k)
        if other is not None:
            self.since_explore[mode] = 0
            return other, None
        return k, None

    def _probers(self, mode: str, batch: int) -> frozenset | None:
        """`PROBE_SEQUENCES` of the batch's sequences, in turn over probes (None: the batch has no more)."""
        seqs = sorted(self.batch_seqs(batch, mode))
        if len(seqs) <= PROBE_SEQUENCES:
            return None
        turn = self._probe_turn[mode]
        self._probe_turn[mode] = turn + PROBE_SEQUENCES
        return frozenset(seqs[(turn + i) % len(seqs)] for i in range(PROBE_SEQUENCES))

    def draft_depth(self, req) -> int:
        """How long the chains of the sequence's DraftRound should be: the K its next round is expected to run (a
        pinned K; the adaptive choice, or the neighbour above it when the mode's next decision is due to explore
        upward), 0 (the draft's own K) without an adaptive policy. An entry longer than its round's K is cut by the
        router, so the steps past it were spent for nothing: at K = 1 of 3, two of the three branch steps. A guess
        that falls short (the choice moved before the outcome came) only shortens that one round."""
        if req.pinned_k:
            return min(req.pinned_k, self.k)
        policy = self.adaptive.get(req.mode)
        if policy is None:
            return 0
        k = self.choice.get(req.mode, self.k)
        if k == 0:   # a probe's round: the next one runs K = 0 and reads no entry, unless the choice comes back
            return 1
        return min(self.k, max(k, policy.explore_peek(self.since_explore[req.mode] + 1, k) or 0))

    def drafts_next_round(self, req) -> bool:
        """Whether the draft speculates during this round's verify (ssd, K may be above 0 next round, and the
        adaptive policy has not chosen to draft by JIT only)."""
        return self._cached(req) and (req.round.k > 0 or self.choice.get("ssd", self.k) > 0)

    def _cached(self, req) -> bool:
        """Whether the sequence's rounds speculate into the cache: ssd, and K pinned or the policy's choice says so."""
        return req.mode == "ssd" and (bool(req.pinned_k) or "ssd" not in self.adaptive or self.adaptive["ssd"].cached)

    def batch_size(self, running: int) -> int:
        """The batch size the choice is for, from the sequences running now: a larger one at once, a smaller one once
        it has lasted `HOLD_ROUNDS` verify round trips. Under a steady load a finished request's slot is empty only
        until the next request is in, and dispatches in that gap saw 7 of 8 (3 of 4): the choice moved to the other
        size bucket's K and back every few rounds (11-15 times in a 25 s run at batch 8, K = 1 at 7 and K = 0 at 8),
        each time turning speculation on for a round or three, where it does not pay, and sending the draft a
        catch-up of every feature since the sequences' last round; stints that end at another bucket count for
        neither bucket's entry backoff, so nothing stopped it (2026-12-06, `bench/results/steady_state_b48.jsonl`).
        On this host the gap lasted 80-240 ms, one to three round trips of 0.07 s; a hold of one round trip left
        the switches as they were. A batch that drains (a closed batch's end) moves down four rounds late."""
        now = self.clock()
        if running >= self._held_batch or now - self._held_at > HOLD_ROUNDS * self.round_s:
            self._held_batch, self._held_at = running, now
        return self._held_batch

    def adapt(self, running: int) -> None:
        """The adaptive choice per mode for the batch size of `running` sequences (`batch_size`; logged and exported
        when it changes)."""
        if not self.adaptive:
            return
        batch = self.batch_size(running)
        for mode, a in self.adaptive.items():
            was = (self.choice.get(mode), a.cached)
            k = a.choose(batch, self.choice.get(mode))
            if (k, a.cached) != was:
                now = self.clock()
                level = logging.INFO if now - self._logged_at > 10.0 else logging.DEBUG  # at most one line in 10 s
                self._logged_at = now if level == logging.INFO else self._logged_at
                how = "" if mode != "ssd" or k == 0 else " from the cache" if a.cached else " by JIT only"
                log.log(level, "adaptive speculation (%s, batch %d): K %s -> %d%s %s", mode, batch,
                        was[0], k, how, a.summary(batch))
            if k != self.choice.get(mode):
                self.choice[mode] = k
                self.metrics.set_speculation_k(mode, k)

    def observe_round(self, req, offered: int, accepted: int, peers: int = 1) -> None:
        """A verified round's acceptance, by where its draft tokens came from: a cache entry, a JIT for a cache miss,
        or a plain JIT (no speculation behind it: sd's rounds, ssd's by JIT only). A plain round is fed to every
        mode's policy: by JIT only, an ssd round is an sd round (the same draft and target), and ssd's own rounds
        over all (its entries and its misses' JITs) accepted less than sd's plain ones. `peers`: the drafted rounds
        its verify batch held (each weighs 1/peers: `AdaptiveK.observe_round`)."""
        source = req.round.source
        if source not in ("cache", "jit") or req.mode not in self.adaptive:
            return
        if source == "jit" and not req.round.cached:
            for mode, policy in self.adaptive.items():
                policy.observe_round(offered, accepted, "plain", shared=mode != req.mode, peers=peers)
        else:
            self.adaptive[req.mode].observe_round(offered, accepted, source, peers=peers)

    def observe_target_busy(self, target, start: float, end: float) -> None:
        """`target` computed a prefill (or a restore) from `start` to `end` (its reply's arrival less its compute;
        replies arrive in order, so the spans are kept in the order they end)."""
        if self.adaptive:
            self._target_busy.setdefault(target, deque(maxlen=64)).append((start, end))

    def observe_round_time(self, req, batch: int, start: float, end: float) -> None:
        """A sequence's round as it lived it (its previous outcome at `start` to this one at `end`) at the K it
        planned, in a batch of `batch` sequences: the policy of its mode sets its model's round time against it.
        Not a round its target spent part of on a prefill: such a round waits for another request's prompt,
        whatever its K. A target works one message at a time, so the reply of any prefill that held this round
        came before this round's outcome, and its span is known here. Left in, those waits fell on whichever K
        class the policy was running when requests arrived (at batch 4, K = 0 rounds read 1.12-1.17x the model
        and K > 0 ones 1.01-1.05x in one run), and the correction then favoured speculating where it did not
        pay. Nor a round of a mixed batch (a probe by part of it): the model's time is for one K."""
        if req.mode not in self.adaptive or req.round.mixed:
            return
        for s, e in reversed(self._target_busy.get(req.target, ())):   # newest first: ends only fall
            if e <= start:
                break
            if s < end:
                return
        self.adaptive[req.mode].observe_round_time(batch, req.round.k, end - start, req.round.cached)

    def observe_jit(self, roundtrip: float, compute: float) -> None:
        for policy in self.adaptive.values():
            policy.observe_jit(roundtrip, compute)

    def observe_verify(self, positions: int, compute: float, overhead: float, seqs: int | None = None) -> None:
        """The target's compute for a batch of `positions` over `seqs` sequences: a round trip also holds time queued
        behind prefills, which K does not change."""
        if self.adaptive:
            self.verify_cost.observe(positions, compute, overhead, seqs)
            trip = compute + max(0.0, overhead)
            self.round_s = trip if not self.round_s else 0.9 * self.round_s + 0.1 * trip
        for policy in self._fanout.values():
            policy.observe_verify(compute)

    def observe_draft_round(self, draft, compute: float) -> None:
        """A draft's compute for a round it published (its fan-out policy sizes the budget from it)."""
        policy = self._fanout.get(draft)
        if policy is not None:
            policy.observe_draft(compute)

    def observe_lookup(self, req, j: int, reason: LookupReason, batch: int | None = None, late: bool = False) -> None:
        """A drafted round's cache lookup: hit or not for the adaptive policy (with `batch`, the sequences running:
        it keeps the rate per batch size too); the outcome, late or not, and for an outcome its draft had candidates
        for (hit or no entry) how many it had, for its draft's fan-out policy. `late`: the lookup waited for the
        draft's entries (`RoundCore.resolve_wait`), so the fan-out policy counts it late whatever it found."""
        if req.mode in self.adaptive:
            self.adaptive[req.mode].observe_lookup(reason is LookupReason.HIT, batch, req.round.k)
        policy = self._fanout.get(req.draft) if req.draft is not None else None
        if policy is None:
            return
        policy.observe_outcome(j, len(req.round.tokens))
        if reason in (LookupReason.STALE, LookupReason.FORCED):
            return
        policy.observe_late(late or reason is LookupReason.LATE)
        if reason in (LookupReason.HIT, LookupReason.NO_ENTRY) and req.round.fanout:
            fan = req.round.fanout[:len(req.round.tokens)] + [req.round.fanout[-1]]
            if j < len(fan) and fan[j] > 0:
                # the position the forks were for: j, or the bonus token's (K) after full acceptance
                position = j if j < len(req.round.tokens) else policy.k
                policy.observe_lookup(fan[j], reason is LookupReason.HIT, position)

    # ---- fan-out ----------------------------------------------------------------------------------
    def round_fanouts(self, draft, sequences: int = 1, ks=None) -> dict[int, list[int]]:
        """The fan-out this round's DraftRound carries to `draft` for each of its `sequences`, per length `k` in `ks`
        (distinct) of the speculations being verified (None: the pool's K; a round of k drafted tokens has k + 1
        outcomes: `FanoutPolicy.fanouts`); empty: the draft's own."""
        if not (self.adaptive_fanout and self.k and draft.ready is not None and draft.ready.fanout):
            return {}
        policy = self._fanout.get(draft)
        if policy is None:
            policy = self._fanout[draft] = FanoutPolicy(self.k, sum(draft.ready.fanout), first_window=FIRST_WINDOW)
        fanouts = policy.fanouts(sequences, ks if ks is not None else (self.k,))
        if fanouts != self._fanout_logged.get(draft):
            self._fanout_logged[draft] = fanouts
            log.debug("fan-out for draft %s: %s per sequence of %d, by the speculation's K (%d forks a round, at most "
                      "%d a sequence, r %.2f)", getattr(draft, "address", draft), fanouts, sequences, policy.budget,
                      policy.max_budget, policy.exponent())
        return fanouts

    def forget(self, draft) -> None:
        self._fanout.pop(draft, None), self._fanout_logged.pop(draft, None)
