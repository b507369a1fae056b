"""The data-plane codec: every message round-trips, and bad frames raise WireError (only WireError)."""
import subprocess
import sys

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssd import wire
from ssd.wire import (MAX_FRAME_BYTES, MAX_ITEMS, MESSAGE_TYPES, PROTOCOL_VERSION, CacheEntries, CacheEntry, DraftAdd,
                      DraftAddItem, DraftParamsSpec, DraftRound, DraftRoundItem, Error, Free, Hello, Jit, JitItem,
                      JitResult, Outcome, Outcomes, Ping, Pong, Prefill, PrefillItem, Prefilled, PromptLogprobs, Ready,
                      SamplingSpec, SeqLogprobs, Verify, VerifyItem, WireError, decode, encode)

ROW_A = ([3, 17, 40], [0.5, 0.25, 0.25])         # float32-exact probabilities round-trip exactly
ROW_B = ([0, 2**31 - 1], [1.0, 0.0])
SAMPLING = SamplingSpec(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, seed=2**64 - 1, presence_penalty=-2.0,
                        frequency_penalty=0.5, repetition_penalty=1.2, logit_bias=[(0, -100.0), (2**31 - 1, 3.5)],
                        min_tokens=3, ending=[2, 7], seed_stream=True, prompt_logprobs=20)
DRAFT_PARAMS = DraftParamsSpec(temperature=1.0, top_k=32, saguaro_c=0.5, saguaro_f=3, seed=None)
COUPLED = DraftParamsSpec(temperature=0.5, top_k=4, saguaro_c=1.0, saguaro_f=0, seed=9, coupled=True, top_p=0.5,
                          min_p=0.25, constraint_kind="regex", constraint="[0-9]+")
HALVES = np.array([[0.5, -1.0, 2.0], [65504.0, 0.0, -0.25]], "<f2").tobytes()   # two float16 rows of 3

EXAMPLES = [
    Hello(role="router", peer_id="router-0"),
    Ready(role="draft", model_id="SmolLM2-135M", tokenizer_hash="ab12", vocab_size=49152, max_len=8192, k=4,
          fanout=[4, 2, 1, 1, 1], feature_size=576),
    Ping(nonce=2**64 - 1),
    Pong(nonce=0),
    Prefill(items=[PrefillItem(seq=1, tokens=[1, 2, 3], sampling=SAMPLING, prompt_len=2),
                   PrefillItem(seq=2, tokens=[], sampling=SamplingSpec(0.0, 0, 1.0, 0.0, None))], features=True),
    Prefilled(items=[(1, 42), (2, 7)], elapsed_s=0.0125, features=[(1, 0, HALVES), (2, 2**63 - 1, b"")],
              logprobs=[SeqLogprobs(seq=2, logprobs=[-0.0], top_ids=[], top_logprobs=[])],
              prompt_logprobs=[PromptLogprobs(seq=1, logprobs=[-0.5, -3.0], ranks=[1, 2**31 - 1], top_ids=[4, 9],
                                              top_logprobs=[-0.5, -0.75])]),
    Verify(batch_id=9, items=[VerifyItem(seq=1, tokens=[3, 0], proposal=[ROW_A, ROW_B]),
                              VerifyItem(seq=2, tokens=[5], proposal=None)], features=False),
    Outcomes(batch_id=9, items=[Outcome(seq=1, accepted=2, token=11), Outcome(seq=2, accepted=0, token=5)],
             elapsed_s=0.003, features=[(2, 7, HALVES)],
             logprobs=[SeqLogprobs(1, [-0.5, -2.25, -17.0], [0, 2**31 - 1, 4, 5, 11, 3], [-0.1, -0.5, -1.0, -2.25,
                                                                                            -3.0, -17.0])]),
    DraftAdd(items=[DraftAddItem(seq=1, tokens=[1, 2, 3, 42], params=DRAFT_PARAMS, features=(0, HALVES)),
                    DraftAddItem(seq=2, tokens=[1], params=DRAFT_PARAMS, features=None),
                    DraftAddItem(seq=3, tokens=[5, 6], params=COUPLED, prompt_len=1)]),
    DraftRound(items=[DraftRoundItem(seq=1, round=3, delta=[11], spec=[3, 17, 40, 0], features=(4, HALVES)),
                      DraftRoundItem(seq=2, round=5, delta=[], spec=[7], depth=1)],
               fanout=[3, 2, 2, 1]),
    CacheEntries(seq=1, round=4, entries=[CacheEntry(accepted=0, token=3, tokens=[17, 40], proposal=[ROW_A, ROW_A]),
                                          CacheEntry(accepted=2, token=9, tokens=[1], proposal=None)],
                 elapsed_s=0.001),
    Jit(batch_id=2, items=[JitItem(seq=1, delta=[11, 12], room=4, features=(5, HALVES)), JitItem(2, [], 4)]),
    JitResult(batch_id=2, items=[(1, [3, 17], [ROW_A, ROW_B]), (2, [5], None)], elapsed_s=0.002),
    Free(seqs=[1, 2, 2**63 - 1]),
    Error(code="late", message="draft replica 2 is draining", seq=None),
    wire.Restore(items=[PrefillItem(seq=3, tokens=[1, 2, 3, 42, 7], sampling=SAMPLING)]),
    wire.Restored(seqs=[3], elapsed_s=0.02),
]


