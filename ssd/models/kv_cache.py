"""A slot-based KV cache written by absolute column.

Each sequence owns one slot: `num_columns` key/value columns per layer. A token's KV is written at the column
named by the caller (its absolute position by default), so speculated tokens that the target rejects need no
rollback: the next round simply overwrites those columns, and causal masking by position never reads a column
beyond the query's own position. Columns past `max_len` (`scratch` of them) are room for the draft's branch
chains, which must never overwrite committed KV.
"""
from __future__ import annotations

import torch

from ssd.config import ModelConfig


class KVCache:
    def __init__(self, cfg: ModelConfig, num_slots: int, max_len: int, scratch: int = 0,
                 dtype=torch.float32, device=None):
        self.num_slots, self.max_len, self.scratch = num_slots, max_len, scratch
        self.num_columns = max_len + scratch
        shape = (cfg.num_layers, num_slots, cfg.num_kv_heads, self.num_columns, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError(f"KV cache full: all {self.num_slots} slots are in use")
        return self._free.pop()

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or slot in self._free:
            raise ValueError(f"slot {slot} is not allocated")
        self._free.append(slot)

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def write(self, layer: int, slots: torch.Tensor, cols: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              valid: torch.Tensor | None) -> None:
        """slots [B], cols [B, T], k/v [B, T, Hkv, D]; rows where `valid` is False are not written."""
        slot_bt = slots[:, None].expand_as(cols)
        if valid is not None:
            slot_bt, cols, k, v = slot_bt[valid], cols[valid], k[valid], v[valid]
        self.k[layer][slot_bt, :, cols] = k
        self.v[layer][slot_bt, :, cols] = v

    def read(self, layer: int, slots: torch.Tensor, length: int, contiguous_from: int | None):
        """Keys and values [B, Hkv, length, D] of the given slots; a view when the slots are consecutive."""
        if contiguous_from is not None:
            s = slice(contiguous_from, contiguous_from + slots.shape[0])
            return self.k[layer, s, :, :length], self.v[layer, s, :, :length]
        return self.k[layer][slots, :, :length], self.v[layer][slots, :, :length]
