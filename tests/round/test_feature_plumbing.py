"""The target's features reach a feature-reading draft: target -> round core -> draft.

In process: the merge rule and the per-sequence pending features of the round core (ssd/round/features.py; no
workers: replies are handed to the core and what it sends is recorded, tests/round/fakes.py), the target and
draft handlers behind a fake endpoint, the tensor-parallel leader mirroring the features flag. Through real
processes (the shared stack, whose draft is the distilled feature draft): tests/services/test_feature_stack.py.
"""
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ssd import tp_wire, wire
from ssd.engine.draft import DraftWorker
from ssd.engine.draft_handler import DraftHandler
from ssd.engine.features import from_wire
from ssd.engine.target_handler import TargetHandler
from ssd.engine.target_tp import MirroredTarget, build_target, follow
from ssd.models.loader import load_model
from ssd.params import SamplingParams
from ssd.round import CoreConfig, Phase, features
from tests.round.fakes import RecordingMetrics, Rig, ready
from tests.tp_channel import ByteChannel

PEER = b"router-a"
GREEDY = wire.SamplingSpec(0.0, 0, 1.0, 0.0, None)
DRAFT_GREEDY = wire.DraftParamsSpec(0.0, 0, 1.0, 0, None)


class FakeEndpoint:
    """Collects what a handler sends, each message through the codec (so it is a valid wire message)."""

    def __init__(self):
        self.sent = []

    def send(self, peer, msg) -> None:
        self.sent.append((peer, wire.decode(wire.encode(msg))))

    def take(self) -> list:
        out, self.sent = [m for _, m in self.sent], []
        return out


def halves(rows: int, dim: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).standard_normal((rows, dim)).astype("<f2").tobytes()


# ---- the merge rule -----------------------------------------------------------------------------------------------

def test_merge_joins_touching_and_overlapping_blocks_the_newer_rows_winning():
    row = 2   # one float16 per row
    assert features.merge(None, 3, b"aabb", row) == (3, b"aabb")
    assert features.merge((3, b"aabb"), 5, b"cc", row) == (3, b"aabbcc")          # touching after
    assert features.merge((3, b"aabb"), 4, b"XXcc", row) == (3, b"aaXXcc")        # overlapping: new rows win
    assert features.merge((3, b"aabbcc"), 0, b"xxyyzzWW", row) == (0, b"xxyyzzWWbbcc")   # recomputed from 0
    assert features.merge((3, b"aabb"), 1, b"xxyy", row) == (1, b"xxyyaabb")      # touching before
    assert features.merge((3, b"aabb"), 9, b"zz", row) == (9, b"zz")              # a gap: the newer replaces
    assert features.merge((3, b"aabb"), 7, b"", row) == (3, b"aabb")              # nothing new


