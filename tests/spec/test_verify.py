"""Verification: greedy outcomes, and exactness of sampling verification by a chi-square test.

The exactness tests run speculative decoding on a toy language: vocabulary V, a target p(.|context) and a
draft's logits(.|context) from seeded tables indexed by the context. Every sample drafts K tokens from the
proposal q, verifies them, commits the accepted prefix and t*, and repeats until 3 tokens are generated;
the empirical distribution of those 3 tokens must match the autoregressive target distribution.
"""
import itertools

import pytest
import torch
from scipy.stats import chisquare

from ssd.spec.proposal import proposal_probs, saguaro_reshape
from ssd.spec.verify import verify_greedy, verify_greedy_batch, verify_sampling, verify_sampling_batch

V, K, GENERATED, SAMPLES = 5, 3, 3, 20_000


class ToyModels:
    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        max_len = GENERATED - 1 + K
        self.offsets = [sum(V ** i for i in range(n)) for n in range(max_len + 2)]
        rows = self.offsets[-1]
        dirichlet = -torch.rand(rows, V, generator=g, dtype=torch.float64).log()
        self.p = 0.6 * dirichlet / dirichlet.sum(-1, keepdim=True) + 0.4 / V
        self.draft_logits = (self.p.log() + 0.8 * torch.randn(rows, V, generator=g, dtype=torch.float64)).float()

    def row(self, length: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        return torch.tensor(self.offsets, dtype=torch.int64)[length] + code

    def exact(self) -> torch.Tensor:
        out = torch.empty(V ** GENERATED, dtype=torch.float64)
        for i, seq in enumerate(itertools.product(range(V), repeat=GENERATED)):
            prob, code = 1.0, 0
            for n, tok in enumerate(seq):
                prob *= float(self.p[self.offsets[n] + code, tok])
                code = code * V + tok
            out[i] = prob
        return out


def simulate(toy, draft_q, verify_q=None, sparse_k=0, ragged=False, seed=1, n=SAMPLES) -> torch.Tensor:
    """Counts of the first GENERATED tokens over n speculative-decoding runs (vectorised across runs)."""
    gen = torch.Generator().manual_seed(seed)
    verify_q = verify_q or draft_q
    out = torch.zeros(n, GENERATED, dtype=torch.int64)
    count, length, code = (torch.zeros(n, dtype=torch.int64) for _ in range(3))
    while bool((count < GENERATED).any()):
        act = torch.nonzero(count < GENERATED, as_tuple=True)[0]
        ln, cd = length[act], code[act]
        drafted, qs, ps = [], [], []
        for _ in range(K):
            rows = toy.row(ln, cd)
            ps.append(toy.p[rows])
            q = draft_q(toy.draft_logits[rows])
            x = torch.multinomial(q, 1, generator=gen).squeeze(1)
            drafted.append(x)
            qs.append(verify_q(toy.draft_logits[rows]))
            ln, cd = ln + 1, cd * V + x
        ps.append(toy.p[toy.row(ln, cd)])
        drafted, q = torch.stack(drafted, 1), torch.stack(qs, 1)
        if sparse_k:
            ids = q.topk(sparse_k, dim=-1).indices.sort(dim=-1).values
            q = (ids, q.gather(-1, ids))
        lengths = torch.randint(0, K + 1, (act.numel(),), generator=gen) if ragged else None
        j, t_star = verify_sampling_batch(drafted, torch.stack(ps, 1), q, gen, lengths)
        for s in range(K + 1):
            tok = drafted[:, s] if s < K else t_star
            tok = torch.where(j == s, t_star, tok)
            pos = count[act] + s
            ok = (s <= j) & (pos < GENERATED)
            rows = act[ok]
            out[rows, pos[ok]] = tok[ok]
            length[rows] += 1
            code[rows] = code[rows] * V + tok[ok]
        count[act] += j + 1
    index = (out * torch.tensor([V ** (GENERATED - 1 - i) for i in range(GENERATED)])).sum(1)
    return torch.bincount(index, minlength=V ** GENERATED).double()


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs / probs.sum() * counts.sum()
    small = expected < 5
    obs, exp = counts[~small], expected[~small]
    if bool(small.any()):
        obs = torch.cat([obs, counts[small].sum().reshape(1)])
        exp = torch.cat([exp, expected[small].sum().reshape(1)])
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)


@pytest.fixture(scope="module")
def toy():
    return ToyModels()


@pytest.fixture(scope="module")
def exact(toy):
    return toy.exact()


