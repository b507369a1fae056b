"""A worker frees the sequences of a router that fell silent (died, or lost its network)."""
import queue
import time

import zmq

from ssd import wire
from ssd.engine.handler import Handler
from ssd.worker.io import PeerGone, WorkerEndpoint


def ready():
    return wire.Ready("target", "m", "hash", 10, 64, 0, [])


def test_a_silent_peer_is_reported_once_and_a_pinging_one_never():
    endpoint = WorkerEndpoint("tcp://127.0.0.1:0", ready, "test", peer_timeout=1.0)
    address = endpoint.start()
    ctx = zmq.Context()
    silent, alive = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    for sock in (silent, alive):
        sock.connect(address)
    try:
        silent.send_multipart(wire.encode(wire.Free([1])))
        assert endpoint.inbox.get(timeout=5)[1] == wire.Free([1])
        gone = []
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            alive.send_multipart(wire.encode(wire.Ping(1)))
            try:
                gone.append(endpoint.inbox.get(timeout=0.3))
            except queue.Empty:
                pass
        assert len(gone) == 1 and isinstance(gone[0][1], PeerGone) and gone[0][1].silent_s > 1.0
    finally:
        silent.close(0)
        alive.close(0)
        ctx.term()
        endpoint.stop()


class FakeWorker:
    def __init__(self):
        self.seqs = {(b"a", 1): 0, (b"a", 2): 0, (b"b", 1): 0}

    def free(self, key):
        del self.seqs[key]


def test_forget_peer_frees_only_that_routers_sequences():
    h = Handler(FakeWorker(), None)
    assert h.forget_peer(b"a") == 2 and list(h.worker.seqs) == [(b"b", 1)]
    assert h.forget_peer(b"zzz") == 0


def test_a_queued_reply_and_a_stop_end_the_io_threads_poll_at_once(monkeypatch):
    """`send` and `stop` wake the IO thread: with its idle poll made 60 s long, a reply queued while it sleeps still
    reaches the peer, and `stop` still ends the thread (before, queued replies waited for the poll to end)."""
    import ssd.worker.io as io

    monkeypatch.setattr(io, "POLL_MS", 60_000)
    endpoint = WorkerEndpoint("tcp://127.0.0.1:0", ready, "test")
    address = endpoint.start()
    ctx = zmq.Context()
    peer = ctx.socket(zmq.DEALER)
    peer.connect(address)
    try:
        peer.send_multipart(wire.encode(wire.Free([1])))
        who, msg = endpoint.inbox.get(timeout=5)
        assert msg == wire.Free([1])
        time.sleep(0.3)   # the IO thread is back in its (60 s) poll
        endpoint.send(who, wire.Free([2]))
        assert peer.poll(10_000), "the queued reply did not leave while the IO thread slept in its poll"
        assert wire.decode(peer.recv_multipart()) == wire.Free([2])
    finally:
        peer.close(0)
        ctx.term()
        endpoint.stop()
    assert not endpoint._thread.is_alive()