def frames(msg_type: type, *fields, version=PROTOCOL_VERSION) -> list[bytes]:
    """Hand-made frames for ``msg_type`` whose payload holds exactly ``fields``."""
    byte = next(b for b, cls in MESSAGE_TYPES.items() if cls is msg_type)
    return [bytes([byte]), msgpack.packb([version, *fields], use_bin_type=True)]


def rejects(frames_, *fragments, **kwargs) -> str:
    with pytest.raises(WireError) as err:
        decode(frames_, **kwargs)
    for fragment in fragments:
        assert fragment in str(err.value), f"{fragment!r} not in {str(err.value)!r}"
    return str(err.value)


def test_examples_cover_every_message_type_once():
    assert sorted(type(m).__name__ for m in EXAMPLES) == sorted(c.__name__ for c in MESSAGE_TYPES.values())
    assert all(0 < b <= 0x7F for b in MESSAGE_TYPES)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg):
    out = encode(msg)
    assert len(out) == 2 and len(out[0]) == 1
    assert decode(out) == msg
    assert decode([bytearray(out[0]), memoryview(out[1])]) == msg  # zmq frames arrive as buffers


def test_fields_added_in_version_2_default_to_no_features():
    assert Ready("target", "m", "h", 1, 1, 0, []).feature_size == 0
    assert not Prefill([]).features and not Verify(1, []).features
    assert Prefilled([], 0.1).features == [] and Outcomes(1, [], 0.1).features == []
    assert DraftAddItem(1, [1], DRAFT_PARAMS).features is None
    assert DraftRoundItem(1, 1, [], []).features is None and JitItem(1, [], 1).features is None
    assert decode(encode(Jit(1, [JitItem(1, [], 1)]))).items[0].features is None


def test_features_travel_as_float16_bins_and_encode_takes_bytes_likes():
    payload = msgpack.unpackb(encode(EXAMPLES[7])[1])
    assert payload[-2] == [[2, 7, HALVES]]
    assert np.frombuffer(payload[-2][0][2], "<f2").tolist() == [0.5, -1.0, 2.0, 65504.0, 0.0, -0.25]
    item = DraftRoundItem(1, 1, [], [], features=(np.int64(3), memoryview(bytearray(HALVES))))
    assert decode(encode(DraftRound([item]))).items[0].features == (3, HALVES)


def test_the_feature_layout_is_defined_here():
    assert wire.FEATURE_DTYPE == "<f2" and wire.feature_row_bytes(3) == 6
    assert wire.feature_rows(HALVES, 3) == 2 and wire.feature_rows(b"", 3) == 0
    for data, dim in ((HALVES, 4), (HALVES[:-2], 3), (HALVES, 0)):
        with pytest.raises(WireError, match="not a whole number of float16 rows"):
            wire.feature_rows(data, dim)


def test_rows_travel_as_little_endian_int32_and_float32_bins():
    payload = msgpack.unpackb(encode(EXAMPLES[6])[1])
    ids, probs = payload[2][0][2][0]
    assert np.frombuffer(ids, "<i4").tolist() == ROW_A[0]
    assert np.frombuffer(probs, "<f4").tolist() == ROW_A[1]


