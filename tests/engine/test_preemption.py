"""A KV budget too small for every request at once: sequences are preempted and recomputed, every request
finishes, and every output is the one it gets running alone."""
import torch

from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams

PARAMS = SamplingParams(max_tokens=40, ignore_eos=True)


def _prompts(n=16):
    g = torch.Generator().manual_seed(21)
    return [torch.randint(3, 128, (int(torch.randint(4, 30, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_sixteen_requests_in_a_small_kv_budget_all_finish_as_if_alone(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    prompts = _prompts()
    alone = [AREngine(model, max_batch=1, max_len=128).generate([p], PARAMS)[0].output for p in prompts]
    engine = AREngine(model, max_batch=16, max_len=128, kv_tokens=256, block_size=8)
    seqs = engine.generate(prompts, PARAMS)
    assert [s.output for s in seqs] == alone
    assert engine.preemptions > 0
    assert engine.cache.blocks.num_free == engine.cache.blocks.num_blocks   # every block came back


def test_speculative_engine_with_small_target_and_draft_kv_equals_alone(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    prompts = _prompts()
    alone = [AREngine(model, max_batch=1, max_len=128).generate([p], PARAMS)[0].output for p in prompts]
    engine = SpeculativeEngine(model, model, SpecConfig(mode="ssd", k=3), max_batch=16, max_len=128,
                               kv_tokens=256, block_size=8)
    assert [s.output for s in engine.generate(prompts, PARAMS)] == alone
    assert engine.target.preemptions > 0 and engine.draft.evictions > 0
