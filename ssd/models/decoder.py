"""One decoder for Llama-3 and Qwen3 (target and draft alike).

It knows nothing of requests or sampling, only token ids, positions and KV-cache slots. A forward takes a
padded batch of B sequences with T tokens each (ragged rows are marked by `valid`), writes their KV at the
given columns and returns final hidden states; `logits` applies the output layer to the rows the caller picks.
Attention takes an explicit boolean mask [B, T, L] when the caller needs one (the draft's branch chains);
otherwise a query at position p sees columns 0..p of its slot.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ssd.config import ModelConfig
from ssd.models.attention import paged_attention
from ssd.models.kv_cache import DEFAULT_BLOCK_SIZE, KVCache, PagedIndex
from ssd.models.linear import linear
from ssd.models.parallel import TPGroup
from ssd.models.rope import RotaryTable, apply_rotary


@dataclass(slots=True)
class ForwardBatch:
    input_ids: torch.Tensor            # [B, T] long
    positions: torch.Tensor            # [B, T] long, rope positions
    slots: torch.Tensor                # [B] long, KV-cache slot per row
    kv_len: int                        # columns 0..kv_len-1 are attended
    valid: torch.Tensor | None = None  # [B, T] bool; padding is neither written nor used
    cols: torch.Tensor | None = None   # [B, T] long, KV column written per token (default: positions)
    attn_mask: torch.Tensor | None = None  # [B, T, kv_len] bool, True = attend
    causal: bool = False                   # the mask is plain causal by position (rows end at their last token)
    features: torch.Tensor | None = None   # [B, T, F]: for a feature-reading draft, the feature of each token's
                                           # predecessor (ssd.models.eagle)

    @classmethod
    def ragged(cls, tokens: list[list[int]], starts: list[int], slots: list[int], device=None) -> "ForwardBatch":
        """Row b holds tokens[b] at positions starts[b], starts[b]+1, ...; rows are right-padded."""
        lengths = [len(t) for t in tokens]
        if min(lengths) == 0:
            raise ValueError("every row of a forward batch needs at least one token")
        T, B = max(lengths), len(tokens)
        ids = torch.tensor([list(row) + [0] * (T - n) for row, n in zip(tokens, lengths)], dtype=torch.long)
        start = torch.tensor(starts, dtype=torch.long)[:, None]
        positions = start + torch.arange(T)[None, :]
        valid = None
        if min(lengths) != T:
            valid = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
            positions = torch.where(valid, positions, start)
        kv_len = max(s + n for s, n in zip(starts, lengths))
        mask = None
        if T > 1 or len(set(s + n for s, n in zip(starts, lengths))) > 1:
            mask = torch.arange(kv_len)[None, None, :] <= positions[:, :, None]
        return cls(ids.to(device), positions.to(device), torch.tensor(slots, dtype=torch.long, device=device),
                   kv_len, None if valid is None else valid.to(device), None,
                   None if mask is None else mask.to(device), True)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _param(*shape) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape))


def padded(rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[N, F] rows laid out as [B, T, F] where `valid` [B, T] is True (N of them), zeros elsewhere."""
    out = rows.new_zeros(*valid.shape, rows.shape[-1])
    out[valid] = rows
    return out


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup | None = None):
        super().__init__()
        self.tp = tp
        a, b = (0, cfg.num_kv_heads) if tp is None else tp.kv_heads(cfg.num_kv_heads)
        self.hkv, self.d = b - a, cfg.head_dim
        self.h = self.hkv * (cfg.num_heads // cfg.num_kv_heads)
        self.q_size, self.kv_size = self.h * self.d, self.hkv * self.d
        self.qkv_weight = _param(self.q_size + 2 * self.kv_size, cfg.hidden_size)
        self.qkv_bias = _param(self.q_size + 2 * self.kv_size) if cfg.attention_bias else None
        self.o_weight = _param(cfg.hidden_size, self.q_size)
        self.o_bias = _param(cfg.hidden_size) if cfg.attention_bias else None
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x, cos, sin, batch: ForwardBatch, cache: KVCache, index: PagedIndex, layer: int):
        """`x`: [B, T, hidden], or [N, hidden] for a ragged batch (its real tokens, laid out by `batch.valid`)."""
        ragged = x.dim() == 2
        qkv = linear(x, self.qkv_weight, self.qkv_bias)
        if ragged:
            qkv = padded(qkv, batch.valid)
        B, T, _ = qkv.shape
        q, k, v = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q, k, v = q.view(B, T, self.h, self.d), k.view(B, T, self.hkv, self.d), v.view(B, T, self.hkv, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        cache.write(layer, index, k, v, batch.valid)
        out = paged_attention(q, batch, cache, index, layer).reshape(B, T, self.q_size)
        out = linear(out[batch.valid] if ragged else out, self.o_weight)
        out = self.tp.all_reduce(out) if self.tp is not None else out
        return out if self.o_bias is None else out + self.o_bias


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup | None = None):
        super().__init__()
        self.tp = tp
        self.inter = cfg.intermediate_size // (1 if tp is None else tp.size)
        self.gate_up_weight = _param(2 * self.inter, cfg.hidden_size)
        self.gate_up_bias = _param(2 * self.inter) if cfg.mlp_bias else None
        self.down_weight = _param(cfg.hidden_size, self.inter)
        self.down_bias = _param(cfg.hidden_size) if cfg.mlp_bias else None

    def forward(self, x):
        gate, up = linear(x, self.gate_up_weight, self.gate_up_bias).split(self.inter, dim=-1)
        out = linear(F.silu(gate) * up, self.down_weight)
        out = self.tp.all_reduce(out) if self.tp is not None else out
        return out if self.down_bias is None else out + self.down_bias


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup | None = None):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, tp)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp)

    def forward(self, x, cos, sin, batch, cache, index, layer):
        x = x + self.attn(self.input_norm(x), cos, sin, batch, cache, index, layer)
        return x + self.mlp(self.post_attn_norm(x))


