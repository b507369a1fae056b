"""What the target's and the draft's message handlers share: the interface a worker's serve loop drives.

A handler holds a role's logic over its worker (`ssd/engine/target_handler.py`, `ssd/engine/draft_handler.py`):
`handle` takes a batch of `(peer, message)` and answers through `endpoint.send(peer, message)`, the only thing
it needs of its endpoint, so the same handler serves a worker process (`ssd/worker/service.py`, over a ZeroMQ
endpoint) and an in-process engine (over any object with that `send`). Sequences are keyed `(peer, seq)`.
"""
from __future__ import annotations

import logging
from typing import Protocol

from ssd import wire


class Sender(Protocol):
    """Where a handler's replies go: `send(peer, message)` (a wire message for the router `peer`)."""

    def send(self, peer: bytes, msg) -> None: ...


class Handler:
    """A role's logic: `handle` processes a batch of (peer, message) and replies through `endpoint.send`."""

    log = logging.getLogger("ssd.worker")

    def __init__(self, worker, endpoint: Sender):
        self.worker, self.endpoint = worker, endpoint

    def handle(self, batch: list[tuple[bytes, object]]) -> None:
        raise NotImplementedError

    def active_sequences(self) -> int:
        return len(self.worker.seqs)

    def forget_peer(self, peer: bytes) -> int:
        """Frees every sequence of a router that went away (sequences are keyed (peer, seq)); returns how many."""
        keys = [key for key in self.worker.seqs if key[0] == peer]
        for key in keys:
            self.worker.free(key)
        return len(keys)

    def _error(self, peer: bytes, code: str, message: str, seq: int | None = None) -> None:
        self.log.warning("peer %s seq %s: %s", peer.hex(), seq, message)
        self.endpoint.send(peer, wire.Error(code, message, seq))
