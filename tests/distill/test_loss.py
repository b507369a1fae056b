"""The distillation loss (`ssd.distill.train.loss_fn`): cross-entropy against the target's distribution at every
depth of the unrolled draft, and with `correction_weight` the chains that start right after a draft error (where
the engine's rounds start) count that much more."""
import pytest
import torch

from ssd.distill.train import TrainConfig, init_from_target, loss_fn, target_logprobs
from ssd.distill.unroll import unrolled_logits
from ssd.models.loader import load_model


@pytest.fixture(scope="module")
def setup(tiny_llama_dir):
    target = load_model(tiny_llama_dir)
    torch.manual_seed(0)
    draft = init_from_target(target, torch.arange(0, 128), feature_rms=3.0)
    with torch.no_grad():
        draft.fc_weight.add_(torch.randn_like(draft.fc_weight) * 0.3)
    g = torch.Generator().manual_seed(1)
    toks = torch.randint(0, 128, (2, 30), generator=g)
    feats = torch.randn(2, 30, 64, generator=g) * 3
    valid = torch.ones(2, 30, dtype=torch.bool)
    valid[1, 25:] = False
    return draft, toks, feats, valid


def _by_hand(draft, toks, feats, valid, depth, decay, beta):
    logits = unrolled_logits(draft, toks, feats, depth)
    tgt = target_logprobs(draft, feats).float()
    wrong = logits[0].argmax(-1) != tgt.argmax(-1)
    total = 0.0
    for k in range(1, depth + 1):
        num = den = 0.0
        for b in range(toks.shape[0]):
            for p in range(k - 1, toks.shape[1]):
                if not valid[b, p]:
                    continue
                w = 1.0 + (beta if p - k >= 0 and wrong[b, p - k] else 0.0)
                ce = -(tgt[b, p].exp() * torch.log_softmax(logits[k - 1][b, p].float(), -1)).sum()
                num, den = num + w * ce, den + w
        total += decay ** (k - 1) * num / den
    return total, wrong


@pytest.mark.parametrize("beta", [0.0, 1.5])
def test_the_loss_weights_chains_after_a_draft_error(setup, beta):
    draft, toks, feats, valid = setup
    cfg = TrainConfig(depth=3, depth_decay=0.8, correction_weight=beta)
    with torch.no_grad():
        loss, _ = loss_fn(draft, toks, feats, valid, cfg)
        expect, wrong = _by_hand(draft, toks, feats, valid, 3, 0.8, beta)
    assert 0 < int(wrong[valid].sum()) < int(valid.sum())   # both kinds of chain start are in the batch
    torch.testing.assert_close(loss, torch.as_tensor(expect, dtype=loss.dtype), rtol=1e-4, atol=1e-4)


def test_the_weight_changes_the_loss(setup):
    draft, toks, feats, valid = setup
    with torch.no_grad():
        plain = loss_fn(draft, toks, feats, valid, TrainConfig(depth=3))[0]
        weighted = loss_fn(draft, toks, feats, valid, TrainConfig(depth=3, correction_weight=1.0))[0]
    assert not torch.isclose(plain, weighted)
