"""Sending what is ready, in batches: JITs for the sequences waiting on one, one Verify per target for the ready
sequences whose target is free (`BatchLedger.busy`, `linger`), and in ssd the DraftRound that speculates on each
round while the target verifies it. No torch, no sockets.
"""
from __future__ import annotations

from ssd import trace, wire
from ssd.round.features import runs
from ssd.round.state import Phase, Request
from ssd.spec.backup import BackupPolicy


class Dispatcher:
    def __init__(self, core):
        self.core = core
        self.jit_pending: list[Request] = []   # sequences whose JIT is to be asked for at the next dispatch

    def dispatch(self) -> None:
        core = self.core
        if self.jit_pending:
            self._send_jits()
        ready = [r for r in core.active.values() if r.phase is Phase.READY and not core.batches.busy(r.target)]
        if ready and core.cfg.jit_linger > 0:
            jit_targets = {r.target for r in core.active.values() if r.phase in (Phase.JIT, Phase.AWAIT)}
            waiting = {t for t in {r.target for r in ready} if t in jit_targets and core.batches.linger(t)}
            ready = [r for r in ready if r.target not in waiting]
        if not ready:
            return
        core.planner.adapt(len(core.active))
        verifies: dict = {}
        rounds: dict = {}
        for r in ready:
            r.phase = Phase.VERIFY
            verifies.setdefault(r.target, []).append(r)
            rnd = r.round
            rnd.drafted = r.draft is not None and r.draft.alive and core.planner.drafts_next_round(r)
            if rnd.drafted:
                rounds.setdefault(r.draft, []).append(
                    wire.DraftRoundItem(r.seq, rnd.number + 1, core.delta(r), rnd.tokens, core.features.take(r),
                                        core.planner.draft_depth(r)))
        for t, reqs in verifies.items():
            batch_id = core.batches.verify_sent(t, sum(len(r.round.tokens) + 1 for r in reqs))
            for r in reqs:
                r.round.verify_batch = batch_id
            items = [wire.VerifyItem(r.seq, r.round.tokens, r.round.proposal) for r in reqs]
            if trace.ON:   # the sequences the router had running: a batch of fewer left some out of step
                trace.count("active", batch_id, len(core.active))
            t.send(wire.Verify(batch_id, items, any(core.features.wanted(r) for r in reqs)))
        for d, items in rounds.items():
            # one fan-out per length of the speculations being verified: a round of k tokens has k + 1 outcomes
            by_k: dict = {}
            for it in items:
                by_k.setdefault(len(it.spec), []).append(it)
            fanouts = core.planner.round_fanouts(d, len(items), sorted(by_k))
            for k, group in by_k.items():
                fanout = fanouts.get(k, [])
                for it in group:
                    core.active[it.seq].round.fanout = fanout or None
                for run in runs(group):
                    d.send(wire.DraftRound(run, fanout))

    def _send_jits(self) -> None:
        core = self.core
        jits: dict = {}
        for req in self.jit_pending:
            if req.phase is not Phase.JIT:
                continue
            if req.draft is None or not req.draft.alive:
                core.backup(req, BackupPolicy.NGRAM)
                continue
            jits.setdefault(req.draft, []).append(wire.JitItem(req.seq, core.delta(req), core.room(req),
                                                               core.features.take(req)))
        self.jit_pending = []
        for d, items in jits.items():
            for run in runs(items):
                batch_id = core.batches.jit_sent()
                for it in run:
                    core.active[it.seq].round.jit_batch = batch_id
                d.send(wire.Jit(batch_id, run))

