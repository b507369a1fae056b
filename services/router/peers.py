"""The router's connections to its workers: one ZeroMQ DEALER socket per worker, with handshake and liveness.

A peer is `alive` once it answered `Hello` with `Ready` and keeps answering: the router pings every
`PING_EVERY` seconds and declares a peer dead after `DEAD_AFTER` seconds without any message from it (the
worker's IO thread answers pings even while its model computes). A dead peer is greeted again until it comes
back; `on_ready` then tells the router to rebuild what the worker lost. With `curve` (`ClientKeys`) the socket
authenticates as the router and talks only to a worker holding the worker secret key.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Callable

import zmq

from ssd import trace, wire
from ssd.curve import ClientKeys
from ssd.worker.io import bound_frames, recv_message

log = logging.getLogger("ssd.router")

PING_EVERY = 0.5
DEAD_AFTER = 2.0
HELLO_EVERY = 1.0


class Peer:
    def __init__(self, ctx: zmq.Context, address: str, role: str, curve: ClientKeys | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.address, self.role, self.clock = address, role, clock
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)  # never queue work for a worker that is not connected
        bound_frames(self.sock)
        if curve is not None:
            curve.apply(self.sock)
        self.sock.connect(address)
        self.ready: wire.Ready | None = None
        self.alive = False
        self.last_seen = 0.0
        self._last_ping = 0.0
        self._last_hello = 0.0
        self._nonce = itertools.count()
        self.peer_id = f"router-{os.getpid()}"

    def send(self, msg) -> bool:
        try:
            self.sock.send_multipart(wire.encode(msg), zmq.NOBLOCK)
            if trace.ON and isinstance(msg, wire.Verify):
                trace.mark("router_send", msg.batch_id)
            return True
        except zmq.Again:  # not connected (IMMEDIATE) or its queue is full
            return False

    def receive(self) -> list:
        """Every message waiting on the socket; frames that do not decode are logged and dropped."""
        out = []
        while True:
            try:
                frames = recv_message(self.sock, 2)
            except zmq.Again:
                return out
            if frames is None:
                log.warning("%s %s sent a message of more than 2 frames: dropped", self.role, self.address)
                continue
            try:
                msg = wire.decode(frames)
            except wire.WireError as e:
                log.warning("%s %s sent a frame that does not decode: %s", self.role, self.address, e)
                continue
            self.last_seen = self.clock()
            if isinstance(msg, wire.Ready):
                self.ready = msg
            elif trace.ON and isinstance(msg, wire.Outcomes):
                trace.mark("router_recv", msg.batch_id)
            out.append(msg)

    def tick(self, now: float) -> str | None:
        """Handshake and liveness; returns "died" or "ready" when the peer's state changes."""
        if not self.alive:
            if self.ready is not None and now - self.last_seen < DEAD_AFTER:
                self.alive = True
                return "ready"
            if now - self._last_hello >= HELLO_EVERY:
                self._last_hello = now
                self.send(wire.Hello("router", self.peer_id))
            return None
        if now - self.last_seen > DEAD_AFTER:
            self.alive, self.ready = False, None
            log.warning("%s %s stopped answering for %.1f s: marked dead", self.role, self.address, DEAD_AFTER)
            return "died"
        if now - self._last_ping >= PING_EVERY:
            self._last_ping = now
            self.send(wire.Ping(next(self._nonce)))
        return None

    def close(self) -> None:
        self.sock.close(0)
