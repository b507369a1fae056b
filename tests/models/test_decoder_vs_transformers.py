"""Our decoder's logits equal transformers' on random-initialised Llama and Qwen3 configs (fp32)."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=3,
              num_attention_heads=4, max_position_embeddings=256)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 500000.0}

CASES = {
    "llama-gqa-tied": (LlamaForCausalLM, LlamaConfig(**COMMON, num_key_value_heads=2, tie_word_embeddings=True)),
    "llama-mha-untied": (LlamaForCausalLM, LlamaConfig(**COMMON, num_key_value_heads=4, tie_word_embeddings=False)),
    "llama-llama3-rope-bias": (LlamaForCausalLM, LlamaConfig(**COMMON, num_key_value_heads=1, attention_bias=True,
                                                            mlp_bias=True, rope_parameters=LLAMA3_ROPE)),
    "qwen3-gqa-tied": (Qwen3ForCausalLM, Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=24,
                                                      tie_word_embeddings=True)),
    "qwen3-untied": (Qwen3ForCausalLM, Qwen3Config(**COMMON, num_key_value_heads=2, tie_word_embeddings=False)),
}


def make_folder(tmp_path, name):
    cls, cfg = CASES[name]
    torch.manual_seed(0)
    ref = cls(cfg).float().eval()
    with torch.no_grad():  # non-trivial norm weights, so a mis-loaded norm is caught
        for n, p in ref.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.2)
    ref.save_pretrained(tmp_path / name)
    return ref, tmp_path / name


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_transformers(tmp_path, name):
    ref, folder = make_folder(tmp_path, name)
    ours = load_model(folder)
    ids = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(ids).logits
    cache = ours.make_cache(num_slots=2, max_len=64)
    batch = ForwardBatch.ragged(ids.tolist(), [0, 0], [0, 1])
    with torch.inference_mode():
        got = ours.logits(ours(batch, cache))
    tol = 1e-4 * expected.abs().max()
    assert (got - expected).abs().max() <= tol
