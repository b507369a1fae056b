"""Qwen3 (q/k norms, explicit head_dim) through SD and SSD on the CPU: greedy outputs equal the AR engine's, with a
draft that is the target with noise on its weights, so speculation both accepts and rejects tokens."""
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from tests.engine.perturbed import perturbed

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=256,
                      tie_word_embeddings=True, initializer_range=0.2, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    Qwen3ForCausalLM(cfg).save_pretrained(folder)
    target = load_model(folder)
    assert target.cfg.qk_norm
    return target, perturbed(target, 0.1)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in (4, 9, 17)]


@pytest.fixture(scope="module")
def reference(pair, prompts):
    outputs = [s.output for s in AREngine(pair[0], max_batch=3, max_len=64).generate(prompts, PARAMS)]
    assert all(len(set(o)) > 3 for o in outputs)   # outputs that depend on the context
    return outputs


@pytest.mark.parametrize("mode,backup", [("sd", "jit"), ("ssd", "jit")])
def test_qwen3_greedy_speculation_equals_ar_with_tokens_accepted_and_rejected(pair, prompts, reference, mode,
                                                                            backup):
    engine = SpeculativeEngine(*pair, SpecConfig(mode=mode, k=3, backup=backup), max_batch=3, max_len=64)
    assert [s.output for s in engine.generate(prompts, PARAMS)] == reference
    stats = engine.stats
    accepted = sum(stats.accepted)
    assert accepted > 0 and stats.reached - accepted > 0   # drafted tokens were accepted and others rejected