def test_sampling_is_exact_with_a_dense_proposal(toy, exact):
    counts = simulate(toy, lambda lg: proposal_probs(lg, 1.0))
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_sampling_is_exact_with_a_top_k_sparse_proposal(toy, exact):
    counts = simulate(toy, lambda lg: proposal_probs(lg, 0.9, top_k=2), sparse_k=2, seed=2)
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_sampling_is_exact_with_saguaro_reshaping(toy, exact):
    counts = simulate(toy, lambda lg: proposal_probs(lg, 0.7, saguaro_c=0.4, saguaro_f=1), seed=3)
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_sampling_is_exact_with_a_greedy_draft_and_ragged_lengths(toy, exact):
    counts = simulate(toy, lambda lg: proposal_probs(lg, 0.0), ragged=True, seed=4)
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_verifying_with_the_q_before_saguaro_reshaping_is_detected_as_inexact(toy, exact):
    counts = simulate(toy, lambda lg: proposal_probs(lg, 0.7, saguaro_c=0.4, saguaro_f=1),
                      verify_q=lambda lg: proposal_probs(lg, 0.7), seed=3)
    assert chi_square_pvalue(counts, exact) < 1e-6


def test_greedy_accepts_everything_and_takes_the_bonus():
    assert verify_greedy(torch.tensor([4, 7, 1]), torch.tensor([4, 7, 1, 9])) == (3, 9)


def test_greedy_stops_at_the_first_mismatch_with_the_target_token():
    assert verify_greedy(torch.tensor([4, 7, 1]), torch.tensor([4, 2, 1, 9])) == (1, 2)
    assert verify_greedy(torch.tensor([4, 7, 1]), torch.tensor([5, 7, 1, 9])) == (0, 5)
    assert verify_greedy(torch.tensor([], dtype=torch.long), torch.tensor([6])) == (0, 6)


def test_greedy_batch_honours_ragged_lengths():
    draft = torch.tensor([[4, 7, 1], [4, 7, 0], [3, 3, 3], [1, 2, 3]])
    argmax = torch.tensor([[4, 7, 1, 9], [4, 7, 1, 9], [3, 3, 3, 3], [1, 2, 3, 4]])
    j, t = verify_greedy_batch(draft, argmax, torch.tensor([3, 3, 1, 0]))
    assert j.tolist() == [3, 2, 1, 0] and t.tolist() == [9, 1, 3, 1]


def test_sampling_k_zero_is_a_plain_target_step():
    p = torch.tensor([[0.0, 1.0, 0.0]])
    assert verify_sampling(torch.tensor([], dtype=torch.long), p, torch.zeros(0, 3)) == (0, 1)


def test_sampling_rejects_a_token_the_proposal_could_not_have_drawn():
    p = torch.full((2, 4), 0.25)
    with pytest.raises(ValueError, match="q\\(x\\) = 0"):
        verify_sampling(torch.tensor([2]), p, torch.tensor([[0.5, 0.5, 0.0, 0.0]]))


def test_sampling_is_deterministic_and_sparse_matches_dense():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 6, generator=g), -1)
    q = torch.softmax(torch.randn(3, 6, generator=g), -1)
    q[:, 5] = 0.0
    q = q / q.sum(-1, keepdim=True)
    draft = torch.tensor([0, 3, 1])
    sparse = [(torch.arange(5), row[:5]) for row in q]
    for seed in range(50):
        dense = verify_sampling(draft, p, q, torch.Generator().manual_seed(seed))
        assert dense == verify_sampling(draft, p, q, torch.Generator().manual_seed(seed))
        assert dense == verify_sampling(draft, p, sparse, torch.Generator().manual_seed(seed))


def test_per_row_generators_make_a_row_independent_of_its_batch():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(3, K + 1, 8, generator=g), -1)
    q = torch.softmax(torch.randn(3, K, 8, generator=g), -1)
    draft = torch.multinomial(q.reshape(-1, 8), 1, generator=g).reshape(3, K)
    for seed in range(20):
        gens = [torch.Generator().manual_seed(seed + 100 * i) for i in range(3)]
        j, t = verify_sampling_batch(draft, p, q, gens)
        alone = verify_sampling(draft[1], p[1], q[1], torch.Generator().manual_seed(seed + 100))
        assert (int(j[1]), int(t[1])) == alone


def test_greedy_target_and_draft_reduce_to_greedy_verification():
    draft = torch.tensor([2, 0, 1])
    argmax = torch.tensor([2, 0, 3, 1])
    p = torch.nn.functional.one_hot(argmax, 4).float()
    q = torch.nn.functional.one_hot(draft, 4).float()
    for seed in range(10):
        assert verify_sampling(draft, p, q, torch.Generator().manual_seed(seed)) == verify_greedy(draft, argmax)


def test_saguaro_reshaped_q_differs_from_plain_q():
    probs = torch.tensor([[0.5, 0.3, 0.2]])
    assert not torch.allclose(saguaro_reshape(probs, 0.4, 0), probs)
