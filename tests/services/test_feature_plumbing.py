"""The target's features reach a feature-reading draft: target -> router -> draft over the data plane.

In process: the router's merge rule and per-sequence pending features (no workers: messages are handed to
it), the target and draft handlers behind a fake endpoint, the tensor-parallel leader mirroring the features
flag. Real processes: the shared stack, whose draft is the distilled feature draft: greedy output equals
in-process AR with drafts accepted, sampled requests complete (their distribution: test_stack_sampling.py), and
the router forwarded the target's feature rows to the draft.
"""
import urllib.request

import numpy as np
import pytest
import torch

from ssd import tp_wire, wire
from ssd.client import Client
from ssd.engine.draft import DraftWorker
from ssd.engine.draft_handler import DraftHandler
from ssd.engine.features import from_wire
from ssd.engine.target import VerifyItem
from ssd.engine.target_handler import TargetHandler
from ssd.models.loader import load_model
from ssd.params import SamplingParams
from ssd.engine.target_tp import MirroredTarget, build_target, follow
from services.router import features
from services.router.core import CoreConfig, Phase, RouterCore

PEER = b"router-a"
GREEDY = wire.SamplingSpec(0.0, 0, 1.0, 0.0, None)
DRAFT_GREEDY = wire.DraftParamsSpec(0.0, 0, 1.0, 0, None)
N_PROMPTS, N_TOKENS = 4, 32


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


def feature_rows_total(metrics_text: str) -> float:
    return float(next(line.split()[-1] for line in metrics_text.splitlines()
                      if line.startswith("ssd_feature_rows_total ")))


# ---- the router's merge rule -----------------------------------------------------------------------------------

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


