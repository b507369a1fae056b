"""Training from a trained draft (`TrainConfig.init_from`): the run starts at that draft, on its vocabulary."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from ssd.distill.data import DataConfig, generate_shard, shard_path
from ssd.distill.train import TrainConfig, train
from ssd.models.loader import load_model
from ssd.models.prepare import EAGLE_WEIGHTS
from ssd.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def data(default_models, tmp_path_factory):
    target = load_model(default_models["target"])
    tok = Tokenizer.from_folder(default_models["target"])
    folder = tmp_path_factory.mktemp("teacher")
    items = [(0, "chat", "Say hello."), (1, "math", "What is 2 + 3?"), (2, "code", "Write a Python loop.")]
    for i, chunk in enumerate((items[:1], items[1:])):
        save_file(generate_shard(target, tok, chunk, DataConfig(max_new_tokens=8, batch=2, extra_layers=())),
                  str(shard_path(folder, i)))
    return target, folder


def test_zero_steps_from_the_packaged_draft_export_it_unchanged(data, tmp_path):
    target, folder = data
    cfg = TrainConfig(steps=0, minutes=1, init_from=str(EAGLE_WEIGHTS), checkpoint_every=1000)
    train(target, folder, tmp_path, cfg, log=lambda *_: None, progress=False)
    shipped, out = load_file(str(EAGLE_WEIGHTS)), load_file(str(tmp_path / "draft.safetensors"))
    assert set(out) == set(shipped)
    for name, t in shipped.items():
        assert torch.equal(out[name], t), name


def test_steps_from_the_packaged_draft_keep_its_vocabulary_and_move_its_weights(data, tmp_path):
    target, folder = data
    cfg = TrainConfig(steps=2, minutes=1, init_from=str(EAGLE_WEIGHTS), checkpoint_every=1000, warmup=1)
    history = train(target, folder, tmp_path, cfg, log=lambda *_: None, progress=False)
    shipped, out = load_file(str(EAGLE_WEIGHTS)), load_file(str(tmp_path / "draft.safetensors"))
    assert torch.equal(out["vocab_ids"], shipped["vocab_ids"])
    assert not torch.equal(out["fc.weight"], shipped["fc.weight"])
    assert 0 < history["vocab_cover"] <= 1


def test_tensors_of_another_shape_of_draft_are_refused(data, tmp_path):
    target, folder = data
    st = load_file(str(EAGLE_WEIGHTS))
    del st["fc.bias"]
    bad = tmp_path / "bad.safetensors"
    save_file(st, str(bad))
    with pytest.raises(ValueError, match="lack"):
        train(target, folder, tmp_path / "run", TrainConfig(steps=0, minutes=1, init_from=str(bad)),
              log=lambda *_: None, progress=False)


def test_a_draft_grown_by_a_layer_starts_out_computing_what_it_grew_from(data, tmp_path):
    from ssd.distill.train import load_trained
    from ssd.distill.unroll import unrolled_logits

    target, folder = data
    cfg = TrainConfig(steps=0, minutes=1, init_from=str(EAGLE_WEIGHTS), checkpoint_every=1000, layers=2)
    train(target, folder, tmp_path / "grown", cfg, log=lambda *_: None, progress=False)
    grown = load_trained(target, tmp_path / "grown")
    assert len(grown.layers) == 2
    out = load_file(str(tmp_path / "grown" / "draft.safetensors"))
    assert {k for k in out if k.startswith("model.layers.1.")}          # the new layer ships with the rest
    train(target, folder, tmp_path / "same", TrainConfig(steps=0, minutes=1, init_from=str(EAGLE_WEIGHTS),
                                                         checkpoint_every=1000), log=lambda *_: None, progress=False)
    same = load_trained(target, tmp_path / "same")
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, 2000, (1, 24), generator=g)
    feats = torch.randn(1, 24, target.cfg.hidden_size, generator=g) * 30
    for a, b in zip(unrolled_logits(grown, toks, feats, 3), unrolled_logits(same, toks, feats, 3)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    # one step moves the new layer off the identity
    cfg = TrainConfig(steps=1, minutes=1, init_from=str(EAGLE_WEIGHTS), checkpoint_every=1000, layers=2, warmup=1)
    train(target, folder, tmp_path / "step", cfg, log=lambda *_: None, progress=False)
    stepped = load_file(str(tmp_path / "step" / "draft.safetensors"))
    assert stepped["model.layers.1.mlp.down_proj.weight"].abs().sum() > 0


def test_a_draft_cannot_shrink_by_growing(data, tmp_path):
    from ssd.distill.train import copy_trained, init_from_target

    target, _ = data
    st = load_file(str(EAGLE_WEIGHTS))
    st2 = dict(st) | {k.replace("model.layers.0.", "model.layers.1."): v for k, v in st.items()
                      if k.startswith("model.layers.0.")}
    draft = init_from_target(target, st["vocab_ids"].long(), layers=1)
    with pytest.raises(ValueError, match="cannot grow"):
        copy_trained(draft, st2, grow=True)


def test_training_only_the_grown_layer_leaves_the_draft_underneath_as_shipped(data, tmp_path):
    target, folder = data
    shipped = load_file(str(EAGLE_WEIGHTS))
    cfg = TrainConfig(steps=1, minutes=1, init_from=str(EAGLE_WEIGHTS), checkpoint_every=1000, layers=2, warmup=1,
                      train_only="grown")
    train(target, folder, tmp_path / "run", cfg, log=lambda *_: None, progress=False)
    # resumed for a second step: what did not train still comes from the shipped draft, not the target
    cfg = TrainConfig(steps=2, minutes=1, init_from=str(EAGLE_WEIGHTS), checkpoint_every=1000, layers=2, warmup=1,
                      train_only="grown")
    train(target, folder, tmp_path / "run", cfg, log=lambda *_: None, progress=False)
    out = load_file(str(tmp_path / "run" / "draft.safetensors"))
    for name, t in shipped.items():
        assert torch.equal(out[name], t), name
    new = [k for k in out if k.startswith("model.layers.1.")]
    assert new and out["model.layers.1.mlp.down_proj.weight"].abs().sum() > 0
    state = load_file(str(tmp_path / "run" / "state.safetensors"))
    assert int(state["step"]) == 2
    assert {k for k in state if k.startswith("w.")} == {k for k in state if k.startswith("w.layers.1.")}


def test_training_only_grown_layers_needs_a_draft_to_grow(data, tmp_path):
    target, folder = data
    with pytest.raises(ValueError, match="needs init_from"):
        TrainConfig(train_only="grown")
    with pytest.raises(ValueError, match="grow it"):
        train(target, folder, tmp_path / "run", TrainConfig(steps=0, minutes=1, init_from=str(EAGLE_WEIGHTS),
                                                            train_only="grown"), log=lambda *_: None, progress=False)
    with pytest.raises(ValueError, match="train_only"):
        TrainConfig(train_only="some")


@pytest.mark.parametrize("native", [False, True])
def test_bf16_autocast_runs_only_where_the_device_computes_bfloat16(data, tmp_path, monkeypatch, native):
    from ssd.worker import service

    target, folder = data
    monkeypatch.setattr(service, "native_bf16", lambda device: native)
    real, enabled = torch.autocast, []

    def autocast(device_type, dtype=None, enabled_=True, **kw):
        enabled.append(kw.get("enabled", enabled_))
        return real(device_type, dtype=dtype, **kw)

    monkeypatch.setattr(torch, "autocast", autocast)
    lines = []
    history = train(target, folder, tmp_path, TrainConfig(steps=1, minutes=1, init_from=str(EAGLE_WEIGHTS),
                                                          checkpoint_every=1000, warmup=1), log=lines.append,
                    progress=False)
    assert history["autocast"] == ("bfloat16" if native else "float32")
    assert any("no native bfloat16" in line for line in lines) != native
    assert enabled == [native]   # the training step's autocast