def test_encode_accepts_numpy_and_tuples_and_decodes_to_lists():
    msg = VerifyItem(seq=np.int64(4), tokens=np.array([5, 6]), proposal=[(np.array([5]), np.array([0.1]))])
    out = decode(encode(Verify(batch_id=1, items=(msg,))))
    item = out.items[0]
    assert (item.seq, item.tokens, item.proposal[0][0]) == (4, [5, 6], [5])
    assert item.proposal[0][1] == [float(np.float32(0.1))]   # probabilities travel as float32
    assert type(decode(encode(Outcomes(1, [], elapsed_s=1))).elapsed_s) is float


def test_frame_level_rejections_name_the_problem():
    good = encode(Ping(nonce=1))
    rejects([], "2 frames", "got 0")
    rejects([good[0]], "2 frames", "got 1")
    rejects(good + [b""], "2 frames", "got 3")
    rejects(b"\x03\x91\x01", "2 frames", "got bytes")
    rejects([b"", good[1]], "exactly 1 byte", "got 0")
    rejects([b"\x03\x03", good[1]], "exactly 1 byte")
    rejects([b"\x66", good[1]], "unknown message type byte 0x66")
    rejects(["x", good[1]], "frames must be bytes")
    rejects([good[0], b""], "Ping", "malformed msgpack")
    rejects([good[0], b"\xc1garbage"], "Ping", "malformed msgpack")
    rejects([good[0], good[1][:-1]], "Ping", "malformed msgpack")            # truncated
    rejects([good[0], good[1] + b"\x00"], "Ping", "malformed msgpack")       # trailing bytes
    rejects([good[0], msgpack.packb({"v": 1})], "Ping", "malformed msgpack")  # maps are not allowed at all
    rejects([good[0], msgpack.packb(1)], "Ping", "array [version, fields...]")


def test_oversized_payload_is_refused_before_unpacking():
    big = encode(Free(seqs=list(range(1000))))
    rejects(big, "Free", f"payload of {len(big[1])} bytes exceeds max_frame_bytes=1024", max_frame_bytes=1024)
    garbage = [big[0], b"\xc1" * (MAX_FRAME_BYTES + 1)]   # would be 'malformed' if it were unpacked
    rejects(garbage, "exceeds max_frame_bytes")
    assert decode(big, max_frame_bytes=len(big[1])) == Free(seqs=list(range(1000)))
    with pytest.raises(WireError, match="exceeds max_frame_bytes=100"):
        encode(Free(seqs=list(range(1000))), max_frame_bytes=100)


def test_wrong_version_names_both_versions():
    assert PROTOCOL_VERSION == 8
    message = rejects(frames(Ping, 1, version=2), "Ping", "version 2", f"version {PROTOCOL_VERSION}")
    assert "not supported" in message
    rejects(frames(Ping, 1, version="1"), "Ping", "version str '1'")


