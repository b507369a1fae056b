"""The draft's message handler: the draft side of the sequences routers assign to it (`DraftHandler`).

It runs in the draft service (`services/draft/service.py`, over ZeroMQ) and in process alike: all it needs
of its endpoint is `send(peer, message)` (`ssd/engine/handler.py`).

Per round a router sends `DraftRound` (the tokens committed since its last message and the speculation the
target is verifying); the draft answers with one `CacheEntries` per sequence: the next speculation for every
outcome it anticipates. On a miss a router sends `Jit` (decode up to `JitItem.room` tokens now), answered by
`JitResult`; JIT work is on the critical path, so it runs before speculative work. State changes (adds, frees,
committed deltas) apply in arrival order; a `DraftRound` overtaken by a later message for the same sequence is
stale and only its delta is applied. A sequence the draft does not know gets `Error(unknown_sequence)`: the
router then re-adds it from its committed tokens (the draft is stateless apart from rebuildable KV).

A feature-reading draft (`DraftWorker.feature_size` > 0, announced in `Ready.feature_size`) gets the target's
features with adds and committed deltas (`features` of `DraftAddItem`, `DraftRoundItem`, `JitItem`); a block
whose size is not a whole number of rows, or that the worker refuses, gets `Error(invalid_argument)` for its
sequence and is ignored (the tokens still apply). An ordinary draft ignores features.

A `DraftRound` may carry a fan-out (the router's online fan-out, F_0..F_K): its rounds fork that many
candidates per position instead of the draft's own. One the draft cannot run (not K+1 counts, or over the
budget its scratch space is sized for) gets `Error(invalid_argument)` and those rounds use the draft's own.
Each item may name a depth (`DraftRoundItem.depth`, 1..K): its chains grow only that many tokens, the K its next
round runs. A depth past the draft's K gets `Error(invalid_argument)` for its sequence, whose chains then grow K.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Callable

from ssd import wire
from ssd.constraints import Constraint
from ssd.engine.draft import DraftParams, DraftWorker
from ssd.engine.features import FeatureBlock, from_wire
from ssd.engine.handler import Handler, Sender

log = logging.getLogger("ssd.draft")


class DraftHandler(Handler):
    """The draft's logic over a `DraftWorker`."""

    log = log
    worker: DraftWorker

    def __init__(self, worker: DraftWorker, endpoint: Sender):
        super().__init__(worker, endpoint)

    def _with_features(self, peer, seq, features: wire.Features | None,
                       call: Callable[[FeatureBlock | None], None]) -> None:
        """`call(block)` with the block of `features` (None when there is none or this draft reads none). A block
        that is not whole rows, or that the worker refuses (it then changes nothing), gets Error(invalid_argument)
        for the sequence, and `call(None)` applies the rest."""
        if features is not None and self.worker.feature_size:
            try:
                call(from_wire(*features, self.worker.feature_size))
                return
            except ValueError as e:
                self._error(peer, "invalid_argument", f"features ignored: {e}", seq)
        call(None)

    def _commit(self, peer, seq, delta, features: wire.Features | None, spec=()) -> bool:
        key = (peer, seq)
        if key not in self.worker:
            self._error(peer, "unknown_sequence", f"sequence {seq} is not on this draft", seq)
            return False
        vocab = self.worker.model.cfg.vocab_size
        if any(not 0 <= t < vocab for t in (*delta, *spec)):
            self._error(peer, "invalid_argument", f"token ids must be in [0, {vocab}); sequence {seq} is unchanged",
                        seq)
            return False
        if delta or (features is not None and self.worker.feature_size):
            self._with_features(peer, seq, features, lambda block: self.worker.commit(key, list(delta), block))
        return True

    def handle(self, batch) -> None:
        jits: dict = {}    # key -> (peer, batch_id, seq, room)
        rounds: dict = {}  # key -> (peer, seq, round, spec, fanout or None, depth)
        vocab = self.worker.model.cfg.vocab_size
        for peer, msg in batch:
            if isinstance(msg, wire.DraftAdd):
                for it in msg.items:
                    key = (peer, it.seq)
                    jits.pop(key, None), rounds.pop(key, None)
                    if not it.tokens or any(not 0 <= t < vocab for t in it.tokens):
                        self._error(peer, "invalid_argument", f"tokens must be non-empty ids in [0, {vocab})", it.seq)
                        continue
                    p = it.params
                    try:
                        params = DraftParams(p.temperature, p.top_k, p.saguaro_c, p.saguaro_f, p.seed, p.coupled,
                                             p.top_p, p.min_p,
                                             Constraint(p.constraint_kind, p.constraint) if p.constraint_kind
                                             else None)
                    except ValueError as e:
                        self._error(peer, "invalid_argument", str(e), it.seq)
                        continue
                    self._with_features(peer, it.seq, it.features,
                                        lambda block: self.worker.add(key, list(it.tokens), params, block,
                                                                      it.prompt_len))
            elif isinstance(msg, wire.Free):
                for seq in msg.seqs:
                    self.worker.free((peer, seq))
                    jits.pop((peer, seq), None), rounds.pop((peer, seq), None)
            elif isinstance(msg, wire.Jit):
                for it in msg.items:
                    if self._commit(peer, it.seq, it.delta, it.features):
                        rounds.pop((peer, it.seq), None)
                        jits[(peer, it.seq)] = (peer, msg.batch_id, it.seq, it.room)
            elif isinstance(msg, wire.DraftRound):
                fanout = None
                if msg.fanout:
                    try:
                        fanout = self.worker.check_fanout(msg.fanout)
                    except ValueError as e:
                        self._error(peer, "invalid_argument", f"{e}; this round uses the draft's own")
                for it in msg.items:
                    if not self._commit(peer, it.seq, it.delta, it.features, it.spec):
                        continue
                    try:
                        depth = self.worker.check_depth(it.depth)
                    except ValueError as e:
                        self._error(peer, "invalid_argument", f"{e}; this round grows chains of the draft's K", it.seq)
                        depth = self.worker.k
                    rounds[(peer, it.seq)] = (peer, it.seq, it.round, list(it.spec), fanout, depth)
            else:
                self._error(peer, "unexpected_message", f"the draft does not handle {type(msg).__name__}")
        if jits:
            self._jit(jits)
        if rounds:
            self._speculate(rounds)

    def _jit(self, jits: dict) -> None:
        t0 = time.perf_counter()
        keys = list(jits)
        specs = self.worker.jit(keys, max(room for *_, room in jits.values()))
        elapsed = time.perf_counter() - t0
        grouped = defaultdict(list)
        for key, sp in zip(keys, specs):
            peer, batch_id, seq, room = jits[key]
            grouped[(peer, batch_id)].append((seq, sp.tokens[:room],
                                              None if sp.proposal is None else sp.proposal[:room]))
        for (peer, batch_id), items in grouped.items():
            self.endpoint.send(peer, wire.JitResult(batch_id, items, elapsed))

    def _speculate(self, rounds: dict) -> None:
        t0 = time.perf_counter()
        keys = list(rounds)
        published = self.worker.speculate([(key, rounds[key][3]) for key in keys],
                                          {key: rounds[key][4] for key in keys if rounds[key][4] is not None},
                                          {key: rounds[key][5] for key in keys})
        elapsed = time.perf_counter() - t0
        for key in keys:
            peer, seq, rnd, *_ = rounds[key]
            self.endpoint.send(peer, wire.CacheEntries(seq, rnd, published[key], elapsed))
