"""On the real SmolLM2-135M-Instruct weights: logits and greedy generation equal transformers' (fp32)."""
import pytest
import torch
from transformers import LlamaForCausalLM

from ssd.engine.ar import AREngine
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from ssd.tokenizer import Tokenizer

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis in two sentences.",
    "What is 17 times 23?",
    "Give me three ideas for a birthday party.",
    "Translate 'thank you very much' into German.",
    "Why do cats purr?",
    "Write a SQL query that counts the rows of a table named users.",
    "Summarise the plot of Romeo and Juliet.",
    "How do I make a cup of tea?",
]


@pytest.fixture(scope="module")
def smollm2(default_models):
    folder = default_models["target"]
    tok = Tokenizer.from_folder(folder)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
    ref = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return load_model(folder), ref, prompts


def test_logits_match_transformers_on_smollm2(smollm2):
    ours, ref, prompts = smollm2
    ids = prompts[1]
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[0]
        cache = ours.make_cache(1, 128)
        got = ours.logits(ours(ForwardBatch.ragged([ids], [0], [0]), cache))[0]
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


def test_greedy_generation_equals_transformers(smollm2):
    ours, ref, prompts = smollm2
    params = SamplingParams(max_tokens=64)  # both stop at EOS (id 2) or after 64 tokens
    got = [s.output for s in AREngine(ours, max_batch=len(prompts)).generate(prompts, params)]
    with torch.inference_mode():
        for ids, out in zip(prompts, got):
            expected = ref.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False, eos_token_id=2,
                                    pad_token_id=2)[0, len(ids):].tolist()
            assert out == expected