def test_merge_keeps_the_newest_rows_within_max_feature_bytes():
    row = 1024
    block = bytes(range(256)) * (wire.MAX_FEATURE_BYTES // 256)
    start, data = features.merge((10, block), 10 + len(block) // row, b"\x01" * (3 * row), row)
    assert len(data) == wire.MAX_FEATURE_BYTES and start == 13
    assert data[-3 * row:] == b"\x01" * (3 * row) and data[:row] == block[3 * row:4 * row]


class _Pool:
    hidden_size = 1   # rows of 2 bytes

    def reads_features(self, draft):
        return True


def _ledger():
    return features.FeatureLedger(_Pool(), RecordingMetrics())


def test_the_ledger_keeps_what_merge_would_through_any_order_of_blocks(monkeypatch):
    """The ledger appends a touching block in place and drops old rows in bulk; what it would send is, after every
    block, exactly the fold of `merge` over them (touching, overlapping, before, after a gap, past the cap)."""
    monkeypatch.setattr(wire, "MAX_FEATURE_BYTES", 14)   # 7 rows of 2 bytes
    rng = random.Random(0)
    for trial in range(200):
        ledger, ref, end = _ledger(), None, 10
        req = SimpleNamespace(seq=1, mode="sd", draft="d", target=None)
        for _ in range(rng.randrange(1, 40)):
            kind = rng.random()
            n = rng.randrange(0, 4)
            start = end if kind < 0.7 else max(0, end - rng.randrange(1, 6)) if kind < 0.85 else end + rng.randrange(
                -12, 12)
            data = bytes(rng.randrange(256) for _ in range(2 * n))
            ledger.keep(req, [max(0, start), data])
            ref = features.merge(ref, max(0, start), data, 2)
            if data:
                end = max(0, start) + n
            assert ledger.block(1) == ref, trial
            if rng.random() < 0.05:
                assert ledger.take(req) == ref and ledger.block(1) is None
                ref = None


def test_a_long_plain_stretch_appends_in_place_and_keeps_at_most_twice_a_messages_rows(monkeypatch):
    """At K = 0 nothing goes to the draft, so a sequence's block grows by a round's rows each round: each is appended,
    never merged as bytes (which copied everything pending, every round: 2.5 ms a round over 2048 rounds of 16)."""
    monkeypatch.setattr(wire, "MAX_FEATURE_BYTES", 64)   # 32 rows of 2 bytes
    ledger = _ledger()
    req = SimpleNamespace(seq=1, mode="sd", draft="d", target=None)
    ledger.keep(req, [0, bytes([0, 0])])          # the first block goes through merge
    monkeypatch.setattr(features, "merge", None)   # from here on, calling it fails
    for r in range(1, 100):
        ledger.keep(req, [r, bytes([r, 0])])
        assert len(ledger._pending[1].buf) <= 2 * 64
    assert ledger.take(req) == (100 - 32, b"".join(bytes([r, 0]) for r in range(100 - 32, 100)))
    assert ledger.metrics.feature_rows_sent == 32


def test_runs_split_items_so_each_message_keeps_its_features_within_the_limit():
    big = (0, b"\x00" * (wire.MAX_FEATURE_BYTES // 2 + 2))
    items = [wire.JitItem(i, [1], 1, f) for i, f in enumerate([big, None, big, (0, b"\x00\x00"), big])]
    assert [[it.seq for it in run] for run in features.runs(items)] == [[0, 1], [2, 3], [4]]
    assert list(features.runs([])) == []


# ---- the round core (no workers: replies are handed to it and what it sends is recorded) -----------------------

@pytest.fixture
def rig(caplog):
    """ssd over one target (hidden size 4) and two drafts: one reads features of 4, one of 8."""
    rig = Rig(CoreConfig(adaptive=False), targets=[ready("target", 4)], drafts=[ready("draft", 4), ready("draft", 8)])
    yield rig
    rig.core.shutdown("the test is over")


def admit(rig, mode="ssd"):
    req = rig.core.submit(f"r{mode}{len(rig.core.active)}", [5, 6, 7], SamplingParams(max_tokens=40), mode=mode)
    rig.core.take_new()
    return req


def test_core_sends_each_block_once_with_the_next_draft_message(rig, caplog):
    core = rig.core
    fd, other = rig.drafts
    setup_log = " ".join(r.getMessage() for r in caplog.get_records("setup"))
    assert core.pool.hidden_size == 4 and "reads features of size 8, but the targets' hidden size is 4" in setup_log
    req = admit(rig)
    (_, prefill), = rig.take_sent(wire.Prefill)
    assert prefill.features   # no draft yet, and one in the pool reads features
    row = 8   # bytes per row: 4 float16
    core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.1, [(req.seq, 0, b"p" * 3 * row)]))
    (peer, add), = rig.take_sent(wire.DraftAdd)
    assert peer is fd and add.items[0].tokens == [5, 6, 7, 9] and add.items[0].features == (0, b"p" * 3 * row)
    assert core.features.block(req.seq) is None
    core.dispatch()                        # the first round's JIT (a cache miss)
    (_, jit), = rig.take_sent(wire.Jit)
    assert jit.items[0].features is None   # nothing new since the add
    core.on_message(fd, wire.JitResult(jit.batch_id, [(req.seq, [1, 2, 3], None)], 0.01))
    core.dispatch()
    (_, verify), = rig.take_sent(wire.Verify)
    assert verify.features and rig.take(wire.DraftRound)[0].items[0].features is None
    # the outcome's block (positions 3..4) waits for the next message to the draft: here the next round's
    core.on_message(rig.target, wire.Outcomes(verify.batch_id, [wire.Outcome(req.seq, 1, 4)], 0.1,
                                              [(req.seq, 3, b"v" * 2 * row)]))
    assert core.features.block(req.seq) == (3, b"v" * 2 * row)
    core.on_message(fd, wire.CacheEntries(req.seq, req.round.number, [], 0.01))   # late, and no entry for it
    core.dispatch()
    jit_or_round = rig.take(wire.Jit) + rig.take(wire.DraftRound)
    assert [m.items[0].features for m in jit_or_round] == [(3, b"v" * 2 * row)]
    assert core.features.block(req.seq) is None
    assert rig.metrics.feature_rows_sent == 5


def test_core_rebuilds_a_draft_with_the_pending_features(rig):
    core = rig.core
    fd, _ = rig.drafts
    req = admit(rig)
    rig.take(wire.Prefill)
    core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.1, [(req.seq, 0, b"p" * 24)]))
    rig.take(wire.DraftAdd)
    req.phase = Phase.VERIFY   # as if a round were out; its outcome arrives while the draft is away
    req.round.verify_batch = 77
    core.on_message(rig.target, wire.Outcomes(77, [wire.Outcome(req.seq, 0, 4)], 0.1, [(req.seq, 3, b"a" * 8)]))
    core.on_message(fd, wire.Error("unknown_sequence", "restarted", req.seq))   # the draft lost it: re-add
    (peer, add), = rig.take_sent(wire.DraftAdd)
    assert peer is fd and add.items[0].tokens == [5, 6, 7, 9, 4] and add.items[0].features == (3, b"a" * 8)


