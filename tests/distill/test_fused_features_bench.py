"""bench/fused_features.py: the fused draft starts as the shipped one, learns only through the fuse's new blocks at
first, and a shard without the extra layers is refused."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ssd.distill.corpus import make_batch
from ssd.distill.data import DataConfig, generate_shard, load_shards, shard_path
from ssd.distill.train import copy_trained, init_from_target
from ssd.distill.unroll import unrolled_logits
from ssd.models.loader import load_model
from ssd.models.prepare import EAGLE_WEIGHTS
from ssd.tokenizer import Tokenizer
from tests.bench_scripts import load

bench = load("fused_features")


@pytest.fixture(scope="module")
def data(default_models, tmp_path_factory):
    target = load_model(default_models["target"])
    tok = Tokenizer.from_folder(default_models["target"])
    folder = tmp_path_factory.mktemp("teacher")
    items = [(0, "chat", "Say hello."), (1, "math", "What is 2 + 3?"), (2, "code", "Write a Python loop."),
             (3, "chat", "Name a colour.")]
    for i, chunk in enumerate((items[:1], items[1:3], items[3:])):
        save_file(generate_shard(target, tok, chunk, DataConfig(max_new_tokens=12, batch=2)),
                  str(shard_path(folder, i)))
    return target, folder


def shipped_draft(target):
    warm = load_file(str(EAGLE_WEIGHTS))
    draft = init_from_target(target, warm["vocab_ids"].long(), 1, 0)
    copy_trained(draft, warm)
    return draft.requires_grad_(False)


def test_the_fused_draft_starts_out_computing_what_the_shipped_one_does(data):
    target, folder = data
    shards = load_shards(folder)
    assert {"features_l2", "features_l15"} <= set(shards[0])
    last = bench.sequences(shards, fused=False)
    fused = bench.sequences(shards, fused=True)
    toks, feats, _, _ = make_batch(last, 64)
    toks3, feats3, _, _ = make_batch(fused, 64)
    assert feats3.shape[-1] == 3 * feats.shape[-1] and torch.equal(toks, toks3)
    plain = unrolled_logits(shipped_draft(target), toks, feats, 3)
    widened = unrolled_logits(bench.make_fused(shipped_draft(target), bench.rms_scales(shards[0])), toks3, feats3, 3)
    for a, b in zip(plain, widened):
        assert torch.equal(a, b)


def test_both_variants_score_alike_at_step_0_and_apart_after_training(data, tmp_path):
    target, folder = data
    runs = {v: bench.run(v, target, folder, tmp_path / v, minutes=5, held=1, held_seqs=4, max_steps=2,
                         eval_every=2, log=lambda *_: None) for v in ("last", "fused")}
    assert runs["last"]["curve"][0] == runs["fused"]["curve"][0]
    assert [c["step"] for c in runs["fused"]["curve"]] == [0, 2]
    low, mid, last = runs["fused"]["fuse_block_norms"]
    assert low > 0 and mid > 0                   # the extra layers' blocks left zero
    assert last == pytest.approx(576 ** 0.5, rel=0.05)   # the last feature's block is still near the identity
    written = json.loads((tmp_path / "fused" / "result.json").read_text())
    assert written["steps"] == 2 and written["curve"] == runs["fused"]["curve"]
    lines = [json.loads(x) for x in (tmp_path / "fused" / "log.jsonl").read_text().splitlines()]
    assert lines[0]["variant"] == "fused" and lines[-1]["held"]["step"] == 2


def test_a_shard_without_the_extra_layers_is_refused_for_the_fused_draft(data):
    _, folder = data
    shard = {k: v for k, v in load_shards(folder)[0].items() if k != "features_l15"}
    assert bench.sequences([shard], fused=False)
    with pytest.raises(ValueError, match="features_l15"):
        bench.sequences([shard], fused=True)


def test_the_input_part_trains_the_input_layer_and_the_fuse_alone(data, tmp_path):
    target, folder = data
    H = target.cfg.hidden_size
    fc = H * 2 * H + H
    for variant, expected in (("last", fc), ("fused", fc + H * 3 * H)):
        bench.run(variant, target, folder, tmp_path / variant, minutes=5, held=1, held_seqs=2, max_steps=1,
                  part="input", log=lambda *_: None)
        first = json.loads((tmp_path / variant / "log.jsonl").read_text().splitlines()[0])
        assert first["part"] == "input" and first["trained_parameters"] == expected
    with pytest.raises(ValueError, match="part"):
        bench.run("last", target, folder, tmp_path / "bad", minutes=5, part="layer", log=lambda *_: None)
