"""Malformed frames sent to a real draft process (`ssd draft`, as ssd/cli/launcher.py starts it): each is answered
with an `Error` (`bad_frame` for what does not decode, `unexpected_message` for a valid message the draft never
takes), logged, and changes nothing: the draft then serves the same rounds exactly as it did before them.
(tests/services/test_stack.py sends the same frames to the target.)
"""
import subprocess
import sys
import time

import pytest
import zmq

from ssd import wire
from ssd.service_config import read_bound_file

ADD = [5, 6, 7, 8, 9, 10, 11, 12]   # a prompt's tokens and its first token
SPEC = [13, 14, 15]
GREEDY = wire.DraftParamsSpec(0.0, 0, 1.0, 0, None)


@pytest.fixture(scope="module")
def draft(default_models, tmp_path_factory):
    """A layer-draft process on loopback, on ports it bound itself (port 0, reported in its bound file); yields
    (data address, log path) once its data plane answers Hello."""
    folder = tmp_path_factory.mktemp("draft-frames")
    log_path, bound = folder / "draft.log", folder / "bound.json"
    cmd = [sys.executable, "-m", "ssd.cli", "draft", "--model", str(default_models["layer_draft"]),
           "--data-address", "tcp://127.0.0.1:0", "--control-address", "127.0.0.1:0", "--bound-file", str(bound),
           "--max-seqs", "4", "--k", "3", "--threads", "1"]
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while (reported := read_bound_file(bound)) is None:   # the data plane binds once the model is loaded
        assert proc.poll() is None, f"the draft exited: {log_path.read_text()[-2000:]}"
        assert time.monotonic() < deadline, "the draft never reported its ports"
        time.sleep(0.1)
    data = reported["data_address"]
    ctx = zmq.Context()
    sock = dealer(ctx, data)
    try:
        while True:
            assert proc.poll() is None, f"the draft exited: {log_path.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "the draft never answered Hello"
            sock.send_multipart(wire.encode(wire.Hello("router", "test")))
            if sock.poll(1000) and isinstance(wire.decode(sock.recv_multipart()), wire.Ready):
                break
        yield data, log_path
    finally:
        sock.close(0)
        ctx.term()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def dealer(ctx, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


def ask(sock, msg, want: type, timeout_ms: int = 60_000):
    """Send `msg`, return the first reply of type `want` (failing on any Error)."""
    sock.send_multipart(wire.encode(msg))
    while True:
        assert sock.poll(timeout_ms), f"no {want.__name__} in answer to {type(msg).__name__}"
        reply = wire.decode(sock.recv_multipart())
        assert not isinstance(reply, wire.Error), reply
        if isinstance(reply, want):
            return reply


def serve_rounds(sock, seq: int) -> tuple[list, list]:
    """Add `seq`, run one speculative round and one JIT for it; the cache entries and the JIT items, then free it."""
    sock.send_multipart(wire.encode(wire.DraftAdd([wire.DraftAddItem(seq, ADD, GREEDY)])))
    entries = ask(sock, wire.DraftRound([wire.DraftRoundItem(seq, 1, [], SPEC)]), wire.CacheEntries)
    assert entries.seq == seq and entries.round == 1
    jit = ask(sock, wire.Jit(7, [wire.JitItem(seq, [SPEC[0], 42], 3)]), wire.JitResult)
    sock.send_multipart(wire.encode(wire.Free([seq])))
    return entries.entries, [(tokens, proposal) for _, tokens, proposal in jit.items]


def bad_frames() -> dict[str, list[bytes]]:
    valid = wire.encode(wire.DraftRound([wire.DraftRoundItem(1, 2, [3], [4])]))
    return {
        "garbage": [b"\x00\xff\xfe", b"not msgpack at all"],
        "unknown type": [bytes([0x66]), b"\x90"],
        "single frame": [bytes([0x31])],
        "empty type frame": [b"", valid[1]],
        "truncated msgpack": [valid[0], valid[1][:-3]],
        "wrong protocol version": [valid[0], valid[1].replace(bytes([wire.PROTOCOL_VERSION]), b"\x09", 1)],
        "fields of another message": [valid[0], wire.encode(wire.Free([1]))[1]],
    }


# valid messages the draft never takes: the target's and the router's
FOREIGN = {"Verify": wire.Verify(3, [wire.VerifyItem(1, [4], None)]),
           "Prefill": wire.Prefill([wire.PrefillItem(1, [4], wire.SamplingSpec(0.0, 0, 1.0, 0.0, None))]),
           "Outcomes": wire.Outcomes(3, [wire.Outcome(1, 0, 4)], 0.1)}


def test_a_draft_answers_malformed_frames_with_an_error_logs_them_and_serves_the_same_rounds(draft):
    address, log_path = draft
    ctx = zmq.Context()
    sock, big = dealer(ctx, address), dealer(ctx, address)
    try:
        before = serve_rounds(sock, seq=1)
        assert before[0] and before[1][0][0]   # entries published and JIT tokens drafted: a round to compare
        frames = bad_frames()
        for name, f in frames.items():
            sock.send_multipart(f)
            assert sock.poll(10_000), f"no reply to the {name} frame"
            reply = wire.decode(sock.recv_multipart())
            assert isinstance(reply, wire.Error) and reply.code == "bad_frame", (name, reply)
        for name, msg in FOREIGN.items():
            sock.send_multipart(wire.encode(msg))
            assert sock.poll(10_000), f"no reply to a {name}"
            reply = wire.decode(sock.recv_multipart())
            assert isinstance(reply, wire.Error) and reply.code == "unexpected_message" and name in reply.message
        big.send_multipart([bytes([0x31]), b"\x00" * (wire.MAX_FRAME_BYTES + 1)])
        assert not big.poll(1000), "an oversized frame must not be read, let alone answered"
        after = serve_rounds(sock, seq=2)
        assert after == before    # the same rounds, to the token and probability
        assert ask(sock, wire.Ping(6), wire.Pong).nonce == 6
    finally:
        sock.close(0)
        big.close(0)
        ctx.term()
    text = log_path.read_text()
    assert text.count("rejected a frame") == len(frames)
    assert all(f"the draft does not handle {name}" in text for name in FOREIGN)


def test_out_of_vocabulary_tokens_in_a_round_or_jit_are_refused_for_that_sequence_alone(draft):
    """Well-framed rounds whose committed or speculated ids are outside the draft's vocabulary: invalid_argument
    naming the sequence, nothing committed; the sequence and its neighbours then serve as before."""
    address, _ = draft
    ctx = zmq.Context()
    sock = dealer(ctx, address)
    try:
        before = serve_rounds(sock, seq=3)
        sock.send_multipart(wire.encode(wire.DraftAdd([wire.DraftAddItem(4, ADD, GREEDY)])))
        for bad in (wire.DraftRound([wire.DraftRoundItem(4, 1, [10**9], SPEC)]),
                    wire.DraftRound([wire.DraftRoundItem(4, 1, [], [SPEC[0], 10**6])]),
                    wire.Jit(8, [wire.JitItem(4, [2**31 - 1], 3)])):
            sock.send_multipart(wire.encode(bad))
            assert sock.poll(10_000), f"no reply to {bad}"
            reply = wire.decode(sock.recv_multipart())
            assert isinstance(reply, wire.Error) and reply.code == "invalid_argument" and reply.seq == 4, reply
        sock.send_multipart(wire.encode(wire.Free([4])))
        assert serve_rounds(sock, seq=4) == before   # nothing of the refused rounds was committed
    finally:
        sock.close(0)
        ctx.term()
