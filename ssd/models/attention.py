"""Attention over the paged KV cache.

CPU (and CUDA without flash-attn): keys and values are gathered through the block tables into
[B, Hkv, kv_len, D] and fed to SDPA with the batch's mask. CUDA with flash-attn installed: plain causal
batches (every row ends at its last token, no explicit mask) go to `flash_attn_with_kvcache` with the block
table, which reads the blocks in place; batches with an explicit mask (the draft's branch chains) take SDPA.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # optional: only on CUDA machines with the flash-attn wheel
    from flash_attn import flash_attn_with_kvcache
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_with_kvcache = None

FLASH_BLOCK_MULTIPLE = 256  # flash-attn's paged kernel needs blocks of a multiple of 256 tokens


def flash_usable(q: torch.Tensor, batch, cache) -> bool:
    return (flash_attn_with_kvcache is not None and q.is_cuda and batch.causal and batch.valid is None
            and cache.block_size % FLASH_BLOCK_MULTIPLE == 0)


def paged_attention(q: torch.Tensor, batch, cache, index, layer: int) -> torch.Tensor:
    """q [B, T, H, D] -> [B, T, H, D]; the layer's new KV is already written."""
    if flash_usable(q, batch, cache):  # pragma: no cover - needs a GPU and flash-attn
        k_blocks, v_blocks = cache.block_view(layer)
        return flash_attn_with_kvcache(q, k_blocks, v_blocks, cache_seqlens=index.lengths,
                                       block_table=index.table.to(torch.int32), causal=True)
    keys, values = cache.read(layer, index)
    mask = None if batch.attn_mask is None else batch.attn_mask[:, None]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask,
                                         enable_gqa=q.shape[2] != keys.shape[1])
    return out.transpose(1, 2)
