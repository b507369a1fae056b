"""Fuzzing the data plane's decoder and both socket ends (tests/test_wire.py holds the codec's own fuzz cases).

Whatever arrives, `wire.decode` raises only WireError, in bounded time and memory; a worker endpoint keeps
serving and passes only valid messages to its compute loop; a router peer passes only valid messages on.
"""
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssd import wire
from ssd.worker.io import PeerGone, WorkerEndpoint
from services.router.peers import Peer

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
READY = wire.Ready("target", "m", "h", 100, 64, 3, [])
VALID = [wire.Ping(1), wire.Free([1, 2]), wire.Verify(3, [wire.VerifyItem(1, [4, 5], [([4], [1.0])])]),
         wire.Prefilled([(1, 7)], 0.5), wire.Error("x", "y", None),
         wire.Outcomes(3, [wire.Outcome(1, 1, 4)], 0.1, [(1, 5, b"\x00\x3c" * 8)])]
_objects = st.recursive(st.none() | st.integers() | st.text(max_size=4) | st.binary(max_size=8) | st.floats(),
                        lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner), max_leaves=8)


def _decode_only_wire_error(frames) -> wire.Message | None:
    start = time.perf_counter()
    try:
        return wire.decode(frames)
    except wire.WireError:
        return None
    finally:
        assert time.perf_counter() - start < 10.0, "decode hung"   # ~0.1 s on an idle core; CI machines are shared


@FUZZ
@given(_objects)
def test_decode_of_arbitrary_python_objects_raises_only_wire_error(obj):
    _decode_only_wire_error(obj)


@FUZZ
@given(st.lists(st.binary(max_size=6) | st.builds(bytearray, st.binary(max_size=6))
                | st.builds(lambda b: memoryview(b)[::2], st.binary(max_size=6)), min_size=2, max_size=2))
def test_decode_of_odd_buffers_raises_only_wire_error(frames):
    _decode_only_wire_error(frames)


@FUZZ
@given(st.sampled_from(sorted(wire.MESSAGE_TYPES)), st.binary(max_size=64))
def test_decode_of_random_payloads_for_every_type_raises_only_wire_error(byte, payload):
    _decode_only_wire_error([bytes([byte]), msgpack.packb(wire.PROTOCOL_VERSION) + payload])
    _decode_only_wire_error([bytes([byte]), bytes([0x90 + min(15, len(payload))]) + payload])


