"""Prefix caching: a prompt that shares a long system prompt with an earlier one computes only its new tokens,
and every output equals the output without the cache. The model's outputs vary with the context (`varied_llama`), so
KV taken from the wrong blocks shows; the speculative engine's draft is the target with noise on its weights."""
import pytest
import torch

from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.engine.target import TargetWorker
from ssd.sampling import SamplingParams
from tests.engine.perturbed import perturbed, varied_llama

PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


def _prompts(n_system=100, tails=(7, 11)):
    g = torch.Generator().manual_seed(9)
    system = torch.randint(3, 128, (n_system,), generator=g).tolist()
    return [system + torch.randint(3, 128, (t,), generator=g).tolist() for t in tails]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return varied_llama(tmp_path_factory.mktemp("varied-llama"))


def test_second_request_with_same_system_prompt_prefills_only_new_tokens(model):
    first, second = _prompts()
    engine = AREngine(model, max_batch=2, block_size=16)
    out1 = engine.generate([first], PARAMS)[0].output
    before = engine.prefill_tokens
    out2 = engine.generate([second], PARAMS)[0].output
    assert before == len(first)
    assert engine.prefill_tokens - before == len(second) - 96   # 6 full blocks of the system prompt hit
    plain = AREngine(model, max_batch=2, prefix_caching=False)
    assert [out1, out2] == [s.output for s in plain.generate([first, second], PARAMS)]
    assert plain.prefill_tokens == len(first) + len(second)
    assert engine.prefix_stats.hit_tokens == 96


def test_target_worker_prefix_cache_counts_and_matches(model):
    first, second = _prompts()
    cached, plain = TargetWorker(model, 4, 256, block_size=16), TargetWorker(model, 4, 256, prefix_caching=False)
    p = SamplingParams()
    assert cached.prefill([(1, first, p)]) == plain.prefill([(1, first, p)])
    assert cached.prefill([(2, second, p)]) == plain.prefill([(2, second, p)])
    assert cached.prefill_tokens == len(first) + len(second) - 96
    assert plain.prefill_tokens == len(first) + len(second)
    assert 0 < cached.prefix_stats.hit_rate < 1


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_speculative_engine_with_shared_system_prompts_equals_ar(model, mode):
    prompts = _prompts(tails=(3, 5, 8, 13))
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    ref = [AREngine(model, max_batch=1, prefix_caching=False).generate([p], params)[0].output for p in prompts]
    assert all(len(set(r)) > 3 for r in ref)   # outputs that depend on the context
    engine = SpeculativeEngine(model, perturbed(model, 0.1), SpecConfig(mode=mode, k=3), max_batch=4)
    got = []
    for p in prompts:  # one after another, so later ones hit the blocks earlier ones registered
        got.append(engine.generate([p], params)[0].output)
    assert got == ref
    assert engine.target.prefix_stats.hit_tokens >= 3 * 96
    assert engine.draft.prefix_stats.hit_tokens >= 3 * 96
    assert 0.2 < engine.stats.acceptance_rate < 0.95   # speculation both accepted and rejected tokens
