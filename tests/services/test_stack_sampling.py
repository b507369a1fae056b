"""Sampling through the real stack follows the target's own distribution: router, target and the distilled
feature draft as separate processes, sd and ssd rounds with K fixed at 3 (the shared stack).

Hundreds of seeded requests of one prompt at temperature 1, five tokens each. The first token is sampled by
prefill; every later one by verification (an accepted draft, a correction from the residual, a bonus token; in ssd
after the first round also from speculations taken from the cache). For each position i = 2..5 the requests are
grouped by their earlier tokens t_1..t_i-1, and within a group the counts of t_i are compared with the target's
exact conditional p(t_i | prompt, t_1..t_i-1), computed in process: a Pearson chi-square per group (tokens expected
at least 5 times are cells of their own, the rest one cell), summed over groups and positions. Given the group
sizes these are independent multinomials under exact sampling, so the sum is chi-square with the summed degrees
of freedom. A verifier that accepts every draft fails it at once (and fails the rejection check).
"""
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from scipy.stats import chi2

from ssd.client import Client
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams, probs_from_logits

N, MAX_TOKENS, TEMPERATURE = 256, 5, 1.0
PROMPT = 2   # of chat_prompts: the draft proposes its answer's opening well, with choices left to make
SEED_BASE = {"sd": 10_000, "ssd": 20_000}   # distinct seeds per mode (one seed gives one output in either mode)
ALPHA = 1e-3


@pytest.fixture(scope="module")
def target(default_models):
    return load_model(default_models["target"])


def sample(stack, prompt: list[int], mode: str) -> list:
    """N seeded requests of `prompt`, 16 at a time (the stack's batch)."""
    with Client(stack.grpc_address, timeout=600) as client, ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda i: client.generate(prompt, max_tokens=MAX_TOKENS, ignore_eos=True, mode=mode,
                                                       temperature=TEMPERATURE, seed=SEED_BASE[mode] + i),
                             range(N)))


def conditionals(target, prompt: list[int], outputs: list[tuple]) -> dict[tuple, torch.Tensor]:
    """For each distinct output t_1..t_T: p(t_i | prompt, t_1..t_i-1) for i = 2..T, as rows [T-1, V]."""
    unique, n, out = sorted(set(outputs)), len(prompt), {}
    params = SamplingParams(temperature=TEMPERATURE)
    for start in range(0, len(unique), 16):
        chunk = unique[start:start + 16]
        seqs = [prompt + list(o) for o in chunk]
        cache = target.make_cache(len(seqs), len(seqs[0]))
        with torch.inference_mode():
            hidden = target(ForwardBatch.ragged(seqs, [0] * len(seqs), list(range(len(seqs)))), cache)
            logits = target.logits(hidden[:, n:n + MAX_TOKENS - 1])   # the positions of t_1..t_T-1
        vocab = logits.shape[-1]
        probs = probs_from_logits(logits.reshape(-1, vocab), params).reshape(len(seqs), -1, vocab)
        out.update(zip(chunk, probs.double()))
    return out


def group_cells(tokens: list[int], dist: torch.Tensor) -> tuple[list[int], list[float]]:
    """Observed and expected counts of one group: a cell per token expected at least 5 times, one for the rest
    (merged into the smallest cell when it is expected fewer than 5 times)."""
    n = len(tokens)
    assert all(dist[t] > 0 for t in tokens), "a token the target gives probability 0 was sampled"
    big = torch.nonzero(n * dist >= 5).flatten().tolist()
    if not big:
        return [], []
    observed = [tokens.count(t) for t in big]
    expected = [n * float(dist[t]) for t in big]
    rest_observed, rest_expected = n - sum(observed), n - sum(expected)
    if rest_expected >= 5:
        observed.append(rest_observed)
        expected.append(rest_expected)
    else:
        smallest = expected.index(min(expected))
        observed[smallest] += rest_observed
        expected[smallest] += rest_expected
    return observed, expected


def conditional_chi_square_p(target, prompt: list[int], outputs: list[tuple]) -> float:
    rows = conditionals(target, prompt, outputs)
    stat, dof = 0.0, 0
    for pos in range(1, MAX_TOKENS):
        groups: dict[tuple, list[tuple]] = defaultdict(list)
        for o in outputs:
            groups[o[:pos]].append(o)
        for members in groups.values():
            observed, expected = group_cells([o[pos] for o in members], rows[members[0]][pos - 1])
            if len(observed) > 1:
                stat += sum((o - e) ** 2 / e for o, e in zip(observed, expected))
                dof += len(observed) - 1
    assert dof >= 5, "too few well-populated cells for the test to say anything"
    return float(chi2.sf(stat, dof))


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_sampled_tokens_through_the_stack_follow_the_targets_distribution(stack, chat_prompts, target, mode,
                                                                          assert_speculated):
    prompt = chat_prompts[PROMPT]
    results = sample(stack, prompt, mode)
    outputs = [tuple(r.token_ids) for r in results]
    assert all(len(o) == MAX_TOKENS for o in outputs)
    assert_speculated(results, mode)
    # and rejections too (some position accepted less than always): corrections from the residual were drawn
    assert any(a < 1.0 for r in results for a in r.stats.acceptance_per_position)
    p = conditional_chi_square_p(target, prompt, outputs)
    assert p > ALPHA, f"{mode}: the sampled tokens do not follow the target's distribution (chi-square p = {p:.2g})"
