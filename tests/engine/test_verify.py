"""Verification: greedy outcomes, and exactness of sampling verification by a chi-square test.

The exactness tests run speculative decoding on a toy language: vocabulary V, a target p(.|context) and a
draft's logits(.|context) from seeded tables indexed by the context. Every sample drafts K tokens from the
proposal q, verifies them, commits the accepted prefix and t*, and repeats until 3 tokens are generated;
the empirical distribution of those 3 tokens must match the autoregressive target distribution.
"""
import itertools
from unittest import mock

import pytest
import torch
from scipy.stats import chisquare

import ssd.engine.verify as verify_module
from ssd.engine.proposal import proposal_probs, saguaro_reshape
from ssd.engine.verify import verify_greedy, verify_greedy_batch, verify_sampling, verify_sampling_batch

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


def simulate(toy, draft_q, verify_q=None, sparse_k=0, ragged=False, seed=1, n=SAMPLES,
             verify=verify_sampling_batch) -> torch.Tensor:
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
        j, t_star = verify(drafted, torch.stack(ps, 1), q, gen, lengths)
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


# Exact checks of one round, by enumeration, and the wrong verifiers they must reject.
#
# A round with K = 2 over a vocabulary of 4, with a target p_i and a proposal q_i at each position i (the same for
# every context, so the AR distribution is the product of the p_i). Every draft the proposal can emit is
# enumerated with its probability, and the verifier's K+1 uniforms run over a midpoint grid of N points each.
# The round's emitted tokens are completed to K+1 tokens from the target itself (what later rounds give a correct
# verifier); the result must be the AR distribution. Every threshold a correct verifier uses (p/q below 1, the
# residual's and the bonus distribution's CDF) lies on the grid, so the enumeration is exact, not a sample.

N_GRID, V_ROUND, K_ROUND = 12, 4, 2
P_ROUND = torch.tensor([[1 / 4, 1 / 4, 1 / 4, 1 / 4], [1 / 2, 1 / 4, 1 / 8, 1 / 8], [1 / 6, 1 / 3, 1 / 4, 1 / 4]],
                       dtype=torch.float64)
Q_ROUND = torch.tensor([[1 / 2, 1 / 4, 1 / 8, 1 / 8], [1 / 4, 1 / 4, 1 / 2, 0.0]], dtype=torch.float64)


def _on_grid(x: torch.Tensor) -> bool:
    return bool(torch.allclose(x * N_GRID, (x * N_GRID).round(), atol=1e-9))


def test_round_thresholds_lie_on_the_enumeration_grid():
    """Why the enumeration below is exact: a correct verifier's thresholds fall between grid midpoints."""
    p, q = P_ROUND[:K_ROUND], Q_ROUND
    ratio = p / q
    assert _on_grid(ratio[(q > 0) & (ratio < 1)])
    residual = (p - q).clamp_min(0)
    assert _on_grid((residual / residual.sum(-1, keepdim=True)).cumsum(-1))
    assert _on_grid(P_ROUND[K_ROUND].cumsum(-1))


def round_distribution(verifier, sparse=False) -> torch.Tensor:
    """P(first K+1 tokens) for one round of `verifier(draft[B, K], p[B, K+1, V], q, u[B, K+1])`, completed by AR."""
    K, V = K_ROUND, V_ROUND
    drafts = [d for d in itertools.product(range(V), repeat=K) if all(Q_ROUND[i, x] > 0 for i, x in enumerate(d))]
    grid = (torch.arange(N_GRID, dtype=torch.float64) + 0.5) / N_GRID
    u = torch.cartesian_prod(*[grid] * (K + 1))
    draft = torch.tensor(drafts).repeat_interleave(len(u), dim=0)
    u = u.repeat(len(drafts), 1)
    weight = torch.prod(Q_ROUND[torch.arange(K), draft], dim=1) / N_GRID ** (K + 1)
    B = len(draft)
    p, q = P_ROUND.expand(B, K + 1, V), Q_ROUND.expand(B, K, V)
    if sparse:  # the same q as (ids, probs), support listed in reverse order
        ids = torch.arange(V).flip(0).expand(B, K, V)
        q = (ids, q.flip(-1))
    j, t_star = verifier(draft, p, q, u)
    out = torch.zeros(V ** (K + 1), dtype=torch.float64)
    for s in range(K + 1):
        rows = j == s
        emitted = torch.cat([draft[rows, :s], t_star[rows, None]], dim=1)
        code = (emitted * torch.tensor([V ** (s - i) for i in range(s + 1)])).sum(1)
        prefix = torch.zeros(V ** (s + 1), dtype=torch.float64).index_add_(0, code, weight[rows])
        tail = torch.ones(1, dtype=torch.float64)
        for i in range(s + 1, K + 1):
            tail = torch.outer(tail, P_ROUND[i]).flatten()
        out += torch.outer(prefix, tail).flatten()
    return out


def ar_distribution() -> torch.Tensor:
    out = torch.ones(1, dtype=torch.float64)
    for row in P_ROUND:
        out = torch.outer(out, row).flatten()
    return out


def real_verifier(draft, p, q, u):
    """`verify_sampling_batch` with its uniforms supplied (the contract: K+1 float64 uniforms per row)."""
    with mock.patch.object(verify_module, "_uniforms", lambda B, n, generators, device: u):
        return verify_sampling_batch(draft, p, q)


