"""Sampling through SD and SSD follows the target's own distribution exactly (chi-square on a tiny model).

A vocabulary of 6 lets us compute the AR distribution of 4 generated tokens exactly, and compare the empirical
distribution of 12,000 seeded generations against it. The 4th token often comes from a speculation taken from
the cache, so the cached proposals are checked too. A verifier fed the wrong q must fail.
"""
import itertools

import pytest
import torch
from scipy.stats import chi2
from transformers import LlamaConfig, LlamaForCausalLM

from ssd.engine.draft import DraftWorker
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams, probs_from_logits
from ssd.engine.proposal import proposal_probs, sparse_support

V, PROMPT, N, T = 6, [1, 2, 3], 12_000, 4
PARAMS = dict(temperature=1.0, max_tokens=T, ignore_eos=True)


def tiny(folder, seed):
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, initializer_range=0.1, bos_token_id=0, eos_token_id=5)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return load_model(folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny(tmp_path_factory.mktemp("t"), 0), tiny(tmp_path_factory.mktemp("d"), 1)


def exact_ar(target, params) -> dict[tuple, float]:
    """P(t1..tT) for every T-token output, from the target's own distributions."""
    prefixes = list(itertools.product(range(V), repeat=T - 1))
    seqs = [PROMPT + list(p) for p in prefixes]
    cache = target.make_cache(len(seqs), 16)
    with torch.inference_mode():
        logits = target.logits(target(ForwardBatch.ragged(seqs, [0] * len(seqs), list(range(len(seqs)))), cache))
    n = len(PROMPT)
    probs = probs_from_logits(logits[:, n - 1:].reshape(-1, V), params).reshape(len(seqs), T, V)
    out = {}
    for i, prefix in enumerate(prefixes):
        for last in range(V):
            toks = (*prefix, last)
            out[toks] = float(torch.prod(probs[i, torch.arange(T), torch.tensor(toks)]))
    return out


def chi_square_p(samples: list[tuple], expected: dict[tuple, float]) -> float:
    counts: dict[tuple, int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    assert set(counts) <= {k for k, p in expected.items() if p > 0}, "a zero-probability output was produced"
    stat, cells, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for key, p in expected.items():
        e = p * len(samples)
        if e < 5:
            pooled_obs, pooled_exp = pooled_obs + counts.get(key, 0), pooled_exp + e
            continue
        stat += (counts.get(key, 0) - e) ** 2 / e
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    return float(chi2.sf(stat, cells - 1))


def run(engine, params, n: int = N) -> list[tuple]:
    """n seeded generations; the seed starts a stream (`seed_stream`: rejection sampling, what these cases test)
    unless params say otherwise."""
    seqs = engine.generate([PROMPT] * n, [SamplingParams(seed=i, **{"seed_stream": True, **params}) for i in range(n)])
    return [tuple(s.output) for s in seqs]


CASES = {
    "sd-dense": SpecConfig(mode="sd", k=2, draft_top_k=0),
    "ssd-dense": SpecConfig(mode="ssd", k=2, budget=6, draft_top_k=0),
    "ssd-topk-sparse": SpecConfig(mode="ssd", k=2, budget=6, draft_top_k=2),
    "ssd-saguaro": SpecConfig(mode="ssd", k=2, budget=6, draft_top_k=0, saguaro_c=0.3),
    "ssd-ngram-backup": SpecConfig(mode="ssd", k=2, budget=4, backup="ngram", draft_top_k=3),
    # the router's own policies: K chosen per round from measured costs (probe and explore rounds at other K), the
    # fan-out from measured acceptance
    "ssd-adaptive": SpecConfig(mode="ssd", k=2, budget=6, draft_top_k=0, adaptive=True, adaptive_fanout=True),
    # the draft stops its chains (JIT and cache entries) where its own confidence runs out: how many tokens a round
    # offers then depends on q alone, never on the target
    "ssd-confidence-stop": SpecConfig(mode="ssd", k=3, budget=8, draft_top_k=0, min_confidence=0.3),
}


@pytest.mark.parametrize("name", sorted(CASES))   # every case runs in CI (~15-45 s each on 2 cores): they guard exactness
def test_sampled_outputs_follow_target_distribution(models, name):
    target, draft = models
    engine = SpeculativeEngine(target, draft, CASES[name], max_batch=512, max_len=32)
    samples = run(engine, PARAMS)
    assert chi_square_p(samples, exact_ar(target, SamplingParams(**PARAMS))) > 1e-3
    stats = engine.stats
    assert stats.rounds > 0 and 0 < stats.acceptance_rate < 1  # the rejection path was exercised
    if CASES[name].adaptive:   # the policy ran and speculated (how much is its choice)
        assert engine.core.planner.adaptive and stats.cache.get("hit", 0) > 0
    elif CASES[name].mode == "ssd":  # and the cache-hit path
        assert stats.cache.get("hit", 0) > 0.2 * (sum(stats.cache.values()) - stats.cache["forced"])
    if CASES[name].min_confidence:   # and chains were stopped short
        assert engine.draft.confidence_stops > 0 and sum(stats.offered) < CASES[name].k * stats.offered[0]


PENALISED = dict(PARAMS, presence_penalty=0.8, frequency_penalty=0.4, repetition_penalty=1.5, logit_bias={4: 1.0})
N_PENALISED = 6_000


def exact_penalised_ar(target, params: SamplingParams) -> dict[tuple, float]:
    """P(t1..tT) with `params`' penalties applied by hand to each step's logits (the rules in ssd.params: the bias,
    then Hugging Face's repetition penalty over prompt and output, then frequency and presence over the output)."""
    prefixes = list(itertools.product(range(V), repeat=T - 1))
    seqs = [PROMPT + list(p) for p in prefixes]
    cache = target.make_cache(len(seqs), 16)
    with torch.inference_mode():
        logits = target.logits(target(ForwardBatch.ragged(seqs, [0] * len(seqs), list(range(len(seqs)))), cache))
    n, out = len(PROMPT), {}
    for i, prefix in enumerate(prefixes):
        rows = []
        for step in range(T):
            x, output = logits[i, n - 1 + step].double().clone(), list(prefix[:step])
            for tok, bias in params.logit_bias:
                x[tok] += bias
            for tok in set(PROMPT) | set(output):
                x[tok] = x[tok] / params.repetition_penalty if x[tok] > 0 else x[tok] * params.repetition_penalty
            for tok in set(output):
                x[tok] -= params.frequency_penalty * output.count(tok) + params.presence_penalty
            rows.append(torch.softmax(x / params.temperature, dim=-1))
        for last in range(V):
            toks = (*prefix, last)
            out[toks] = float(torch.prod(torch.stack([rows[s][t] for s, t in enumerate(toks)])))
    return out


def test_penalised_sampling_with_speculation_follows_the_penalised_target(models):
    """The rejection sampler verifies against the penalised target distribution at every drafted position (the
    draft's q stays unpenalised: any q keeps the output exact). A smaller N than the cases above: one run."""
    target, draft = models
    engine = SpeculativeEngine(target, draft, SpecConfig(mode="ssd", k=2, budget=6, draft_top_k=0),
                               max_batch=512, max_len=32)
    samples = run(engine, PENALISED, N_PENALISED)
    expected = exact_penalised_ar(target, SamplingParams(**PENALISED))
    assert chi_square_p(samples, expected) > 1e-3
    assert chi_square_p(samples, exact_ar(target, SamplingParams(**PARAMS))) < 1e-6   # the penalties did apply
    assert engine.stats.rounds > 0 and 0 < engine.stats.acceptance_rate < 1


def test_top_p_target_with_speculation(models):
    target, draft = models
    params = dict(PARAMS, top_p=0.8, min_p=0.05)
    engine = SpeculativeEngine(target, draft, SpecConfig(mode="ssd", k=2, budget=6, draft_top_k=0),
                               max_batch=512, max_len=32)
    assert chi_square_p(run(engine, params), exact_ar(target, SamplingParams(**params))) > 1e-3


N_LOGPROBS = 6_000


def test_sampling_with_logprobs_requested_follows_the_target(models):
    """Asking for logprobs changes nothing of what is sampled (the same chi-square against the exact target), and
    each returned logprob is the target's log-softmax at that position given the tokens before it."""
    target, draft = models
    engine = SpeculativeEngine(target, draft, SpecConfig(mode="ssd", k=2, budget=6, draft_top_k=0),
                               max_batch=512, max_len=32)
    seqs = engine.generate([PROMPT] * N_LOGPROBS, [SamplingParams(seed=i, seed_stream=True, logprobs=2, **PARAMS)
                                                   for i in range(N_LOGPROBS)])
    assert chi_square_p([tuple(s.output) for s in seqs], exact_ar(target, SamplingParams(**PARAMS))) > 1e-3
    assert engine.stats.rounds > 0 and 0 < engine.stats.acceptance_rate < 1
    distinct = {tuple(s.output): s.logprobs for s in seqs}
    rows = [PROMPT + list(out) for out in distinct]
    with torch.inference_mode():
        logits = target.logits(target(ForwardBatch.ragged(rows, [0] * len(rows), list(range(len(rows)))),
                                      target.make_cache(len(rows), 16)))
    exact = torch.log_softmax(logits[:, len(PROMPT) - 1:-1].float(), dim=-1)
    for (out, lps), row in zip(distinct.items(), exact):
        assert [lp.token for lp in lps] == list(out)
        for i, lp in enumerate(lps):
            assert abs(lp.logprob - float(row[i, out[i]])) < 1e-4
            assert [t for t, _ in lp.top] == row[i].topk(2).indices.tolist()


N_COUPLED = 6_000


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_coupled_seeded_outputs_follow_target_distribution(models, mode):
    """A seed's default draws (`SamplingParams.coupled`): every position's token is the target's Gumbel-max pick with
    that seed's and position's noise, the draft picks with the same noise from its q (filtered as the target's),
    and verification compares tokens. Seeds 0..N-1 give independent draws of the target's distribution."""
    target, draft = models
    params = dict(PARAMS, top_k=4)
    engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=2, budget=6, draft_top_k=0),
                               max_batch=512, max_len=32)
    samples = run(engine, dict(params, seed_stream=False), N_COUPLED)
    assert chi_square_p(samples, exact_ar(target, SamplingParams(**params))) > 1e-3
    assert 0 < engine.stats.acceptance_rate < 1
    if mode == "ssd":
        assert engine.stats.cache.get("hit", 0) > 0.2 * (sum(engine.stats.cache.values()) - engine.stats.cache["forced"])


class WrongQDraft(DraftWorker):
    """Draws from the Saguaro-reshaped q but ships the q before reshaping: verification is then biased."""

    def _propose(self, hidden, seqs, positions=None, paths=None):
        logits = self.model.logits(hidden)
        p = seqs[0].params
        q = proposal_probs(logits, p.temperature, p.top_k, p.saguaro_c, p.saguaro_f)
        tokens = torch.multinomial(q, 1, generator=seqs[0].generator).squeeze(1).tolist()
        unshaped = proposal_probs(logits, p.temperature, p.top_k)
        return tokens, [(i.tolist(), v.tolist()) for i, v in sparse_support(unshaped)]


def test_wrong_proposal_fails_the_same_check(models):
    target, draft = models
    engine = SpeculativeEngine(target, draft, SpecConfig(mode="ssd", k=2, budget=6, draft_top_k=0, saguaro_c=0.2),
                               max_batch=512, max_len=32)
    engine.draft.__class__ = WrongQDraft
    assert chi_square_p(run(engine, PARAMS), exact_ar(target, SamplingParams(**PARAMS))) < 1e-6
