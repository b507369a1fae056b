"""A worker's data-plane endpoint: a ZeroMQ ROUTER socket owned by one IO thread.

The compute loop never touches the socket: decoded requests arrive on `inbox` as `(peer, message)` and
replies leave through `send(peer, message)`. The IO thread answers `Hello` (with the worker's `Ready`) and
`Ping` itself, so a worker busy in a long forward still proves it is alive. A frame that does not decode
is logged and answered with an `Error`; it never reaches the compute loop and never stops the worker.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

import zmq

from ssd import wire

log = logging.getLogger(__name__)


class WorkerEndpoint:
    def __init__(self, address: str, ready: Callable[[], wire.Ready], name: str = "worker"):
        self.address, self.ready, self.name = address, ready, name
        self.inbox: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-io", daemon=True)
        self.endpoint = ""
        self._error: Exception | None = None

    def start(self, timeout: float = 10.0) -> str:
        """Bind and start the IO thread; returns the bound endpoint (a tcp port of 0 picks a free one)."""
        self._thread.start()
        if not self._bound.wait(timeout) or self._error is not None:
            raise RuntimeError(f"{self.name}: cannot bind data plane at {self.address}: {self._error}")
        return self.endpoint

    def send(self, peer: bytes, msg) -> None:
        self._outbox.put((peer, msg))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 4 * wire.MAX_FRAME_BYTES)
        try:
            sock.bind(self.address)
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            self._error = e
            self._bound.set()
            sock.close()
            ctx.term()
            return
        self._bound.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if poller.poll(2):
                    while True:
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._receive(sock, frames)
                while True:
                    try:
                        peer, msg = self._outbox.get_nowait()
                    except queue.Empty:
                        break
                    sock.send_multipart([peer, *wire.encode(msg)])
        finally:
            sock.close()
            ctx.term()

    def _receive(self, sock, frames: list[bytes]) -> None:
        peer = frames[0]
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
            self.inbox.put((peer, msg))
