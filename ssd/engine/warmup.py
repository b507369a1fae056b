"""Warming a worker up before it serves: a throwaway sequence through the calls a request makes, then freed.

torch's first forward of each shape is slow (allocations, kernel choice): the default draft's first 3-token JIT
took ~150 ms where a warm one takes ~30, and the router's adaptive speculation took that first JIT as its
draft-step time, so SD started with speculation off until its first probe. A worker shell warms its worker up
before it announces Ready (`ssd.worker.service.run_worker`), so the first request's timings are real ones.

Both leave nothing behind: the sequence is freed, the prefix cache neither asked nor filled, the statistics a
worker reports as they were. A tensor-parallel target is not warmed up (its ranks would have to mirror the
switch of the prefix cache too).
"""
from __future__ import annotations

import dataclasses

from ssd.engine.draft import DraftParams
from ssd.sampling import SamplingParams
from ssd.wire.target import VerifyItem

WARM_SEQ = -1          # no request has a negative sequence id
WARM_PROMPT = 32       # tokens of the throwaway prompt


def _prompt(vocab_size: int) -> list[int]:
    return [(7 * i + 3) % vocab_size for i in range(WARM_PROMPT)]


class _Untouched:
    """Holds a worker's prefix-cache switch off and puts its reported statistics back afterwards."""

    def __init__(self, worker, counters: tuple[str, ...]):
        self.worker, self.counters = worker, counters

    def __enter__(self):
        w = self.worker
        self.stats = dataclasses.replace(w.prefix_stats)
        self.values = {name: getattr(w, name) for name in self.counters if hasattr(w, name)}
        self.caching = w.prefix_caching
        w.prefix_caching = False

    def __exit__(self, *exc):
        w = self.worker
        w.prefix_caching = self.caching
        for f in dataclasses.fields(self.stats):
            setattr(w.prefix_stats, f.name, getattr(self.stats, f.name))
        for name, value in self.values.items():
            setattr(w, name, value)


def warm_up_draft(worker, rounds: int = 2) -> None:
    """`rounds` times: add a throwaway sequence, draft K tokens for it (JIT), run the speculation round on them
    (forks and branches at the draft's full fan-out), free it."""
    vocab = worker.model.cfg.vocab_size
    with _Untouched(worker, ("last_jit_step_s", "last_speculate_s", "stepwise_glues", "_forwards", "evictions",
                             "feature_rows_received", "min_confidence", "last_confidence", "confidence_stops")):
        worker.min_confidence = 0.0   # every chain at full depth: the shapes a round can take are all warmed
        for _ in range(rounds):
            try:
                worker.add(WARM_SEQ, _prompt(vocab), DraftParams())
                spec = worker.jit([WARM_SEQ])[0].tokens
                worker.speculate([(WARM_SEQ, spec)])
            finally:
                worker.free(WARM_SEQ)


def warm_up_target(worker, k: int = 3, rounds: int = 2) -> None:
    """`rounds` times: prefill a throwaway sequence, verify a speculation of `k` tokens and one of none, free it."""
    vocab = worker.model.cfg.vocab_size
    with _Untouched(worker, ("last_verify_s", "preemptions", "_forwards", "last_features")):
        for _ in range(rounds):
            try:
                worker.prefill([(WARM_SEQ, _prompt(vocab), SamplingParams())], features=True)
                worker.verify([VerifyItem(WARM_SEQ, _prompt(vocab)[:k], None)], features=True)
                worker.verify([VerifyItem(WARM_SEQ, [], None)], features=True)
            finally:
                worker.free(WARM_SEQ)
