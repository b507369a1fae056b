"""The feature-reading draft: its training-time unrolled forward is exactly what the paged model computes
when it drafts, and its folder format loads back (or fails with a message that names the problem)."""
import json

import pytest
import torch

from ssd.config import ModelConfigError
from ssd.distill.train import init_from_target
from ssd.distill.unroll import unrolled_logits
from ssd.models.decoder import ForwardBatch
from ssd.models.eagle import FeatureDraft, write_draft_folder
from ssd.models.loader import WeightLoadError, load_model


def _tiny_draft(target, layers: int):
    torch.manual_seed(1)
    draft = init_from_target(target, torch.arange(0, 128, 2), layers=layers, feature_rms=3.0)
    with torch.no_grad():
        draft.fc_weight.add_(torch.randn_like(draft.fc_weight) * 0.3)
    return draft.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    target = load_model(tiny_llama_dir)
    return target, _tiny_draft(target, 1)


def _paged_chain(draft, toks, feats, start, depth):
    """Draft `depth` logits rows the way inference does: positions 0..start from target features, then each
    next position from the draft's own previous output (teacher tokens as inputs)."""
    cache = draft.make_cache(1, 64)
    slot = cache.allocate()
    cache.ensure(slot, 64)
    fb = ForwardBatch.ragged([toks[:start + 1].tolist()], [0], [slot])
    fb.features = torch.cat((torch.zeros(1, 1, feats.shape[-1]), feats[None, :start]), dim=1)
    hidden, out = draft(fb, cache, features=True)
    rows, prev = [draft.draft_logits(hidden[0, -1])], out[:, -1:]
    for p in range(start + 1, start + depth):
        fb = ForwardBatch.ragged([[int(toks[p])]], [p], [slot])
        fb.features = prev
        hidden, prev = draft(fb, cache, features=True)
        rows.append(draft.draft_logits(hidden[0, -1]))
    return rows


@pytest.mark.parametrize("layers", [1, 2])
def test_unrolled_forward_is_the_drafting_chain(tiny, layers):
    draft = _tiny_draft(tiny[0], layers)
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, 128, (40,), generator=g)
    feats = torch.randn(40, 64, generator=g) * 3
    unrolled = unrolled_logits(draft, toks[None], feats[None], 4)
    for start in (0, 5, 20, 33):
        chain = _paged_chain(draft, toks, feats, start, 4)
        for k, row in enumerate(chain):
            torch.testing.assert_close(row, unrolled[k][0, start + k], rtol=1e-4, atol=1e-4)


def test_folder_round_trip_and_restricted_vocabulary(tiny, tiny_llama_dir, tmp_path):
    _, draft = tiny
    write_draft_folder(draft, tmp_path / "d", tokenizer_from=tiny_llama_dir)
    loaded = load_model(tmp_path / "d")
    assert isinstance(loaded, FeatureDraft) and loaded.reads_features
    for (name, a), (_, b) in zip(draft.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    logits = loaded.logits(torch.randn(3, 64))
    outside = torch.ones(128, dtype=torch.bool)
    outside[loaded.vocab_ids] = False
    assert torch.isinf(logits[:, outside]).all() and torch.isfinite(logits[:, ~outside]).all()


def test_bad_folders_say_what_is_wrong(tiny, tiny_llama_dir, tmp_path):
    _, draft = tiny
    folder = tmp_path / "d"
    write_draft_folder(draft, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["ssd_feature_draft"] = {"draft_vocab_size": 64}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="ssd_feature_draft"):
        load_model(folder)
    bad = init_from_target(load_model(tiny_llama_dir), torch.arange(0, 128, 2))
    bad.vocab_ids = torch.full((64,), 500)
    write_draft_folder(bad, tmp_path / "e")
    with pytest.raises(WeightLoadError, match="vocab_ids"):
        load_model(tmp_path / "e")
