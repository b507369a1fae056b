"""Rotary position embeddings (rotate-half convention, as in Hugging Face checkpoints), with llama3 and linear
frequency scaling. cos/sin come from a table indexed by absolute position."""
from __future__ import annotations

import math

import torch

from ssd.config import ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind != "llama3":
        return inv
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryTable:
    """cos/sin for positions 0..max_positions-1, shape [P, head_dim]."""

    def __init__(self, cfg: ModelConfig, max_positions: int, device=None, dtype=torch.float32):
        inv = inverse_frequencies(cfg).to(device)
        pos = torch.arange(max_positions, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(dtype)
        self.sin = emb.sin().to(dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos/sin: [B, T, D]."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