def test_runs_split_items_so_each_message_keeps_its_features_within_the_limit():
    big = (0, b"\x00" * (wire.MAX_FEATURE_BYTES // 2 + 2))
    items = [wire.JitItem(i, [1], 1, f) for i, f in enumerate([big, None, big, (0, b"\x00\x00"), big])]
    assert [[it.seq for it in run] for run in features.runs(items)] == [[0, 1], [2, 3], [4]]
    assert list(features.runs([])) == []


# ---- the router core (no workers: messages are handed to it and what it sends is recorded) ---------------------

def ready(role: str, feature_size: int) -> wire.Ready:
    return wire.Ready(role, "m", "h", 100, 256, 3, [2, 1, 1, 1] if role == "draft" else [], feature_size)


@pytest.fixture
def core(caplog):
    """A router over one target (hidden size 4) and two drafts: one reads features of 4, one of 8."""
    core = RouterCore(CoreConfig(adaptive=False), ["tcp://127.0.0.1:9"], ["tcp://127.0.0.1:10", "tcp://127.0.0.1:11"],
                      "h", [2])
    core.sent = []
    for peer, r in zip([*core.targets, *core.drafts], [ready("target", 4), ready("draft", 4), ready("draft", 8)]):
        peer.ready, peer.alive = r, True
        peer.send = lambda msg, peer=peer: core.sent.append((peer, msg)) or True
    core.handshake()
    yield core
    core._shutdown()


def admit(core, mode="ssd"):
    req = core.submit(f"r{mode}{len(core.active)}", [5, 6, 7], SamplingParams(max_tokens=40), mode=mode)
    core._take_new()
    return req


def sent(core, cls) -> list:
    out = [(p, m) for p, m in core.sent if isinstance(m, cls)]
    core.sent = [(p, m) for p, m in core.sent if not isinstance(m, cls)]
    return out


def test_router_sends_each_block_once_with_the_next_draft_message(core, caplog):
    fd, other = core.drafts
    setup_log = " ".join(r.getMessage() for r in caplog.get_records("setup"))
    assert core.hidden_size == 4 and "reads features of size 8, but the targets' hidden size is 4" in setup_log
    req = admit(core)
    (_, prefill), = sent(core, wire.Prefill)
    assert prefill.features   # no draft yet, and one in the pool reads features
    row = 8   # bytes per row: 4 float16
    core._on_target(core.targets[0], wire.Prefilled([(req.seq, 9)], 0.1, [(req.seq, 0, b"p" * 3 * row)]))
    (peer, add), = sent(core, wire.DraftAdd)
    assert peer is fd and add.items[0].tokens == [5, 6, 7, 9] and add.items[0].features == (0, b"p" * 3 * row)
    assert req.seq not in core._features
    core._dispatch()                       # the first round's JIT (a cache miss)
    (_, jit), = sent(core, wire.Jit)
    assert jit.items[0].features is None   # nothing new since the add
    core._on_draft(fd, wire.JitResult(jit.batch_id, [(req.seq, [1, 2, 3], None)], 0.01))
    core._dispatch()
    (_, verify), = sent(core, wire.Verify)
    assert verify.features and sent(core, wire.DraftRound)[0][1].items[0].features is None
    # the outcome's block (positions 3..4) waits for the next message to the draft: here the next round's
    core._on_target(core.targets[0], wire.Outcomes(verify.batch_id, [wire.Outcome(req.seq, 1, 4)], 0.1,
                                                   [(req.seq, 3, b"v" * 2 * row)]))
    assert core._features[req.seq] == (3, b"v" * 2 * row)
    core._dispatch()
    jit_or_round = sent(core, wire.Jit) + sent(core, wire.DraftRound)
    assert [m.items[0].features for _, m in jit_or_round] == [(3, b"v" * 2 * row)]
    assert req.seq not in core._features
    assert feature_rows_total(core.metrics.render()[0].decode()) == 5


def test_router_rebuilds_a_draft_with_the_pending_features(core):
    fd, _ = core.drafts
    req = admit(core)
    sent(core, wire.Prefill)
    core._on_target(core.targets[0], wire.Prefilled([(req.seq, 9)], 0.1, [(req.seq, 0, b"p" * 24)]))
    sent(core, wire.DraftAdd)
    req.phase = Phase.VERIFY   # as if a round were out; its outcome arrives while the draft is away
    req.verify_batch = 77
    core._on_target(core.targets[0], wire.Outcomes(77, [wire.Outcome(req.seq, 0, 4)], 0.1, [(req.seq, 3, b"a" * 8)]))
    core._on_draft(fd, wire.Error("unknown_sequence", "restarted", req.seq))   # the draft lost it: re-add
    (_, add), = sent(core, wire.DraftAdd)
    assert add.items[0].tokens == [5, 6, 7, 9, 4] and add.items[0].features == (3, b"a" * 8)


def test_a_failed_draft_batch_rebuilds_its_sequences_and_backs_up_the_waiting_ones(core):
    fd, _ = core.drafts
    req = admit(core)
    sent(core, wire.Prefill)
    core._on_target(core.targets[0], wire.Prefilled([(req.seq, 9)], 0.1, []))
    sent(core, wire.DraftAdd)
    core._dispatch()
    (_, jit), = sent(core, wire.Jit)
    assert req.phase is Phase.JIT
    core._on_draft(fd, wire.Error("internal", "RuntimeError: boom", None))   # the JitResult will never come
    (_, add), = sent(core, wire.DraftAdd)
    assert add.items[0].seq == req.seq and add.items[0].tokens == [5, 6, 7, 9]
    assert req.phase is not Phase.JIT   # an n-gram (or empty) backup instead of waiting forever
    core._dispatch()
    assert sent(core, wire.Verify)


def test_router_asks_no_features_for_ordinary_drafts_and_ar(core):
    fd, other = core.drafts
    core._load[fd] = 5                      # the next sequence goes to the draft whose feature size is wrong
    req = admit(core)
    sent(core, wire.Prefill)
    core._on_target(core.targets[0], wire.Prefilled([(req.seq, 9)], 0.1, [(req.seq, 0, b"p" * 24)]))
    (peer, add), = sent(core, wire.DraftAdd)
    assert peer is other and add.items[0].features is None and req.seq not in core._features
    req.phase = Phase.READY
    core._dispatch()
    assert not sent(core, wire.Verify)[0][1].features
    ar = admit(core, mode="ar")
    assert not sent(core, wire.Prefill)[0][1].features
    core._on_target(core.targets[0], wire.Prefilled([(ar.seq, 9)], 0.1, [(ar.seq, 0, b"p" * 24)]))
    assert ar.seq not in core._features and not sent(core, wire.DraftAdd)


def test_router_drops_blocks_that_are_not_whole_rows(core, caplog):
    req = admit(core)
    sent(core, wire.Prefill)
    core._on_target(core.targets[0], wire.Prefilled([(req.seq, 9)], 0.1, [(req.seq, 0, b"p" * 10)]))
    assert "sent 10 feature bytes" in caplog.text
    assert sent(core, wire.DraftAdd)[0][1].items[0].features is None


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


def test_tensor_parallel_leader_and_followers_make_the_same_calls_features_included():
    class Worker:
        last_features = {"leader's": "block"}

        def __init__(self):
            self.calls = []

        def prefill(self, requests, features=False):
            self.calls.append(("prefill", [seq_id for seq_id, *_ in requests], features))
            return [0] * len(requests)

        def verify(self, items, features=False):
            self.calls.append(("verify", [it.seq_id for it in items], features))
            return []

    class Channel:   # the broadcast's bytes (tp_wire messages), without torch.distributed
        def __init__(self):
            self.ops = []

        def send(self, data):
            self.ops.append(bytes(data))

        def recv(self):
            return self.ops.pop(0)

    leader, follower, channel = Worker(), Worker(), Channel()
    mirrored = MirroredTarget(leader, channel)
    mirrored.prefill([((PEER, 1), [1, 2], SamplingParams())], features=True)
    mirrored.verify([VerifyItem((PEER, 1), [3], None)], features=True)
    mirrored.verify([VerifyItem((PEER, 1), [3], None)])
    assert mirrored.last_features == {"leader's": "block"}
    channel.send(tp_wire.encode(tp_wire.Stop()))
    follow(follower, channel)
    assert follower.calls == leader.calls == [("prefill", [(PEER, 1)], True), ("verify", [(PEER, 1)], True),
                                              ("verify", [(PEER, 1)], False)]


# ---- a real stack -----------------------------------------------------------------------------------------------

def feature_rows_forwarded(stack) -> float:
    with urllib.request.urlopen(f"http://{stack.http_address}/metrics", timeout=30) as response:
        return feature_rows_total(response.read().decode())


def test_a_feature_draft_through_the_stack_keeps_output_exact(stack, chat_prompts, ar_reference, assert_speculated):
    """On the shared stack (tests/services/conftest.py), whose draft is the product's distilled feature draft."""
    before = feature_rows_forwarded(stack)
    with Client(stack.grpc_address, timeout=600) as client:
        for mode in ("ssd", "sd"):
            results = [client.generate(p, max_tokens=N_TOKENS, ignore_eos=True, mode=mode)
                       for p in chat_prompts[:N_PROMPTS]]
            assert [r.token_ids for r in results] == ar_reference[:N_PROMPTS], mode
            assert_speculated(results, mode)
        rows = feature_rows_forwarded(stack) - before
        # every prompt position and every committed position but the last of each request, at most
        assert 0 < rows <= 2 * sum(len(p) + N_TOKENS for p in chat_prompts[:N_PROMPTS])
        sampled = [client.generate(p, max_tokens=N_TOKENS, ignore_eos=True, mode="ssd", temperature=0.8, seed=i)
                   for i, p in enumerate(chat_prompts[:2])]
        assert [len(r.token_ids) for r in sampled] == [N_TOKENS, N_TOKENS]
        assert feature_rows_forwarded(stack) - before > rows
    draft_log = (stack.logs / "draft0.log").read_text()
    assert "features ignored" not in draft_log and "Traceback" not in draft_log
    router_log = (stack.logs / "router.log").read_text()
    assert "feature bytes" not in router_log and "reads features of size" not in router_log