def test_a_failed_draft_batch_rebuilds_its_sequences_and_backs_up_the_waiting_ones(rig):
    core = rig.core
    fd, _ = rig.drafts
    req = admit(rig)
    rig.take(wire.Prefill)
    core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.1, []))
    rig.take(wire.DraftAdd)
    core.dispatch()
    (jit,) = rig.take(wire.Jit)
    assert req.phase is Phase.JIT
    core.on_message(fd, wire.Error("internal", "RuntimeError: boom", None))   # the JitResult will never come
    (peer, add), = rig.take_sent(wire.DraftAdd)
    assert peer is fd and add.items[0].seq == req.seq and add.items[0].tokens == [5, 6, 7, 9]
    assert req.phase is not Phase.JIT   # an n-gram (or empty) backup instead of waiting forever
    core.dispatch()
    assert rig.take(wire.Verify)


def test_core_asks_no_features_for_ordinary_drafts_and_ar(rig):
    core = rig.core
    fd, other = rig.drafts
    core.pool.load[fd] = 5                  # the next sequence goes to the draft whose feature size is wrong
    req = admit(rig)
    rig.take(wire.Prefill)
    core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.1, [(req.seq, 0, b"p" * 24)]))
    (peer, add), = rig.take_sent(wire.DraftAdd)
    assert peer is other and add.items[0].features is None and core.features.block(req.seq) is None
    req.phase = Phase.READY
    core.dispatch()
    assert not rig.take(wire.Verify)[0].features
    ar = admit(rig, mode="ar")
    assert not rig.take(wire.Prefill)[0].features
    core.on_message(rig.target, wire.Prefilled([(ar.seq, 9)], 0.1, [(ar.seq, 0, b"p" * 24)]))
    assert core.features.block(ar.seq) is None and not rig.take(wire.DraftAdd)


