"""A draft that is the target with noise on its weights: it agrees with the target often, but not always, so
speculation is demonstrably on (tokens accepted) and demonstrably imperfect (tokens rejected)."""
import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ssd.models.decoder import Decoder
from ssd.models.loader import load_model


def perturbed(model: Decoder, noise: float, seed: int = 0) -> Decoder:
    """A copy of `model` with N(0, (noise * std(w))^2) added to every weight matrix w (norms untouched)."""
    g = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * noise * p.std())
    return draft


def varied_llama(folder) -> Decoder:
    """A random tiny Llama (vocab 128) whose greedy outputs vary with the context. The suite's `tiny_llama_dir`
    (initializer_range 0.02) emits one token over and over, whatever came before, so a test on it cannot see a
    token computed from the wrong KV."""
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, initializer_range=0.1, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return load_model(folder)