@pytest.mark.parametrize("name, body", [
    ("deep nesting", b"\x91" * 100_000 + b"\x01"),
    ("a million empty arrays", msgpack.packb([wire.PROTOCOL_VERSION, [[]] * 1_000_000])),
    ("claims 4 billion bytes", b"\x92\x01\xc6\xff\xff\xff\xff"),
    ("claims 4 billion characters", b"\x92\x01\xdb\xff\xff\xff\xff"),
    ("a map", msgpack.packb([wire.PROTOCOL_VERSION, {"a": 1}])),
    ("an ext type", b"\x92\x01\xd4\x05\x00"),
    ("2**64 - 1 sequence ids", msgpack.packb([wire.PROTOCOL_VERSION, [2**64 - 1] * 1000])),
    ("max_frame_bytes + 1", b"\x00" * (wire.MAX_FRAME_BYTES + 1)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_payload_bombs_are_refused_quickly(name, body):
    for byte in (0x50, 0x20, 0x32):
        assert _decode_only_wire_error([bytes([byte]), body]) is None, name


def test_array_budget_admits_the_largest_real_messages():
    rows = [([1] * 32, [1 / 32] * 32)] * 8
    big = wire.Verify(1, [wire.VerifyItem(i, [1] * 9, rows) for i in range(wire.MAX_ITEMS)])
    assert wire.decode(wire.encode(big)) == big


@pytest.fixture(scope="module")
def endpoint():
    ep = WorkerEndpoint("tcp://127.0.0.1:0", lambda: READY, "target")
    ep.start()
    yield ep
    ep.stop()


@pytest.fixture(scope="module")
def dealer(endpoint):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint.endpoint)
    yield sock
    sock.close(0)
    ctx.term()


def _drain(endpoint) -> list:
    """The wire messages on the inbox (not the endpoint's own PeerGone notes about silent peers)."""
    out = []
    while not endpoint.inbox.empty():
        msg = endpoint.inbox.get_nowait()[1]
        if not isinstance(msg, PeerGone):
            out.append(msg)
    return out


@settings(max_examples=60, deadline=None, database=None)
@given(st.lists(st.lists(st.binary(max_size=24), min_size=1, max_size=5)
                | st.sampled_from(VALID).map(wire.encode), min_size=1, max_size=8))
def test_worker_endpoint_passes_only_valid_messages_and_keeps_answering(endpoint, dealer, messages):
    _drain(endpoint)
    for frames in messages:
        dealer.send_multipart(frames)
    dealer.send_multipart(wire.encode(wire.Ping(12345)))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:   # answers: Pong, or an Error per bad frame; the Ping's Pong comes last
        assert dealer.poll(5000), "the endpoint stopped answering"
        reply = wire.decode(dealer.recv_multipart())
        assert isinstance(reply, (wire.Pong, wire.Error))
        if reply == wire.Pong(12345):
            break
    # the IO thread queues each message before it reads the next: once the Ping is answered, all are in the inbox
    expected = [wire.decode(f) for f in messages if _decode_only_wire_error(f) is not None]
    assert _drain(endpoint) == [m for m in expected if not isinstance(m, (wire.Ping, wire.Hello))]


def test_worker_endpoint_drops_oversized_and_many_frame_messages(endpoint):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint.endpoint)
    try:
        _drain(endpoint)
        sock.send_multipart([b"\x50"] + [msgpack.packb([1, [1]])] * 10_000)   # far too many frames
        sock.send_multipart(wire.encode(wire.Ping(1)))
        assert sock.poll(5000) and wire.decode(sock.recv_multipart()) == wire.Pong(1)
        sock.send_multipart([b"\x50", b"\x00" * (wire.MAX_FRAME_BYTES + 1)])   # ZeroMQ drops the connection
        time.sleep(0.3)
        assert _drain(endpoint) == []
        other = ctx.socket(zmq.DEALER)
        other.setsockopt(zmq.LINGER, 0)
        other.connect(endpoint.endpoint)
        other.send_multipart(wire.encode(wire.Ping(2)))
        assert other.poll(5000) and wire.decode(other.recv_multipart()) == wire.Pong(2)
        other.close(0)
    finally:
        sock.close(0)
        ctx.term()


@settings(max_examples=40, deadline=None, database=None)
@given(st.lists(st.lists(st.binary(max_size=24), min_size=1, max_size=4)
                | st.sampled_from(VALID).map(wire.encode), min_size=1, max_size=6))
def test_router_peer_passes_on_only_valid_messages(messages):
    ctx = zmq.Context()
    worker = ctx.socket(zmq.ROUTER)
    worker.setsockopt(zmq.LINGER, 0)
    port = worker.bind_to_random_port("tcp://127.0.0.1")
    peer = Peer(ctx, f"tcp://127.0.0.1:{port}", "target")
    try:
        deadline = time.monotonic() + 5
        while not worker.poll(20):   # IMMEDIATE: sends fail until the connection is up
            peer.send(wire.Ping(0))
            assert time.monotonic() < deadline, "the peer never connected"
        identity = worker.recv_multipart()[0]
        for frames in messages:
            worker.send_multipart([identity, *frames])
        worker.send_multipart([identity, *wire.encode(wire.Pong(99))])
        got, deadline = [], time.monotonic() + 5
        while wire.Pong(99) not in got and time.monotonic() < deadline:
            got += peer.receive()
            time.sleep(0.005)
        expected = [wire.decode(f) for f in messages if _decode_only_wire_error(f) is not None]
        assert got == expected + [wire.Pong(99)]
    finally:
        peer.close()
        worker.close(0)
        ctx.term()