def test_field_rejections_name_message_and_field():
    rejects(frames(Ping), "Ping: expected the 1 fields ('nonce',), got 0 values")
    rejects(frames(Ping, 1, 2), "Ping", "got 2 values")
    rejects(frames(Ping, "1"), "Ping.nonce: expected an int in [0, 2**64), got str '1'")
    rejects(frames(Ping, True), "Ping.nonce", "got bool")
    rejects(frames(Ping, -1), "Ping.nonce", "got -1")
    rejects(frames(Ping, 1.0), "Ping.nonce", "got 1.0")
    rejects(frames(Free, [1, "2"]), "Free.seqs[1]: expected an int")
    rejects(frames(Outcomes, 1, [[1, 2, 3]], float("nan"), [], []), "Outcomes.elapsed_s: expected a finite float")
    rejects(frames(Outcomes, 1, [[1, 2, 3]], 1, [], []), "Outcomes.elapsed_s", "got 1")   # ints are not floats
    rejects(frames(Outcomes, 1, [[1, 2, -3]], 0.1, [], []), "Outcomes.items[0].token: expected an int in [0, 2**31)")
    rejects(frames(Outcomes, 1, [[1, 2]], 0.1, [], []), "Outcomes.items[0]: expected the 3 fields")
    rejects(frames(Outcomes, 1, [], 0.1), "Outcomes: expected the 5 fields", "got 3 values")   # a version-1 payload
    rejects(frames(Ready, "router", "m", "h", 1, 1, 1, [], 0), "Ready.role: expected one of ('target', 'draft')")
    rejects(frames(Prefilled, [[1, 2, 3]], 0.1, [], [], []), "Prefilled.items[0]: expected an array of 2")
    rejects(frames(DraftRound, [[1, 0, [5], [1, 2**31], None, 0]], []), "DraftRound.items[0].spec[1]", "2**31")
    rejects(frames(DraftRound, [[1, 0, [5], [1], None, -1]], []), "DraftRound.items[0].depth")
    rejects(frames(DraftRound, [[1, 0, [5], [1], None]], []), "DraftRound.items[0]: expected the 6 fields",
            "got 5 values")   # a version-7 item
    rejects(frames(DraftRound, []), "DraftRound: expected the 2 fields", "got 1 values")   # a version-2 payload
    rejects(frames(DraftRound, [], [2, "1"]), "DraftRound.fanout[1]: expected an int")
    spec = [0.5, 0, 1.0, 0.0, None, 0.0, 0.0, 1.0, [], 0, [], None, False, "", "", None]
    rejects(frames(Prefill, [[1, [1], [0.5, 0, 2.0, *spec[3:]], 0]], False), "Prefill.items[0].sampling.top_p")
    rejects(frames(Prefill, [[1, [1], [0.5, 0, 2.0, 0.0, None], 0]], False), "sampling: expected the 16 fields")
    rejects(frames(Prefill, [[1, [1], spec[:12] + [1, "", "", None], 0]], False), "Prefill.items[0].sampling.seed_stream: expected a bool")
    rejects(frames(Prefill, [[1, [1], spec[:15] + [-1], 0]], False), "Prefill.items[0].sampling.prompt_logprobs")
    rejects(frames(Prefill, [[1, [1], spec[:5] + [2.5] + spec[6:], 0]], False),
            "Prefill.items[0].sampling.presence_penalty: expected a finite float in [-2.0, 2.0]")
    rejects(frames(Prefill, [[1, [1], spec[:8] + [[[3, 101.0]]] + spec[9:], 0]], False),
            "Prefill.items[0].sampling.logit_bias[0][1]")
    rejects(frames(Prefill, [[1, [1], spec, -1]], False), "Prefill.items[0].prompt_len")
    rejects(frames(Outcomes, 1, [[1, 0, 3]], 0.1, [], [[1, [0.5], [], []]]),
            "Outcomes.logprobs[0].logprobs[0]: expected a finite float in [-inf, 0.0]")
    rejects(frames(Outcomes, 1, [[1, 0, 3]], 0.1, [], [[1, [float("-inf")], [], []]]), "Outcomes.logprobs[0]")
    rejects(frames(Error, "c", "m", "7"), "Error.seq: expected an int")