def test_core_drops_blocks_that_are_not_whole_rows(rig, caplog):
    core = rig.core
    req = admit(rig)
    rig.take(wire.Prefill)
    core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.1, [(req.seq, 0, b"p" * 10)]))
    assert "sent 10 feature bytes" in caplog.text
    assert rig.take(wire.DraftAdd)[0].items[0].features is None


# ---- the workers' handlers (real models, fake endpoints) ------------------------------------------------------

@pytest.fixture(scope="module")
def target_model(default_models):
    return load_model(default_models["target"])


@pytest.fixture(scope="module")
def feature_draft_dir(default_models, target_model, tmp_path_factory):
    """An untrained feature draft initialised from the target (its last layer, `fc` passing the feature
    through), proposing among the 2048 lowest token ids."""
    from ssd.distill.train import init_from_target
    from ssd.models.eagle import write_draft_folder

    folder = tmp_path_factory.mktemp("feature-draft") / "smollm2-eagle"
    draft = init_from_target(target_model, torch.arange(2048), layers=1, seed=0)
    write_draft_folder(draft, folder, tokenizer_from=default_models["target"])
    return folder


def test_target_answers_with_the_features_it_was_asked_for(target_model):
    worker = build_target(target_model, {"max_seqs": 4, "max_len": 256, "kv_tokens": 0, "block_size": 16})
    ep = FakeEndpoint()
    handler = TargetHandler(worker, ep)
    H = target_model.cfg.hidden_size
    prompt = [1, 504, 3365, 28, 253, 1345, 30]
    handler.handle([(PEER, wire.Prefill([wire.PrefillItem(1, prompt, GREEDY)], features=True)),
                    (PEER, wire.Prefill([wire.PrefillItem(2, prompt[:4], GREEDY)]))])
    asked, plain = ep.take()
    assert plain.features == []
    (_, first), = asked.items
    (seq_f, start, data), = asked.features
    assert (seq_f, start, len(data)) == (1, 0, 2 * H * len(prompt))
    rows = from_wire(start, data, H).rows
    with torch.inference_mode():   # the last prompt position's feature is what the first token came from
        assert int(target_model.logits(target_model.norm(rows[-1:].float())).argmax()) == first
    # two verifies in one forward: only the one that asked gets features, those of the positions it computed
    # (the first token's onwards) through the last accepted token
    handler.handle([(PEER, wire.Verify(5, [wire.VerifyItem(1, [7, 7], None)], features=True)),
                    (PEER, wire.Verify(6, [wire.VerifyItem(2, [9], None)]))])
    outs = {m.batch_id: m for m in ep.take()}
    assert outs[6].features == []
    (seq_f, start, data), = outs[5].features
    assert (seq_f, start, len(data)) == (1, len(prompt), 2 * H * (outs[5].items[0].accepted + 1))


