"""Attention over the paged KV cache.

CPU (and CUDA without flash-attn): keys and values are gathered through the block tables into
[B, Hkv, kv_len, D] and fed to SDPA with the batch's mask (on CPU in float32 for a bfloat16 or float16 model:
`UPCAST_ON_CPU`). CUDA with flash-attn installed: plain causal
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
# On CPU, SDPA in these dtypes runs on float32 copies of q, k and v, its result cast back. torch's CPU flash kernel
# in bfloat16 was the slow one at decode shapes (one query a row, GQA, 200 keys): 2.87 ms against 0.55 through
# float32 at 16 rows, 1.44 against 0.28 at 8, 95 against 81 us for one row of 4 queries, and 1.22 against 1.10 ms
# for the draft's 64 fork queries over 500 keys (one thread, 2026-12-06, AMD Zen 4); a bfloat16 target's attention
# took 68% of a 16 x 1 verify. The float32 result is also the more exact one.
UPCAST_ON_CPU = (torch.bfloat16, torch.float16)


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
    gqa, qt = q.shape[2] != keys.shape[1], q.transpose(1, 2)
    if q.device.type == "cpu" and q.dtype in UPCAST_ON_CPU:
        qt, keys, values = qt.float(), keys.float(), values.float()
        mask = mask.float() if mask is not None and mask.is_floating_point() else mask
    out = F.scaled_dot_product_attention(qt, keys, values, attn_mask=mask, enable_gqa=gqa)
    return out.to(q.dtype).transpose(1, 2)