def test_feature_rejections():
    rejects(frames(Verify, 1, [], 1), "Verify.features: expected a bool, got 1")         # ints are not flags
    rejects(frames(Prefill, [], 0), "Prefill.features: expected a bool, got 0")
    rejects(frames(Prefill, [], None), "Prefill.features: expected a bool, got NoneType")
    rejects(frames(Ready, "draft", "m", "h", 1, 1, 1, [], -1), "Ready.feature_size: expected an int")
    rejects(frames(Outcomes, 1, [], 0.1, [[1, 0, b"\x00" * 3]], []), "Outcomes.features[0][2]", "even", "got 3 bytes")
    rejects(frames(Prefilled, [], 0.1, [[1, 0, "ab"]], [], []), "Prefilled.features[0][2]", "got str 'ab'")
    rejects(frames(Prefilled, [], 0.1, [[1, -1, b""]], [], []), "Prefilled.features[0][1]: expected an int in [0, 2**63)")
    rejects(frames(Prefilled, [], 0.1, [[1, b""]], [], []), "Prefilled.features[0]: expected an array of 3")
    rejects(frames(Prefilled, [], 0.1, [], [], [[1, [-0.5], [-1], [], []]]), "Prefilled.prompt_logprobs[0].ranks[0]")
    rejects(frames(Prefilled, [], 0.1, [], [], [[1, [0.5], [1], [], []]]), "Prefilled.prompt_logprobs[0].logprobs[0]")
    rejects(frames(Prefilled, [], 0.1, [[1, 0, b""]] * (MAX_ITEMS + 1), [], []), "Prefilled.features", "MAX_ITEMS")
    add = [1, [1], [1.0, 32, 0.5, 3, None, False, 1.0, 0.0, "", ""]]
    rejects(frames(DraftAdd, [add + [[0, b"\x00"], 0]]), "DraftAdd.items[0].features[1]", "got 1 bytes")
    rejects(frames(DraftAdd, [add + [[2**63, b""], 0]]), "DraftAdd.items[0].features[0]", "2**63")
    rejects(frames(DraftAdd, [add + [b"\x00\x00", 0]]), "DraftAdd.items[0].features: expected an array of 2")
    rejects(frames(DraftAdd, [add]), "DraftAdd.items[0]: expected the 5 fields")
    rejects(frames(DraftAdd, [add + [None, -1]]), "DraftAdd.items[0].prompt_len")
    rejects(frames(DraftAdd, [[1, [1], add[2][:8] + [3, ""], None, 0]]), "DraftAdd.items[0].params.constraint_kind")
    rejects(frames(Jit, 1, [[1, [], 4, [0, b"\x00" * 5]]]), "Jit.items[0].features[1]", "even number")
    rejects(frames(DraftRound, [[1, 0, [], [], [0, b"\x00", b"\x00"], 0]], []), "DraftRound.items[0].features")
    big = [frames(Jit, 1, [[1, [], 4, [0, b"\x00" * 64]]])[0],
           msgpack.packb([PROTOCOL_VERSION, 1, [[1, [], 4, [0, b"\x00" * 64]]]], use_bin_type=True)]
    rejects(big, "exceeds max_frame_bytes=32", max_frame_bytes=32)
    for bad, fragment in [(Verify(1, [], features=1), "Verify.features: expected a bool"),
                          (Prefilled([], 0.1, [(1, 0, b"\x00")]), "Prefilled.features[0][2]"),
                          (Jit(1, [JitItem(1, [], 1, (0, [0, 0]))]), "Jit.items[0].features[1]: expected a bin"),
                          (Jit(1, [JitItem(1, [], 1, (-1, b""))]), "Jit.items[0].features[0]"),
                          (DraftRound([DraftRoundItem(1, 1, [], [], (0,))]), "expected a tuple of 2"),
                          (DraftRound([], [2, -1]), "DraftRound.fanout")]:
        with pytest.raises(WireError) as err:
            encode(bad)
        assert fragment in str(err.value), (fragment, str(err.value))


def _verify_frames(row) -> list[bytes]:
    good = [np.array([1], "<i4").tobytes(), np.array([1.0], "<f4").tobytes()]
    return frames(Verify, 5, [[1, [1], None], [2, [1, 1, 1], [good, good, row]]], False)


def test_proposal_rejections():
    where = "Verify.items[1].proposal[2]"
    ids = np.array([4, 7], "<i4").tobytes()
    rejects(_verify_frames([ids, np.array([0.5, np.nan], "<f4").tobytes()]), where, "finite floats in [0, 1]")
    rejects(_verify_frames([ids, np.array([0.5, np.inf], "<f4").tobytes()]), where, "finite floats in [0, 1]")
    rejects(_verify_frames([ids, np.array([-0.5, 0.5], "<f4").tobytes()]), where, "[0, 1]")
    rejects(_verify_frames([ids, np.array([0.5, 1.0001], "<f4").tobytes()]), where, "[0, 1]")
    neg = np.array([4, -7], "<i4").tobytes()
    rejects(_verify_frames([neg, np.array([0.5, 0.5], "<f4").tobytes()]), where, "ids must be ints in [0, 2**31)")
    rejects(_verify_frames([ids, np.array([1.0], "<f4").tobytes()]), where, "same number", "got 8 and 4 bytes")
    rejects(_verify_frames([ids[:5], ids[:5]]), where, "same number")
    rejects(_verify_frames([b"", b""]), where, "same number")
    rejects(_verify_frames([[4, 7], [0.5, 0.5]]), where, "[ids: bin, probs: bin]")
    rejects(_verify_frames([ids]), where, "[ids: bin, probs: bin]")


