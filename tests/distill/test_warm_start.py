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
