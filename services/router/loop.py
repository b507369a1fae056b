"""The router's loop: the shell that carries the round core (`ssd.round`) over ZeroMQ. No torch, no algorithm.

One thread owns the sockets and drives the core; gRPC and HTTP handler threads meet it only at the core's
queues (`submit`/`abort` in, per-request event queues out). Each pass: apply what discovery saw, read every
worker's messages into the core, tick each peer's liveness (handshake, pings, death) and tell the core what
changed, then let the core admit and send what is ready (`RoundCore.step`). A peer (`services.router.peers`) is
the worker handle the core sends its commands through.

The loop sleeps in its poll until a worker's message, a submit or an abort (`ssd.wake.Wake`, a pipe the intake
writes to from the caller's thread) or the core's next timer (`RoundCore.next_timer`: a JIT linger ending), and at most
`IDLE_POLL_MS`, for liveness, deadlines and discovery. It used to poll every millisecond while requests ran: ~10%
of a core, on the draft's core under `ssd up --pin`.

A draft that reads the target's features (`Ready.feature_size` equal to the targets' hidden size) gets them with
its adds and deltas (`ssd.round.features`); a draft whose feature size differs is logged and gets none.
"""
from __future__ import annotations

import logging
import math
import threading
import time

import zmq

from ssd.round import CoreConfig, RoundCore, StartupError, WorkerPool
from ssd.wake import Wake
from services.router.metrics import RouterMetrics
from services.router.peers import Peer

log = logging.getLogger("ssd.router")

__all__ = ["RouterLoop", "StartupError"]

IDLE_POLL_MS = 20   # the longest the loop sleeps in its poll: liveness, request deadlines and discovery


class RouterLoop:
    def __init__(self, cfg: CoreConfig, targets: list[str], drafts: list[str], tokenizer_hash: str, eos_token_ids,
                 metrics: RouterMetrics | None = None, discovery=None, curve=None, clock=time.monotonic):
        drafts = drafts if cfg.mode != "ar" else []
        self.clock = clock   # every time the loop and core read; tests drive their own
        self.discovery = discovery  # ssd.discovery.Discovery: workers that appear and leave at run time
        self._ctx = zmq.Context()
        self._curve = curve  # ssd.curve.ClientKeys: the data plane authenticates (None: plain sockets)
        self._poller = zmq.Poller()
        self._wake = Wake()
        pool = WorkerPool([Peer(self._ctx, t, "target", curve, clock) for t in targets],
                          [Peer(self._ctx, d, "draft", curve, clock) for d in drafts], tokenizer_hash)
        self.pool = pool
        try:
            self.round = RoundCore(cfg, pool, eos_token_ids, metrics or RouterMetrics(), clock,
                                   dynamic_pool=discovery is not None)
        except ValueError:
            self._close()
            raise
        self._stop = threading.Event()
        self.round.intake.wake = self._wake.set
        self.passes = 0   # loop passes (each after a poll)

    @property
    def peers(self) -> list[Peer]:
        return [*self.pool.targets, *self.pool.drafts]

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    # ---- start-up -------------------------------------------------------------------------------
    def handshake(self) -> None:
        """Wait for every worker's Ready and check that they fit together, or raise StartupError."""
        timeout = self.round.cfg.ready_timeout
        deadline = self.clock() + timeout
        if self.discovery is not None:
            self.discovery.start()
            self._discover()
        while not (all(p.alive for p in self.peers) and self.pool.any_alive("target")):
            if self.clock() > deadline:
                missing = ", ".join(f"{p.role} at {p.address}" for p in self.peers if not p.alive)
                raise StartupError(f"no Ready from {missing} within {timeout:.0f} s: is the worker running "
                                   f"(`ssd target` / `ssd draft`) and its data address right?")
            if self.discovery is not None:
                self._discover()
            for p in self.peers:
                p.receive()
                p.tick(self.clock())
            time.sleep(0.02)
        self.round.start()
        log.info("workers ready: targets %s (%s), drafts %s; mode %s, K=%d", [p.address for p in self.pool.targets],
                 self.pool.target.ready.model_id, [d.address for d in self.pool.drafts], self.round.cfg.mode,
                 self.round.k)

    def _discover(self) -> None:
        """Apply what the discovery source saw: connect to new workers, treat removed ones as gone."""
        members = self.round.members
        for change in self.discovery.changes():
            role, address = change.worker.role, change.worker.address
            known = next((p for p in self.peers if p.role == role and p.address == address), None)
            if change.kind == "added" and known is None and (role == "target" or self.round.cfg.mode != "ar"):
                peer = Peer(self._ctx, address, role, self._curve, self.clock)
                members.joined(peer)
                self._poller.register(peer.sock, zmq.POLLIN)
                log.info("discovered %s %s", role, address)
            elif change.kind == "removed" and known is not None:
                log.info("%s %s left", role, address)
                known.alive = False
                members.left(known)
                self._poller.unregister(known.sock)
                known.close()

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        for p in self.peers:
            self._poller.register(p.sock, zmq.POLLIN)
        self._poller.register(self._wake.fd, zmq.POLLIN)
        core = self.round
        while not self._stop.is_set():
            if self.discovery is not None:
                self._discover()
            core.take_new()
            self._poller.poll(self._poll_ms(core.next_timer()))
            self._wake.clear()
            self.passes += 1
            core.hold_events()   # the streams hear of this pass once what it sends is out
            try:
                for p in self.peers:
                    for msg in p.receive():
                        core.on_message(p, msg)
                self._liveness()
                core.step()
            finally:
                core.release_events()
        core.shutdown("the router is shutting down")
        self._close()

    def _poll_ms(self, timer: float | None) -> int:
        """How long the next poll may sleep: until the core's timer (at least 1 ms), at most IDLE_POLL_MS."""
        if timer is None:
            return IDLE_POLL_MS
        return max(1, min(IDLE_POLL_MS, math.ceil((timer - self.clock()) * 1000)))

    def _liveness(self) -> None:
        now, m = self.clock(), self.round.members
        on = {("target", "ready"): m.target_ready, ("target", "died"): m.target_died,
              ("draft", "ready"): m.draft_ready, ("draft", "died"): m.draft_died}
        for p in self.peers:
            change = p.tick(now)
            if change is not None:
                on[(p.role, change)](p)
        m.report_drafts_alive()

    def _close(self) -> None:
        for p in self.peers:
            p.close()
        self._ctx.term()
        self._wake.close()
