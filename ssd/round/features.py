"""Target features on their way to a feature-reading draft: what the round core keeps per sequence. No torch.

A feature block is `(start, data)`: the target's final pre-norm hidden states at positions start, start+1, ...
as float16 rows of `row` bytes (2 x the hidden size). The router asks the target for the features of a
sequence whose draft reads them, keeps what arrived since the last message to that draft (the pending block)
and sends it with the next DraftAdd / DraftRound / Jit item of the sequence. Nothing else is kept.

Merge rule (`merge`): a block that overlaps or touches the pending one joins it into one contiguous block, the
newer block's rows winning where both have one; a block separated from the pending one by a gap replaces it
(the draft reads rows it never got as zeros, and the newest rows are the ones it reads next). A pending block
longer than `wire.MAX_FEATURE_BYTES` keeps its newest rows, so one sequence's block always fits in a message;
`runs` splits a batch of items so that each message's features fit too. Exactness never depends on features.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator

from ssd import wire

log = logging.getLogger("ssd.round")


def merge(pending: wire.Features | None, start: int, data: bytes, row: int) -> wire.Features | None:
    """The pending block after `(start, data)` arrives (rows of `row` bytes; `len(data)` a multiple of it)."""
    if not data:
        return pending
    if pending is not None:
        old_start, old = pending
        old_end, end = old_start + len(old) // row, start + len(data) // row
        if old_start <= end and start <= old_end:   # overlapping or touching: one block, the new rows win
            head = old[:max(0, start - old_start) * row]
            tail = old[max(0, end - old_start) * row:]
            start, data = min(start, old_start), head + data + tail
    keep = min(len(data), wire.MAX_FEATURE_BYTES // row * row)
    if not keep:
        return None
    return start + (len(data) - keep) // row, data[len(data) - keep:]


def runs(items: list) -> Iterator[list]:
    """`items` (each with a `features` block or None) in order, in runs whose features total at most
    `wire.MAX_FEATURE_BYTES` (each block alone is within it): one message per run."""
    run, size = [], 0
    for it in items:
        n = len(it.features[1]) if it.features is not None else 0
        if run and size + n > wire.MAX_FEATURE_BYTES:
            yield run
            run, size = [], 0
        run.append(it)
        size += n
    if run:
        yield run


class FeatureLedger:
    """Per sequence, the features its draft has not been sent yet (`pending`), for a pool whose targets have
    `hidden_size` (0: no features flow). `reads(draft)` says whether a draft reads them."""

    def __init__(self, pool, metrics):
        self.pool, self.metrics = pool, metrics
        self.pending: dict[int, wire.Features] = {}

    def wanted(self, req) -> bool:
        """Whether the target should send the sequence's features: its draft reads them (or, while it has no
        draft, a draft of the pool does)."""
        if req.mode == "ar":
            return False
        return any(self.pool.reads_features(d) for d in ([req.draft] if req.draft is not None else self.pool.drafts))

    def keep(self, req, block: list | None) -> None:
        """Merge a block the target sent for the sequence into its pending block."""
        if block is None or not self.wanted(req):
            return
        start, data = block
        row = 2 * self.pool.hidden_size
        if not row or len(data) % row:
            log.warning("target %s sent %d feature bytes for seq %d: not rows of hidden size %d; dropped",
                        getattr(req.target, "address", "?"), len(data), req.seq, self.pool.hidden_size)
            return
        self.pending[req.seq] = merge(self.pending.get(req.seq), start, data, row)

    def take(self, req) -> wire.Features | None:
        """The sequence's pending features for the message about to go to its draft (None if that draft does not
        read them); either way they are no longer pending."""
        block = self.pending.pop(req.seq, None)
        if block is None or not self.pool.reads_features(req.draft):
            return None
        self.metrics.feature_rows(len(block[1]) // (2 * self.pool.hidden_size))
        return block

    def drop(self, seq: int) -> None:
        self.pending.pop(seq, None)
