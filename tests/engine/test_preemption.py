"""A KV budget too small for every request at once: sequences are preempted and recomputed, every request
finishes, and every output is the one it gets running alone.

The model's greedy outputs vary with the context (`varied_llama`), so a token computed from lost or wrong KV shows;
the speculative engine's draft is the target with noise on its weights, so tokens are both accepted and rejected
(a verifier that accepted everything would diverge from AR)."""
import pytest
import torch

from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.sampling import SamplingParams
from tests.engine.perturbed import perturbed, varied_llama

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)


def _prompts(n=8):
    g = torch.Generator().manual_seed(21)
    return [torch.randint(3, 128, (int(torch.randint(4, 30, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return varied_llama(tmp_path_factory.mktemp("varied-llama"))


@pytest.fixture(scope="module")
def alone(model):
    outputs = [AREngine(model, max_batch=1, max_len=64).generate([p], PARAMS)[0].output for p in _prompts()]
    assert sum(len(set(o)) > 3 for o in outputs) >= len(outputs) // 2  # the outputs depend on what came before
    return outputs


def test_eight_requests_in_a_small_kv_budget_all_finish_as_if_alone(model, alone):
    engine = AREngine(model, max_batch=8, max_len=64, kv_tokens=96, block_size=8)
    seqs = engine.generate(_prompts(), PARAMS)
    assert [s.output for s in seqs] == alone
    assert engine.preemptions > 0
    assert engine.cache.blocks.num_free == engine.cache.blocks.num_blocks   # every block came back


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_speculative_engine_with_small_target_and_draft_kv_equals_alone(model, alone, mode):
    engine = SpeculativeEngine(model, perturbed(model, 0.1), SpecConfig(mode=mode, k=3), max_batch=8, max_len=64,
                               kv_tokens=96, block_size=8)
    outputs = [s.output for s in engine.generate(_prompts(), PARAMS)]
    assert engine.target.preemptions > 0 and engine.draft.evictions > 0
    assert 0.2 < engine.stats.acceptance_rate < 0.95   # speculation both accepted and rejected tokens
    assert outputs == alone