def test_encode_rejects_bad_fields_naming_them():
    cases = [
        (Ping(nonce=-1), "Ping.nonce"),
        (Ping(nonce="1"), "Ping.nonce"),
        (Verify(1, [VerifyItem(1, [1, 2.0], None)]), "Verify.items[0].tokens[1]"),
        (Verify(1, [VerifyItem(1, [1], [([1, -2], [0.5, 0.5])])]), "Verify.items[0].proposal[0]: a row's ids"),
        (Verify(1, [VerifyItem(1, [1], [([1, 2**31], [0.5, 0.5])])]), "Verify.items[0].proposal[0]"),
        (Verify(1, [VerifyItem(1, [1], [([1], [float("nan")])])]), "probs finite floats in [0, 1]"),
        (Verify(1, [VerifyItem(1, [1], [([1, 2], [0.5])])]), "same length"),
        (Verify(1, [VerifyItem(1, [1], [([], [])])]), "same length in 1.."),
        (Verify(1, [Outcome(1, 1, 1)]), "Verify.items[0]: expected VerifyItem, got Outcome"),
        (Prefill([PrefillItem(1, [1], None)]), "Prefill.items[0].sampling: expected SamplingSpec"),
        (Outcomes(1, [], float("inf")), "Outcomes.elapsed_s"),
        (Prefilled([(1, 2, 3)], 0.1), "Prefilled.items[0]: expected a tuple of 2"),
    ]
    for msg, fragment in cases:
        with pytest.raises(WireError, match=None) as err:
            encode(msg)
        assert fragment in str(err.value), (fragment, str(err.value))
    with pytest.raises(WireError, match="not a wire message"):
        encode(SAMPLING)


def test_limits_are_enforced_and_named():
    too_many = list(range(MAX_ITEMS + 1))
    with pytest.raises(WireError, match=f"Free.seqs: {MAX_ITEMS + 1} elements exceeds MAX_ITEMS={MAX_ITEMS}"):
        encode(Free(seqs=too_many))
    rejects(frames(Free, too_many), "Free.seqs", f"exceeds MAX_ITEMS={MAX_ITEMS}")
    rejects(frames(Jit, 1, [[1, [], 4]] * (MAX_ITEMS + 1)), "Jit.items", "MAX_ITEMS")
    entries = [[0, 1, [], None]] * (wire.MAX_ENTRIES + 1)
    rejects(frames(CacheEntries, 1, 1, entries, 0.1), "CacheEntries.entries", "MAX_ENTRIES")
    rejects(frames(Hello, "x" * (wire.MAX_STR + 1), "p"), "Hello.role", "MAX_STR")
    rejects(frames(Ready, "draft", "m", "h", 1, 1, 1, [1] * (wire.MAX_ROWS + 1), 0), "Ready.fanout", "MAX_ROWS")
    huge_array = bytes([0xDD]) + (2**32 - 1).to_bytes(4, "big")   # claims 4 billion elements, holds none
    rejects([b"\x50", bytes([0x92, 0x01]) + huge_array], "Free", "malformed msgpack")


FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
_msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=5), max_leaves=30)


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=4))
def test_decode_of_arbitrary_frames_raises_only_wire_error(raw):
    try:
        decode(raw)
    except WireError:
        pass


@FUZZ
@given(st.sampled_from(sorted(MESSAGE_TYPES)), st.lists(_msgpack_values, max_size=6))
def test_decode_of_well_formed_but_wrongly_typed_payloads_raises_only_wire_error(byte, fields):
    try:
        decode([bytes([byte]), msgpack.packb([PROTOCOL_VERSION, *fields], use_bin_type=True)])
    except WireError:
        pass


@FUZZ
@given(st.sampled_from(EXAMPLES), st.data())
def test_decode_of_mutated_valid_payloads_raises_only_wire_error(msg, data):
    head, body = encode(msg)
    body = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = data.draw(st.integers(0, max(len(body) - 1, 0)))
        if op == "flip" and body:
            body[pos] ^= data.draw(st.integers(1, 255))
        elif op == "insert":
            body[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and body:
            del body[pos]
        elif op == "truncate":
            del body[pos:]
    try:
        decoded = decode([head, bytes(body)])
    except WireError:
        return
    assert type(decoded) in MESSAGE_TYPES.values()
    assert decode(encode(decoded)) == decoded   # whatever decodes is a valid message


def test_import_does_not_pull_in_torch():
    code = "import sys, ssd.wire; assert 'torch' not in sys.modules, 'ssd.wire imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
