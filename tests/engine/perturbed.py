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


def feature_draft(target: Decoder, layers: int = 1):
    """A feature-reading draft made from `target` (`init_from_target` over its first 128 ids) with noise on its
    feature projection: it reads the target's features and agrees with the target often, not always."""
    from ssd.distill.train import init_from_target

    torch.manual_seed(2)
    draft = init_from_target(target, torch.arange(0, 128), layers=layers, feature_rms=3.0)
    with torch.no_grad():
        draft.fc_weight.add_(torch.randn_like(draft.fc_weight) * 0.3)
    return draft.eval().requires_grad_(False)


def target_features(target: Decoder, tokens: list[int]):
    """The target's features (`FeatureBlock`) of `tokens`, from a prefill."""
    from ssd.engine.target import TargetWorker
    from ssd.sampling import SamplingParams

    t = TargetWorker(target, 2, 256)
    t.prefill([(0, tokens, SamplingParams())], features=True)
    return t.last_features[0]
