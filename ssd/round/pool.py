"""The workers the round core uses, and which sequences each holds. No torch, no sockets.

A worker handle is anything with `role` ("target" | "draft"), `address` (for messages), `alive`, `ready` (its
`wire.Ready`, or None before the handshake) and `send(msg)`: the router's ZeroMQ peers, or the in-process
engine's local workers. Sequences are sharded least-loaded first, so new replicas fill up first.
"""
from __future__ import annotations

import logging

log = logging.getLogger("ssd.round")


class StartupError(RuntimeError):
    """The core cannot serve with the workers it was given; the message says why and what to do."""


class WorkerPool:
    def __init__(self, targets: list, drafts: list, tokenizer_hash: str):
        self.targets, self.drafts = list(targets), list(drafts)
        self.tokenizer_hash = tokenizer_hash
        self.load: dict = {p: 0 for p in self.targets + self.drafts}
        self.vocab_size = 0
        self.hidden_size = 0   # the targets' (Ready.feature_size): 2 x this is the byte size of a feature row
        self.k = 0             # the draft pool's K
        self.max_len = 0

    def configure(self) -> None:
        """Take the model's shape from a live target and K from the drafts, once every worker is ready; raise
        StartupError if they do not fit together."""
        t = self.target.ready
        self.vocab_size, self.hidden_size = t.vocab_size, t.feature_size
        self.k = self.drafts[0].ready.k if self.drafts else 0
        peers = [*self.targets, *self.drafts]
        for p in peers:
            problem = self.incompatible(p)
            if problem:
                raise StartupError(problem)
        for d in self.drafts:
            self.check_features(d)
        self.max_len = min(p.ready.max_len for p in peers)

    @property
    def target(self):
        """A live target (else the first known one): what describes the model."""
        return next((t for t in self.targets if t.alive), self.targets[0] if self.targets else None)

    def add(self, worker) -> None:
        (self.targets if worker.role == "target" else self.drafts).append(worker)
        self.load[worker] = 0

    def remove(self, worker) -> None:
        (self.targets if worker.role == "target" else self.drafts).remove(worker)
        self.load.pop(worker, None)

    def any_alive(self, role: str) -> bool:
        return any(p.alive for p in (self.targets if role == "target" else self.drafts))

    def pick(self, role: str):
        """The live worker of `role` holding the fewest sequences (None if none is alive)."""
        live = [p for p in (self.targets if role == "target" else self.drafts) if p.alive]
        return min(live, key=lambda p: self.load[p]) if live else None

    def assign(self, req, role: str, worker) -> None:
        """Pin `req` to `worker` as its target or draft (None: to none), keeping the load counts."""
        old = getattr(req, role)
        if old is not None and old in self.load:
            self.load[old] -= 1
        if worker is not None:
            self.load[worker] += 1
        setattr(req, role, worker)

    def incompatible(self, p) -> str | None:
        """Why a worker cannot join (None if it can): tokenizer, vocabulary, K."""
        r = p.ready
        if r.tokenizer_hash != self.tokenizer_hash or r.vocab_size != self.vocab_size:
            what = "a draft must share the target's tokenizer" if p.role == "draft" else \
                "point router and targets at the same model folder"
            return (f"{p.role} at {p.address} ({r.model_id}) has tokenizer {r.tokenizer_hash[:12]} and vocabulary "
                    f"{r.vocab_size}; the router serves {self.tokenizer_hash[:12]} and {self.vocab_size}: {what}")
        if p.role == "draft" and r.k != self.k:
            return f"draft at {p.address} speculates K={r.k}; the pool uses K={self.k}"
        return None

    def check_features(self, d) -> None:
        """Log a draft that reads features of another size than the targets' hidden size: it gets none."""
        size = d.ready.feature_size
        if size and size != self.hidden_size:
            log.error("draft at %s (%s) reads features of size %d, but the targets' hidden size is %d: it gets no "
                      "features (worse proposals; output unchanged)", d.address, d.ready.model_id, size,
                      self.hidden_size)

    def reads_features(self, d) -> bool:
        return d is not None and d.ready is not None and 0 < d.ready.feature_size == self.hidden_size
