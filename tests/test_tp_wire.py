"""The tensor-parallel codec (ssd/tp_wire.py): every message round-trips exactly, and a malformed, oversized or
wrong-version message is refused with a TPWireError (only that) naming what is wrong; a follower that meets one
stops following instead of guessing."""
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ssd import tp_wire
from ssd.constraints import Constraint
from ssd.params import SamplingParams
from ssd.tp_wire import (MESSAGE_TYPES, TP_VERSION, Free, Item, Prefill, Request, Restore, Stop, TPWireError, Verify,
                         decode, encode)

PEER = b"\x00k\x8b\x45\x67"   # a ZeroMQ routing identity
SAMPLED = SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, seed=2**64 - 1, max_tokens=64,
                         stop_token_ids=(2, 7), ignore_eos=True, presence_penalty=-0.5, frequency_penalty=1.5,
                         repetition_penalty=1.3, logit_bias=((3, -100.0), (2**31 - 1, 2.5)), min_tokens=4, logprobs=20,
                         constraint=Constraint("regex", "[0-9]+"), prompt_logprobs=20)
EXAMPLES = [
    Prefill([Request((PEER, 1), [1, 2, 3], SAMPLED), Request((b"r", 2**63 - 1), [2**31 - 1], SamplingParams())],
            features=True),
    Restore([Request((PEER, 1), [1, 2, 3, 4], SAMPLED, 2)]),
    Verify([Item((PEER, 1), [3, 0], [([3, 17, 40], [0.1, 0.2, 0.7]), ([0, 2**31 - 1], [1.0, 0.0])]),
            Item((PEER, 2), [], None)], features=False),
    Free((PEER, 9)),
    Stop(),
]


def payload(type_byte: int, fields: list, version: int = TP_VERSION) -> bytes:
    return bytes([version, type_byte]) + msgpack.packb(fields, use_bin_type=True)


def refused(data, *fragments: str) -> str:
    with pytest.raises(TPWireError) as err:
        decode(data)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    return str(err.value)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_exactly(msg):
    data = encode(msg)
    assert data[0] == TP_VERSION and MESSAGE_TYPES[data[1]] is type(msg)
    assert decode(data) == msg
    assert decode(memoryview(bytearray(data))) == msg


def test_probabilities_keep_every_bit_and_ids_are_tuple_keys():
    back = decode(encode(EXAMPLES[2]))
    assert back.items[0].proposal[0][1] == [0.1, 0.2, 0.7]    # float64: not rounded to float32 as on the data plane
    assert back.items[0].seq_id == (PEER, 1) and hash(back.items[0].seq_id)
    assert decode(encode(EXAMPLES[0])).requests[0].params.stop_token_ids == (2, 7)


def test_a_wrong_version_is_refused_naming_both_versions():
    data = bytearray(encode(EXAMPLES[3]))
    data[0] = TP_VERSION + 1
    refused(bytes(data), f"version {TP_VERSION + 1} is not supported", f"speaks version {TP_VERSION}")
    refused(payload(0x04, [[PEER, 9]], version=0), "version 0 is not supported")


