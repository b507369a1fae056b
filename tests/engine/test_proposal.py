import pytest
import torch

from ssd.engine.proposal import densify, proposal_probs, saguaro_reshape, sparse_support


def logits(n=4, v=10, seed=0):
    return torch.randn(n, v, generator=torch.Generator().manual_seed(seed))


def test_temperature_zero_is_one_hot_on_the_lowest_argmax():
    lg = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 1.0, 1.0]])
    q = proposal_probs(lg, 0.0, top_k=2, saguaro_c=0.5, saguaro_f=1)
    assert q.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_positive_temperature_is_the_tempered_softmax():
    lg = logits()
    assert torch.allclose(proposal_probs(lg, 0.7), torch.softmax(lg / 0.7, -1), atol=1e-6)


def test_top_k_keeps_k_tokens_renormalised():
    lg = logits()
    q = proposal_probs(lg, 1.0, top_k=3)
    assert ((q > 0).sum(-1) == 3).all()
    assert torch.allclose(q.sum(-1), torch.ones(4))
    full = torch.softmax(lg, -1)
    top = full.topk(3, -1).indices
    assert torch.allclose(q.gather(-1, top), full.gather(-1, top) / full.gather(-1, top).sum(-1, keepdim=True))


def test_saguaro_scales_the_top_f_plus_one_by_c_relative_to_the_rest():
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    q = saguaro_reshape(p, 0.5, 1)
    assert torch.allclose(q.sum(), torch.tensor(1.0))
    assert float(q[0, 0] / q[0, 2]) == pytest.approx(0.5 * 0.4 / 0.2)
    assert float(q[0, 1] / q[0, 3]) == pytest.approx(0.5 * 0.3 / 0.1)
    assert float(q[0, 2] / q[0, 3]) == pytest.approx(2.0)


def test_saguaro_is_identity_at_c_one_and_on_supports_within_f_plus_one():
    p = proposal_probs(logits(), 1.0, top_k=2)
    assert torch.equal(saguaro_reshape(p, 1.0, 3), p)
    assert torch.allclose(saguaro_reshape(p, 0.3, 1), p)
    assert torch.allclose(proposal_probs(logits(), 1.0, top_k=2, saguaro_c=0.3, saguaro_f=1), p)
    with pytest.raises(ValueError):
        saguaro_reshape(p, 0.0, 1)


def test_saguaro_flattening_makes_the_correction_token_land_in_the_forks_more_often():
    def fork_hit_given_rejection(p, q, rank, F):
        hit = rejected = 0.0
        for x in range(p.numel()):
            rej = float(q[x] - torch.minimum(p[x], q[x]))
            if rej <= 0:
                continue
            residual = (p - q).clamp_min(0)
            forks = [t for t in rank[:F + 1].tolist() if t != x][:F]
            hit += rej * float(residual[forks].sum() / residual.sum())
            rejected += rej
        return hit / rejected

    g = torch.Generator().manual_seed(0)
    plain = flat = 0.0
    for _ in range(60):
        base = 2 * torch.randn(12, generator=g, dtype=torch.float64)
        p = torch.softmax(base + torch.randn(12, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(base, -1)
        rank = q.argsort(descending=True)
        plain += fork_hit_given_rejection(p, q, rank, 2)
        flat += fork_hit_given_rejection(p, saguaro_reshape(q[None], 0.5, 2)[0], rank, 2)
    assert flat > plain


def test_sparse_support_round_trips_and_is_as_small_as_top_k():
    q = proposal_probs(logits(v=50), 0.8, top_k=5, saguaro_c=0.5, saguaro_f=2)
    support = sparse_support(q)
    assert all(ids.numel() == 5 and bool((ids[1:] > ids[:-1]).all()) for ids, _ in support)
    assert torch.equal(densify(support, 50), q)
