"""Prefix caching: a prompt that shares a long system prompt with an earlier one computes only its new tokens,
and every output equals the output without the cache."""
import torch

from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.engine.target import TargetWorker
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams

PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


def _prompts(n_system=100, tails=(7, 11)):
    g = torch.Generator().manual_seed(9)
    system = torch.randint(3, 128, (n_system,), generator=g).tolist()
    return [system + torch.randint(3, 128, (t,), generator=g).tolist() for t in tails]


def test_second_request_with_same_system_prompt_prefills_only_new_tokens(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
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


def test_target_worker_prefix_cache_counts_and_matches(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    first, second = _prompts()
    cached, plain = TargetWorker(model, 4, 256, block_size=16), TargetWorker(model, 4, 256, prefix_caching=False)
    p = SamplingParams()
    assert cached.prefill([(1, first, p)]) == plain.prefill([(1, first, p)])
    assert cached.prefill([(2, second, p)]) == plain.prefill([(2, second, p)])
    assert cached.prefill_tokens == len(first) + len(second) - 96
    assert plain.prefill_tokens == len(first) + len(second)
    assert 0 < cached.prefix_stats.hit_rate < 1


def test_speculative_engine_with_shared_system_prompts_equals_ar(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    prompts = _prompts(tails=(3, 5, 8, 13))
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    ref = [s.output for s in AREngine(model, max_batch=1, prefix_caching=False).generate(prompts[:1], params)]
    ref += [AREngine(model, max_batch=1, prefix_caching=False).generate([p], params)[0].output for p in prompts[1:]]
    engine = SpeculativeEngine(model, model, SpecConfig(mode="ssd", k=3), max_batch=4)
    got = []
    for p in prompts:  # one after another, so later ones hit the blocks earlier ones registered
        got.append(engine.generate([p], params)[0].output)
    assert got == ref
    assert engine.target.prefix_stats.hit_tokens >= 3 * 96
    assert engine.draft.prefix_stats.hit_tokens >= 3 * 96