def rule_verifier(flaw: str | None = None):
    """The verification rule written out position by position, with one deliberate `flaw` (None: none)."""
    def verify(draft, p, q, u, lengths=None):
        B, K = draft.shape
        rows = torch.arange(B)
        n = torch.full((B,), K) if lengths is None else lengths
        j = n.clone()
        for i in range(K):
            px, qx = p[rows, i, draft[:, i]], q[rows, i, draft[:, i]]
            ratio = {"accept_with_q_over_p": qx / px, "accept_ignoring_q": px}.get(flaw, px / qx)
            j = torch.where((j == n) & (i < n) & ~(u[:, i] < ratio), i, j)
        p_j, q_j = p[rows, j], q[rows, j.clamp(max=K - 1)]
        residual = p_j if flaw == "residual_is_normalized_p" else (p_j - q_j).clamp_min(0)
        bonus = p[rows, (j - 1).clamp_min(0)] if flaw == "bonus_from_position_k_minus_1" else p_j
        dist = torch.where((j < n)[:, None], residual, bonus)
        cdf = dist.cumsum(-1)
        t = torch.searchsorted(cdf, (u[:, K] * cdf[:, -1])[:, None], right=True).squeeze(1)
        return j, t.clamp(max=dist.shape[-1] - 1)
    return verify


def sampled_with(verifier):
    """`verifier` with the verify_sampling_batch signature, drawing its K+1 uniforms per row from `generator`."""
    def verify(draft, p, q, generator, lengths):
        u = torch.rand(draft.shape[0], draft.shape[1] + 1, generator=generator, dtype=torch.float64)
        return verifier(draft, p, q, u, lengths)
    return verify


FLAWS = ["residual_is_normalized_p", "bonus_from_position_k_minus_1", "accept_with_q_over_p", "accept_ignoring_q"]


@pytest.mark.parametrize("sparse", [False, True], ids=["dense-q", "sparse-q"])
def test_one_round_of_sampling_verification_gives_exactly_the_ar_distribution(sparse):
    got = round_distribution(real_verifier, sparse)
    torch.testing.assert_close(got, ar_distribution(), rtol=0, atol=1e-12)


def test_the_rule_written_out_without_a_flaw_passes_the_exact_check():
    torch.testing.assert_close(round_distribution(rule_verifier()), ar_distribution(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("flaw", FLAWS)
def test_exact_check_rejects_a_verifier_with_a_flaw(flaw):
    gap = (round_distribution(rule_verifier(flaw)) - ar_distribution()).abs().max()
    assert gap > 0.01


@pytest.mark.parametrize("flaw", FLAWS)
def test_chi_square_check_rejects_a_verifier_with_a_flaw(toy, exact, flaw):
    """The sampled multi-round check has the power to see each flaw too. Ragged lengths are needed for the bonus
    flaw: with K = 3 and 3 generated tokens a bonus token at full length K is never among the tokens counted."""
    counts = simulate(toy, lambda lg: proposal_probs(lg, 1.0), ragged=True, seed=5,
                      verify=sampled_with(rule_verifier(flaw)))
    assert chi_square_pvalue(counts, exact) < 1e-6


def test_chi_square_check_passes_the_rule_written_out_without_a_flaw(toy, exact):
    counts = simulate(toy, lambda lg: proposal_probs(lg, 1.0), ragged=True, seed=5,
                      verify=sampled_with(rule_verifier()))
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_sampling_is_exact_with_a_dense_proposal_and_ragged_lengths(toy, exact):
    """Ragged lengths put full-acceptance bonus tokens among the counted ones (see the flaw test above)."""
    counts = simulate(toy, lambda lg: proposal_probs(lg, 1.0), ragged=True, seed=6)
    assert chi_square_pvalue(counts, exact) > 1e-3


def greedy_violations(verifier, V=3, K=2) -> int:
    """Over every draft, target argmax and length: cases where the outcome is not 'accept the longest prefix that
    equals the target's argmax, then emit the target's argmax'."""
    cases = [(d, a, n) for d in itertools.product(range(V), repeat=K)
             for a in itertools.product(range(V), repeat=K + 1) for n in range(K + 1)]
    draft = torch.tensor([c[0] for c in cases])
    argmax = torch.tensor([c[1] for c in cases])
    lengths = torch.tensor([c[2] for c in cases])
    j, t = verifier(draft, argmax, lengths)
    bad = 0
    for (d, a, n), jj, tt in zip(cases, j.tolist(), t.tolist()):
        prefix_equal = list(d[:jj]) == list(a[:jj])
        maximal = jj == n or d[jj] != a[jj]
        bad += not (jj <= n and prefix_equal and maximal and tt == a[jj])
    return bad


def test_greedy_verification_is_right_for_every_small_input():
    assert greedy_violations(verify_greedy_batch) == 0


def test_greedy_check_rejects_a_verifier_that_accepts_one_token_too_many_or_too_few():
    def too_many(draft, argmax, lengths):
        j, _ = verify_greedy_batch(draft, argmax, lengths)
        j = torch.minimum(j + 1, lengths)
        return j, argmax.gather(1, j[:, None]).squeeze(1)

    def too_few(draft, argmax, lengths):
        j, _ = verify_greedy_batch(draft, argmax, lengths)
        j = (j - 1).clamp_min(0)
        return j, argmax.gather(1, j[:, None]).squeeze(1)

    def bonus_from_last_draft_position(draft, argmax, lengths):
        j, t = verify_greedy_batch(draft, argmax, lengths)
        return j, torch.where(j == draft.shape[1], argmax[:, -2], t)

    for wrong in (too_many, too_few, bonus_from_last_draft_position):
        assert greedy_violations(wrong) > 0, wrong.__name__