def test_draft_takes_features_and_answers_malformed_ones_with_an_error(feature_draft_dir, default_models):
    worker = DraftWorker(load_model(feature_draft_dir), 4, 256, 3, [2, 1, 1, 1])
    H = worker.feature_size
    assert H == 576
    ep = FakeEndpoint()
    handler = DraftHandler(worker, ep)
    tokens = [1, 504, 3365, 28, 253]
    handler.handle([(PEER, wire.DraftAdd([
        wire.DraftAddItem(1, tokens, DRAFT_GREEDY, (0, halves(4, H))),
        wire.DraftAddItem(2, tokens, DRAFT_GREEDY, (0, halves(1, H) + b"\x00\x00"))]))])   # not whole rows
    err, = ep.take()
    assert (err.code, err.seq) == ("invalid_argument", 2) and "features ignored" in err.message
    assert (PEER, 1) in worker and (PEER, 2) in worker and worker.feature_rows_received == 4
    handler.handle([(PEER, wire.DraftRound([wire.DraftRoundItem(1, 1, [7, 8], [9, 9], (4, halves(2, H, 1))),
                                            wire.DraftRoundItem(2, 1, [7], [9], (5, halves(1, H) + b"\x00\x00"))]))])
    replies = ep.take()
    assert worker.feature_rows_received == 6 and worker.seqs[(PEER, 1)].tokens == tokens + [7, 8]
    assert worker.seqs[(PEER, 2)].tokens == tokens + [7]                         # the delta applied all the same
    assert {type(m).__name__ for m in replies} == {"Error", "CacheEntries"}
    handler.handle([(PEER, wire.Jit(3, [wire.JitItem(1, [9], 3, (6, halves(2, H, 2)))]))])
    result, = ep.take()
    assert isinstance(result, wire.JitResult) and len(result.items[0][1]) == 3
    assert worker.feature_rows_received == 8
    far = wire.JitItem(1, [9], 3, (10_000, halves(1, H)))                        # past the draft's maximum length
    handler.handle([(PEER, wire.Jit(4, [far]))])
    err, result = ep.take()
    assert err.code == "invalid_argument" and isinstance(result, wire.JitResult)
    assert worker.feature_rows_received == 8 and worker.seqs[(PEER, 1)].tokens[-2:] == [9, 9]

    ordinary = DraftWorker(load_model(default_models["layer_draft"]), 2, 256, 3, [2, 1, 1, 1])
    ep = FakeEndpoint()
    DraftHandler(ordinary, ep).handle([(PEER, wire.DraftAdd([wire.DraftAddItem(1, tokens, DRAFT_GREEDY,
                                                                               (0, b"\x00\x00"))]))])
    assert ordinary.feature_size == 0 and ep.take() == [] and (PEER, 1) in ordinary


def test_a_draft_round_item_names_its_chains_depth_and_a_depth_past_k_is_an_error(default_models):
    worker = DraftWorker(load_model(default_models["layer_draft"]), 4, 256, 3, [2, 1, 1, 1])
    ep = FakeEndpoint()
    handler = DraftHandler(worker, ep)
    tokens = [1, 504, 3365, 28, 253]
    handler.handle([(PEER, wire.DraftAdd([wire.DraftAddItem(s, tokens, DRAFT_GREEDY) for s in (1, 2, 3)]))])
    handler.handle([(PEER, wire.DraftRound([wire.DraftRoundItem(1, 1, [7], [9, 9], depth=1),
                                            wire.DraftRoundItem(2, 1, [7], [9, 9], depth=4),
                                            wire.DraftRoundItem(3, 1, [7], [9, 9])]))])
    replies = ep.take()
    err, = [m for m in replies if isinstance(m, wire.Error)]
    assert (err.code, err.seq) == ("invalid_argument", 2) and "depth must be" in err.message
    lengths = {m.seq: {len(e.tokens) for e in m.entries} for m in replies if isinstance(m, wire.CacheEntries)}
    assert lengths == {1: {1}, 2: {3}, 3: {3}}   # the refused depth and no depth: the draft's K


def test_tensor_parallel_leader_and_followers_make_the_same_calls_features_included():
    class Worker:
        last_features = {"leader's": "block"}

        def __init__(self):
            self.calls = []

        def prefill(self, requests, features=False):
            self.calls.append(("prefill", [seq_id for seq_id, *_ in requests], features))
            return [0] * len(requests)

        def verify(self, items, features=False):
            self.calls.append(("verify", [it.seq for it in items], features))
            return []

    leader, follower, channel = Worker(), Worker(), ByteChannel()
    mirrored = MirroredTarget(leader, channel)
    mirrored.prefill([((PEER, 1), [1, 2], SamplingParams())], features=True)
    mirrored.verify([wire.VerifyItem((PEER, 1), [3], None)], features=True)
    mirrored.verify([wire.VerifyItem((PEER, 1), [3], None)])
    assert mirrored.last_features == {"leader's": "block"}
    channel.send(tp_wire.encode(tp_wire.Stop()))
    follow(follower, channel)
    assert follower.calls == leader.calls == [("prefill", [(PEER, 1)], True), ("verify", [(PEER, 1)], True),
                                              ("verify", [(PEER, 1)], False)]