@pytest.mark.parametrize("data, fragments", [
    (b"", ["at least 2 bytes"]),
    (bytes([TP_VERSION]), ["at least 2 bytes"]),
    (bytes([TP_VERSION, 0x55]) + msgpack.packb([]), ["unknown tensor-parallel message type byte 0x55"]),
    (bytes([TP_VERSION, 0x04]) + b"\xc1", ["Free: malformed msgpack payload"]),
    (bytes([TP_VERSION, 0x04]) + msgpack.packb([[PEER, 9]])[:-1], ["Free: malformed msgpack payload"]),
    (payload(0x04, {"seq_id": 1}), ["Free: malformed msgpack payload"]),           # no maps
    (payload(0x04, [[PEER, 9], 1]), ["Free: expected the 1 fields ('seq_id',)"]),
    (payload(0x04, [[PEER, -1]]), ["Free.seq_id[1]: expected an int in [0, 2**63)"]),
    (payload(0x04, [["peer", 1]]), ["Free.seq_id[0]: expected a bin", "got str"]),   # strings only for a constraint
    (payload(0x04, [[b"x" * 256, 1]]), ["Free.seq_id[0]: expected a bin of at most 255 bytes"]),
    (payload(0x7F, [0]), ["Stop: expected the 0 fields"]),
    (payload(0x03, [[], 1]), ["Verify.features: expected a bool, got 1"]),
    (payload(0x03, [[[[PEER, 1], [-3], None]], False]), ["Verify.items[0].tokens[0]: expected an int in [0, 2**31)"]),
    (payload(0x03, [[[[PEER, 1], [3], [[b"\x01\x00\x00\x00", b"\x00" * 4]]]], False]),
     ["Verify.items[0].proposal[0]: ids and probs must hold the same number"]),
    (payload(0x03, [[[[PEER, 1], [3], [[b"\x01\x00\x00\x00", b"\x00" * 7 + b"\x7f"]]]], False]),   # NaN
     ["Verify.items[0].proposal[0]: a row's ids must be ints in [0, 2**31) and its probs finite floats in [0, 1]"]),
    (payload(0x01, [[[[PEER, 1], [1], [0.0, 0, 0.0, 0.0, None, 1, [], False, 0.0, 0.0, 1.0, [], 0, None, False, None, None], 1]], False]),
     ["Prefill.requests[0].params: SamplingParams.top_p must be a number in (0, 1]"]),
    (payload(0x01, [[[[PEER, 1], [1], [0.0, 0, 1.0, 0.0, None, 1, [], False, 0.0, 0.0, 1.0, [[1, 2.0], [1, 3.0]],
                                       0, None, False, None, None], 1]], False]),
     ["Prefill.requests[0].params: SamplingParams.logit_bias must be", "each id once"]),
    (payload(0x01, [[[[PEER, 1], [1], [0.0, 0, 1.0, 0.0, None, 1, []], 1]], False]),
     ["Prefill.requests[0].params: expected the 17 fields"]),
    (payload(0x01, [[[[PEER, 1], [1], [0.0, 0, 1.0, 0.0, None, 1, [], False, 0.0, 0.0, 1.0, [], 0, 3, False, None, None]]],
                    False]),
     ["Prefill.requests[0]: expected the 4 fields"]),
    (payload(0x01, [[[[PEER, 1], [1], [0.0, 0, 1.0, 0.0, None, 1, [], False, 0.0, 0.0, 1.0, [], 0, None, False,
                                       ["yaml", ""], None], 1]], False]),
     ["Prefill.requests[0].params.constraint.kind: expected one of"]),
])
def test_a_malformed_message_is_refused_naming_the_field(data, fragments):
    refused(data, *fragments)


def test_sizes_are_checked_before_unpacking(monkeypatch):
    data = encode(EXAMPLES[0])
    monkeypatch.setattr(tp_wire, "MAX_OP_BYTES", len(data) - 1)
    refused(data, f"{len(data)} bytes exceeds MAX_OP_BYTES={len(data) - 1}")
    with pytest.raises(TPWireError, match="exceeds MAX_OP_BYTES"):
        encode(EXAMPLES[0])
    monkeypatch.setattr(tp_wire, "MAX_OP_ARRAYS", 3)
    monkeypatch.setattr(tp_wire, "MAX_OP_BYTES", 1 << 20)
    refused(payload(0x03, [[[[PEER, i], [], None] for i in range(4)], False]), "more than MAX_OP_ARRAYS=3 arrays")


def test_encode_refuses_what_decode_would():
    with pytest.raises(TPWireError, match="not a tensor-parallel message"):
        encode(("prefill", []))
    with pytest.raises(TPWireError, match=r"Verify.items\[0\].proposal\[0\]: a row's ids"):
        encode(Verify([Item((PEER, 1), [3], [([1], [1.5])])], False))
    with pytest.raises(TPWireError, match=r"Free.seq_id\[0\]: expected a bin"):
        encode(Free(("peer", 1)))


@pytest.mark.parametrize("data", [None, "text", 7, [b"\x01", b"\x04"]])
def test_what_is_not_bytes_is_refused(data):
    refused(data, "a tensor-parallel message is bytes")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.sampled_from(sorted(MESSAGE_TYPES)))
def test_decode_raises_only_tp_wire_errors(tail, type_byte):
    for data in (tail, bytes([TP_VERSION, type_byte]) + tail):
        try:
            decode(data)
        except TPWireError:
            pass


def test_a_follower_stops_on_a_message_it_cannot_decode():
    from ssd.engine.target_tp import follow

    class Worker:
        calls = []

        def free(self, seq_id):
            self.calls.append(seq_id)

    class Channel:
        def __init__(self, *messages):
            self.messages = list(messages)

        def recv(self):
            return self.messages.pop(0)

    worker, stale = Worker(), bytearray(encode(Free((PEER, 2))))
    stale[0] = TP_VERSION + 1
    with pytest.raises(TPWireError, match="is not supported"):
        follow(worker, Channel(encode(Free((PEER, 1))), bytes(stale), encode(Free((PEER, 3)))))
    assert worker.calls == [(PEER, 1)]
    follow(worker, Channel(encode(Free((PEER, 4))), encode(Stop())))
    assert worker.calls == [(PEER, 1), (PEER, 4)]
