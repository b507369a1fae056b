"""gpu_check's models and inputs: the configs (two small ones, one of Qwen3-8B size, tiny ones for --smoke),
random-initialised weights drawn per parameter name (so a model of fewer layers shares the others' weights, and
the target's deeper layers can be scaled), copies to another device or dtype, prompts, and a device sync."""
from __future__ import annotations

import zlib

import torch

from ssd.config import ModelConfig
from ssd.models.decoder import Decoder


SEED = 1234


def qwen3_8b(layers: int = 36) -> ModelConfig:
    return ModelConfig("qwen3", 151936, 4096, 12288, layers, 32, 8, 128, rms_norm_eps=1e-6, rope_theta=1e6,
                       max_position_embeddings=4096, name="qwen3-8b-size")


CONFIGS = {
    "qwen3-small": ModelConfig("qwen3", 4096, 512, 1536, 4, 8, 4, 64, rope_theta=1e6, max_position_embeddings=2048,
                               name="qwen3-small"),
    "llama-small": ModelConfig("llama", 4096, 512, 1408, 4, 8, 2, 64, rms_norm_eps=1e-5, rope_theta=5e5,
                               max_position_embeddings=2048, name="llama-small"),
}
SMOKE = {
    "qwen3-tiny": ModelConfig("qwen3", 256, 64, 128, 2, 4, 2, 16, max_position_embeddings=512, name="qwen3-tiny"),
    "llama-tiny": ModelConfig("llama", 256, 64, 128, 2, 4, 2, 16, max_position_embeddings=512, name="llama-tiny"),
}


def random_model(cfg: ModelConfig, device, dtype, deep_scale: float = 1.0, keep: int = 2) -> Decoder:
    """Weights drawn per parameter name (so a model with fewer layers shares the others' weights exactly).
    `deep_scale` scales what layers `keep`.. add to the residual stream (their o and down projections): a
    model of the first `keep` layers then agrees with this one more often the smaller it is (0: always)."""
    with torch.device("meta"):
        model = Decoder(cfg)
    model = model.to_empty(device=device)
    for name, p in model.named_parameters():
        g = torch.Generator(device=device).manual_seed(SEED + zlib.crc32(name.encode()))
        w = torch.randn(p.shape, generator=g, device=device, dtype=torch.float32)
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * w
        else:
            w = w * (0.02 if "embed" not in name else 1.0)
        if deep_scale != 1.0 and name.startswith("layers.") and int(name.split(".")[1]) >= keep \
                and name.endswith(("o_weight", "down_weight")):
            w = w * deep_scale
        p.data = w.to(dtype)
        del w
    model._rope = None
    return model.eval().requires_grad_(False)


def copy_model(src: Decoder, device, dtype) -> Decoder:
    with torch.device("meta"):
        model = Decoder(src.cfg)
    model = model.to_empty(device=device)
    for (name, p), q in zip(model.named_parameters(), src.parameters()):
        p.data = q.detach().to(device=device, dtype=dtype)
    model._rope = None
    return model.eval().requires_grad_(False)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def prompts_for(cfg: ModelConfig, batch: int, length: int, seed: int = 7) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, cfg.vocab_size, (length + 3 * b,), generator=g).tolist() for b in range(batch)]
