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


class _Pending:
    """A sequence's pending rows: `buf` holds rows from `start` on. It may hold up to twice the rows a message
    carries (`FeatureLedger.keep`); only the newest of them are ever sent."""
    __slots__ = ("start", "buf")

    def __init__(self, start: int, data: bytes):
        self.start, self.buf = start, bytearray(data)


class FeatureLedger:
    """Per sequence, the features its draft has not been sent yet (`block`), for a pool whose targets have
    `hidden_size` (0: no features flow). `reads(draft)` says whether a draft reads them.

    While a sequence's rounds send its draft nothing (K = 0, in sd and ssd alike) its block grows by a round's rows
    each round. A block that touches the pending one from after (every round's does) is appended in place, so a
    round costs its own rows, not a copy of all that is pending: merged as bytes, 2048 rounds of 16 sequences took
    2.5 ms a round on average, on the router's turn (2026-12-06). The rows past a message's worth are dropped in
    bulk, once they reach as many again; every other block is merged by `merge` on the rows a message would carry.
    """

    def __init__(self, pool, metrics):
        self.pool, self.metrics = pool, metrics
        self._pending: dict[int, _Pending] = {}

    @property
    def _row(self) -> int:
        """Bytes per feature row (0: no features flow)."""
        return 2 * self.pool.hidden_size

    @staticmethod
    def _cap(row: int) -> int:
        """The most bytes of whole rows a message carries for one sequence."""
        return wire.MAX_FEATURE_BYTES // row * row

    def _view(self, p: _Pending, row: int) -> wire.Features:
        """The rows of `p` a message would carry now: the newest, within MAX_FEATURE_BYTES."""
        cut = max(0, len(p.buf) - self._cap(row))
        return p.start + cut // row, bytes(p.buf[cut:])

    def block(self, seq: int) -> wire.Features | None:
        """The sequence's pending block as its next draft message would carry it (None: none), left pending."""
        p = self._pending.get(seq)
        return None if p is None else self._view(p, self._row)

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
        row = self._row
        if not row or len(data) % row:
            log.warning("target %s sent %d feature bytes for seq %d: not rows of hidden size %d; dropped",
                        getattr(req.target, "address", "?"), len(data), req.seq, self.pool.hidden_size)
            return
        if not data:
            return
        p, cap = self._pending.get(req.seq), self._cap(row)
        if p is not None and start == p.start + len(p.buf) // row and cap:   # touching from after: append
            p.buf += data
            if len(p.buf) > 2 * cap:
                cut = len(p.buf) - cap
                del p.buf[:cut]
                p.start += cut // row
            return
        merged = merge(None if p is None else self._view(p, row), start, data, row)
        if merged is None:
            self._pending.pop(req.seq, None)
        else:
            self._pending[req.seq] = _Pending(*merged)

    def take(self, req) -> wire.Features | None:
        """The sequence's pending features for the message about to go to its draft (None if that draft does not
        read them); either way they are no longer pending."""
        p = self._pending.pop(req.seq, None)
        if p is None or not self.pool.reads_features(req.draft):
            return None
        row = self._row
        block = self._view(p, row)
        self.metrics.feature_rows(len(block[1]) // row)
        return block

    def drop(self, seq: int) -> None:
        self._pending.pop(seq, None)
