"""Our decoder's logits equal transformers' on random-initialised Llama and Qwen3 configs (fp32), for one prefill
and for a greedy decode of many steps through our KV cache."""
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


DECODE_STEPS = 40
DECODE_CASES = {  # initializer_range 0.2: outputs that vary, logits spread enough to avoid near-ties
    "llama-gqa": (LlamaForCausalLM, LlamaConfig(**COMMON, num_key_value_heads=2, initializer_range=0.2)),
    "qwen3-gqa": (Qwen3ForCausalLM, Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=24, initializer_range=0.2,
                                                tie_word_embeddings=True)),
}


@pytest.mark.parametrize("name", sorted(DECODE_CASES))
def test_greedy_decode_with_kv_cache_matches_transformers_generate(tmp_path, name):
    """Prefill, then 40 one-token steps reading our KV cache: the tokens equal transformers' greedy `generate`
    and every step's logits match its scores."""
    cls, cfg = DECODE_CASES[name]
    torch.manual_seed(0)
    ref = cls(cfg).float().eval()
    ref.save_pretrained(tmp_path / name)
    ours = load_model(tmp_path / name)
    prompt = torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(2))
    ref.generation_config.eos_token_id = None   # all 40 steps, with no logits processor touching EOS
    with torch.no_grad():
        out = ref.generate(prompt, max_new_tokens=DECODE_STEPS, do_sample=False, output_logits=True,
                           return_dict_in_generate=True, pad_token_id=0)
    expected_tokens = out.sequences[0, prompt.shape[1]:].tolist()
    expected_logits = torch.cat(out.logits)
    cache = ours.make_cache(num_slots=1, max_len=64)
    tokens, logits = [], []
    with torch.inference_mode():
        h = ours(ForwardBatch.ragged(prompt.tolist(), [0], [0]), cache)[:, -1]
        for step in range(DECODE_STEPS):
            logits.append(ours.logits(h))
            tokens.append(int(logits[-1].argmax(-1)))
            if step + 1 < DECODE_STEPS:
                h = ours(ForwardBatch.ragged([[tokens[-1]]], [prompt.shape[1] + step], [0]), cache)[:, -1]
    assert tokens == expected_tokens
    assert len(set(tokens)) > 5   # the outputs depend on the context: a wrong KV read would show
    got = torch.cat(logits)
    tol = 1e-4 * expected_logits.abs().max()
    assert (got - expected_logits).abs().max() <= tol
    top2 = expected_logits.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 2 * tol   # within tol no step's argmax can flip: well posed
