"""A worker's data-plane endpoint: a ZeroMQ ROUTER socket owned by one IO thread.

The compute loop never touches the socket: decoded requests arrive on `inbox` as `(peer, message)` and
replies leave through `send(peer, message)`, which queues the reply and wakes the IO thread's poll (`ssd.wake`), so
a reply leaves as soon as it is queued. (The thread used to find queued replies only when its 2 ms poll ended:
every reply waited 1 ms on average, on a round trip of 25-30 ms at batch 1 on the default pair, and a JIT's round
paid it twice.) The IO thread answers `Hello` (with the worker's `Ready`) and
`Ping` itself, so a worker busy in a long forward still proves it is alive. A frame that does not decode
is logged and answered with an `Error`; it never reaches the compute loop and never stops the worker.

Bounds: a frame over `wire.MAX_FRAME_BYTES` makes ZeroMQ drop the connection (MAXMSGSIZE); a message of more
frames than a wire message has is read to its end, frame by frame, and dropped. With `curve` (`ServerKeys`) the
socket is a CURVE server and a ZAP handler admits only the authorised client keys: nothing from another peer
reaches `inbox` or gets an answer.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import zmq

from ssd import trace, wire
from ssd.curve import ServerKeys
from ssd.wake import Wake

log = logging.getLogger(__name__)

POLL_MS = 100   # the longest the IO thread sleeps in its poll with nothing to read or send (stop, peer reaping)


def recv_message(sock: zmq.Socket, max_frames: int) -> list[bytes] | None:
    """The next message on `sock` (zmq.Again if none), or None if it has more than `max_frames` frames: those
    are read one at a time and discarded, so a peer cannot make this side hold an unbounded list."""
    frames = [sock.recv(zmq.NOBLOCK)]
    while sock.getsockopt(zmq.RCVMORE):
        frame = sock.recv()
        if len(frames) <= max_frames:
            frames.append(frame)
    return frames if len(frames) <= max_frames else None


def bound_frames(sock: zmq.Socket) -> None:
    """No frame larger than a wire payload may arrive: ZeroMQ disconnects a peer that sends one."""
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)


@dataclass(frozen=True, slots=True)
class PeerGone:
    """Put on `inbox` (never on the wire) when a router has been silent for `peer_timeout` seconds: routers ping
    every 0.5 s, so it died or lost its network; the compute loop frees that router's sequences."""
    silent_s: float


class WorkerEndpoint:
    def __init__(self, address: str, ready: Callable[[], wire.Ready], name: str = "worker",
                 curve: ServerKeys | None = None, peer_timeout: float = 10.0):
        self.address, self.ready, self.name, self.curve = address, ready, name, curve
        self.peer_timeout = peer_timeout
        self._last_seen: dict[bytes, float] = {}
        self._reaped_at = 0.0
        self.inbox: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-io", daemon=True)
        self.endpoint = ""
        self._error: Exception | None = None
        self._wake = Wake()

    def start(self, timeout: float = 10.0) -> str:
        """Bind and start the IO thread; returns the bound endpoint (a tcp port of 0 picks a free one)."""
        self._thread.start()
        if not self._bound.wait(timeout) or self._error is not None:
            raise RuntimeError(f"{self.name}: cannot bind data plane at {self.address}: {self._error}")
        return self.endpoint

    def send(self, peer: bytes, msg) -> None:
        self._outbox.put((peer, msg))
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        ctx = zmq.Context()
        auth = self.curve.authenticator(ctx, self.name) if self.curve is not None else None
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        bound_frames(sock)
        if self.curve is not None:
            self.curve.apply(sock)
        try:
            sock.bind(self.address)
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            self._error = e
            self._bound.set()
            sock.close()
            if auth is not None:
                auth.stop()
            ctx.term()
            self._wake.close()
            return
        self._bound.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake.fd, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                self._reap()
                ready = dict(poller.poll(POLL_MS))
                if self._wake.fd in ready:   # cleared before the outbox is read: a later reply wakes the next poll
                    self._wake.clear()
                if sock in ready:
                    while True:
                        try:
                            frames = recv_message(sock, 3)   # peer identity, type, payload
                        except zmq.Again:
                            break
                        if frames is None:
                            log.warning("%s: dropped a message of more than 2 frames", self.name)
                            continue
                        self._receive(sock, frames)
                while True:
                    try:
                        peer, msg = self._outbox.get_nowait()
                    except queue.Empty:
                        break
                    sock.send_multipart([peer, *wire.encode(msg)])
                    if trace.ON and isinstance(msg, wire.Outcomes):
                        trace.mark("target_sent", msg.batch_id)
        finally:
            sock.close()
            if auth is not None:
                auth.stop()
            ctx.term()
            self._wake.close()

    def _reap(self) -> None:
        """Report the routers that fell silent (at most one check per second)."""
        now = time.monotonic()
        if now - self._reaped_at < 1.0:
            return
        self._reaped_at = now
        for peer, seen in list(self._last_seen.items()):
            if now - seen > self.peer_timeout:
                del self._last_seen[peer]
                log.warning("%s: peer %s silent for %.0f s: freeing its sequences", self.name, peer.hex(), now - seen)
                self.inbox.put((peer, PeerGone(now - seen)))

    def _receive(self, sock, frames: list[bytes]) -> None:
        peer = frames[0]
        self._last_seen[peer] = time.monotonic()
        try:
            msg = wire.decode(frames[1:])
        except wire.WireError as e:
            log.warning("%s: rejected a frame from peer %s: %s", self.name, peer.hex(), e)
            sock.send_multipart([peer, *wire.encode(wire.Error("bad_frame", str(e), None))])
            return
        if isinstance(msg, wire.Ping):
            sock.send_multipart([peer, *wire.encode(wire.Pong(msg.nonce))])
        elif isinstance(msg, wire.Hello):
            sock.send_multipart([peer, *wire.encode(self.ready())])
        else:
            if trace.ON and isinstance(msg, wire.Verify):
                trace.mark("target_recv", msg.batch_id)
            self.inbox.put((peer, msg))