class Decoder(nn.Module):
    """With a `TPGroup`, this rank holds its share of the heads, the MLP and the output layer's vocabulary
    (column-parallel q/k/v, gate/up and lm_head; row-parallel o and down, summed by all-reduce); every rank
    runs the same forward on the same batch and gets the full logits."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup | None = None):
        super().__init__()
        if tp is not None:
            tp.check(cfg)
        self.cfg, self.tp = cfg, tp
        self.embed = _param(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, tp) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if tp is not None:
            self.lm_head = _param(tp.vocab_shard(cfg.vocab_size), cfg.hidden_size)
        else:
            self.lm_head = None if cfg.tie_word_embeddings else _param(cfg.vocab_size, cfg.hidden_size)
        self._rope: RotaryTable | None = None

    def rope(self, positions: int) -> RotaryTable:
        if self._rope is None or self._rope.cos.shape[0] < positions:
            n = max(positions, self.cfg.max_position_embeddings)
            self._rope = RotaryTable(self.cfg, n, device=self.embed.device, dtype=self.embed.dtype)
        return self._rope

    def make_cache(self, num_slots: int, max_len: int, scratch: int = 0, num_blocks: int | None = None,
                   block_size: int = DEFAULT_BLOCK_SIZE, reserved_blocks: int = 0) -> KVCache:
        """A paged cache; `num_blocks` defaults to room for every slot at full length plus scratch."""
        return KVCache(self.cfg, num_slots, max_len, scratch, self.embed.dtype, self.embed.device, num_blocks,
                       block_size, reserved_blocks, self.layers[0].attn.hkv)

    reads_features = False   # a feature-reading draft needs `batch.features`

    def forward(self, batch: ForwardBatch, cache: KVCache, index: PagedIndex | None = None,
                features: bool = False):
        """Final-normed hidden states [B, T, hidden] for every token of the batch; with `features`, also the
        pre-norm hidden states (what a feature-reading draft reads). `index` (where to write and read) is
        computed from the batch unless given (a CUDA graph replays one it keeps).

        A ragged batch (`batch.valid` set: rows of different lengths, right-padded) runs its matrices on its real
        tokens only, [N, hidden]; only attention sees the padded layout. Padded, a verify of one sequence at K = 3
        among fifteen at K = 0 multiplied 64 rows for 19 real ones and took 2.1x the 16-row verify (95 against 45
        ms on the default target, one core). Padding positions come back as zeros."""
        x = self.embed_inputs(batch)
        if batch.valid is not None:
            x = x[batch.valid]
        cos, sin = self.rope(cache.num_columns).lookup(batch.positions)
        if index is None:
            index = self.paged_index(batch, cache)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, batch, cache, index, i)
        h = self.norm(x)
        if batch.valid is not None:
            h, x = padded(h, batch.valid), padded(x, batch.valid)
        return (h, x) if features else h

    @staticmethod
    def paged_index(batch: ForwardBatch, cache: KVCache) -> PagedIndex:
        """Map the blocks the batch writes and give the physical rows it writes and reads."""
        cols = batch.positions if batch.cols is None else batch.cols
        last = batch.positions[:, -1] if batch.valid is None else batch.positions.masked_fill(
            ~batch.valid, -1).amax(dim=1)
        return cache.index(batch.slots, cols, batch.valid, batch.kv_len, last + 1)

    def embed_inputs(self, batch: ForwardBatch) -> torch.Tensor:
        return F.embedding(batch.input_ids, self.embed)

    def linear_weights(self) -> list[torch.Tensor]:
        """Every matrix the forward and `logits` multiply by (what `ssd.models.linear.pack_model` packs)."""
        mats = [w for layer in self.layers for w in (layer.attn.qkv_weight, layer.attn.o_weight,
                                                     layer.mlp.gate_up_weight, layer.mlp.down_weight)]
        return mats + [self.embed if self.lm_head is None else self.lm_head]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.tp is not None:
            return self.tp.gather_vocab(linear(hidden, self.lm_head).float(), self.cfg.vocab_size)
        return linear(hidden, self.embed if self.lm_head is None else self.lm_head).float()
