"""Workers coming and going, as the round core sees it: what happens to a sequence whose target or draft died,
failed a batch, came back, joined or left. The shell finds out (liveness, discovery) and calls these. No torch.

A target that dies has its sequences restored on another live target from their committed tokens (greedy output
is unchanged); with none alive they wait up to `target_wait` seconds (orphans). A draft that dies has its
sequences continue on backups and rebuild their draft KV on a live replica; one that comes back takes the
sequences without a draft.
"""
from __future__ import annotations

import logging

from ssd import wire
from ssd.round.state import Phase
from ssd.spec.backup import BackupPolicy

log = logging.getLogger("ssd.round")


class Membership:
    def __init__(self, core):
        self.core = core
        self._orphans: dict[int, tuple] = {}   # seq -> (request, Prefill or Restore, since): no live target yet
        self._drafts_alive = -1                # what ssd_drafts_alive last reported (-1: nothing yet)

    # ---- sequences without a target ---------------------------------------------------------------
    def orphan(self, req, kind) -> None:
        self._orphans.setdefault(req.seq, (req, kind, self.core.clock()))

    def adopted(self, req) -> None:
        self._orphans.pop(req.seq, None)

    def follow_orphans(self) -> None:
        if not self._orphans:
            return
        core, now = self.core, self.core.clock()
        for seq, (req, kind, since) in list(self._orphans.items()):
            if req.finish is not None or seq not in core.active:
                del self._orphans[seq]
            elif core.pool.any_alive("target"):
                core.send_prefill([req], kind)
            elif now - since > core.cfg.target_wait:
                del self._orphans[seq]
                core.fail(req, f"no target is alive (waited {core.cfg.target_wait:.0f} s)")

    # ---- targets ----------------------------------------------------------------------------------
    def target_ready(self, t) -> None:
        """`t` answered its handshake again (or for the first time after start): refuse it if it does not fit."""
        self.core.batches.target_lost(t)
        problem = self.core.pool.incompatible(t) if self.core.pool.vocab_size else None
        if problem:
            log.error("refusing %s", problem)
            t.alive = False

    def target_died(self, t) -> None:
        core = self.core
        core.batches.target_lost(t)
        moved = [r for r in core.active.values() if r.target is t]
        log.warning("target %s died: moving %d sequences to other targets", t.address, len(moved))
        for req in moved:
            core.pool.assign(req, "target", None)
            core.send_prefill([req], wire.Prefill if req.phase is Phase.PREFILL else wire.Restore)

    def target_batch_failed(self, t, problem: str) -> None:
        """A target batch failed as a whole (an exception in the target): no answer will come for what it held.
        Every sequence waiting on this target is rebuilt there from its committed tokens (what the target held
        for it may be half-updated), and fails after MAX_TARGET_FAILURES such batches (a failure that repeats)."""
        core = self.core
        log.warning("target %s: a batch failed (%s); rebuilding the sequences waiting on it", t.address, problem)
        core.batches.target_lost(t)
        waiting = [r for r in core.active.values()
                   if r.target is t and r.phase in (Phase.PREFILL, Phase.RESTORE, Phase.VERIFY)]
        for req in waiting:
            core.rebuild_on_target(req, problem)

    # ---- drafts -----------------------------------------------------------------------------------
    def draft_ready(self, d) -> None:
        core = self.core
        problem = core.pool.incompatible(d)
        if problem:
            log.error("refusing %s", problem)
            d.alive = False
            return
        core.pool.check_features(d)
        orphans = [r for r in core.active.values() if r.draft is None and r.phase is not Phase.PREFILL]
        log.info("draft %s is ready: it takes new sequences and %d without a draft", d.address, len(orphans))
        for req in orphans:
            core.add_to_draft(req)

    def draft_died(self, d) -> None:
        core = self.core
        for req in [r for r in core.active.values() if r.draft is d]:
            core.pool.assign(req, "draft", None)   # survivors rebuild draft KV from committed tokens
            if req.phase is Phase.JIT:
                core.backup(req, BackupPolicy.NGRAM)
            elif req.phase is Phase.AWAIT:
                core.resolve_wait(req, None, BackupPolicy.NGRAM)
            if req.phase is not Phase.PREFILL:
                core.add_to_draft(req)

    # ---- the pool ---------------------------------------------------------------------------------
    def joined(self, worker) -> None:
        """A worker appeared (discovery); it takes work once it is ready."""
        self.core.pool.add(worker)

    def left(self, worker) -> None:
        """A worker left the pool for good (discovery): its sequences move as if it died."""
        if worker.role == "target":
            self.target_died(worker)
        else:
            self.draft_died(worker)
            self.core.planner.forget(worker)
        self.core.pool.remove(worker)
        self.report_drafts_alive()

    def report_drafts_alive(self) -> None:
        """ssd_drafts_alive from the start on, set again whenever the count changes."""
        n = sum(p.alive for p in self.core.pool.drafts)
        if n != self._drafts_alive:
            self._drafts_alive = n
            self.core.metrics.set_drafts_alive(n)
