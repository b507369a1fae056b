"""A paged KV cache written by absolute column.

Each sequence holds a slot: a block table mapping its logical KV columns to fixed-size physical blocks
(`BlockManager`). A token's KV is written at the column the caller names (its absolute position by default),
so speculated tokens that the target rejects need no rollback: the next round overwrites those columns, and
causal masking by position never reads a column beyond the query's own position. Columns past `max_len`
(`scratch` of them) are room for the draft's branch chains, which must never overwrite committed KV.

Blocks are mapped on demand: a forward maps whatever its writes need, and engines that must not fail call
`ensure` first (and preempt when it cannot be met). Full blocks of committed tokens are registered in the
prefix cache (`register`); a new sequence starts from the cached blocks of its longest registered prefix
(`match_prefix`). Writes only ever go past a sequence's valid KV, so a shared block is never written.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ssd.config import ModelConfig
from ssd.models.blocks import BlockManager

DEFAULT_BLOCK_SIZE = 16
DEFAULT_KV_TOKENS = 32768   # KV held when none is configured (16 sequences of 2048, or 4 of 8192)


def blocks_for(columns: int, block_size: int) -> int:
    return -(-columns // block_size)


def default_kv_tokens(slots: int, columns: int) -> int:
    """The KV capacity in tokens when none is configured: every slot at `columns`, but at most
    DEFAULT_KV_TOKENS unless one sequence alone needs more (the paged cache preempts when it fills)."""
    return min(slots * columns, max(columns, DEFAULT_KV_TOKENS))


@dataclass(slots=True)
class PagedIndex:
    """Where one forward writes (flat physical rows of its valid tokens) and what it reads ([B, kv_len])."""
    write: torch.Tensor
    read: torch.Tensor
    table: torch.Tensor      # [B, blocks] physical block ids (0 where unmapped; those columns are masked)
    lengths: torch.Tensor    # [B] int32, columns each row's last token attends (for flash-attn)


class KVCache:
    def __init__(self, cfg: ModelConfig, num_slots: int, max_len: int, scratch: int = 0,
                 dtype=torch.float32, device=None, num_blocks: int | None = None,
                 block_size: int = DEFAULT_BLOCK_SIZE, reserved_blocks: int = 0, num_kv_heads: int | None = None):
        self.num_slots, self.max_len, self.scratch = num_slots, max_len, scratch
        self.num_columns = max_len + scratch
        self.block_size = block_size
        if num_blocks is None:
            num_blocks = num_slots * blocks_for(self.num_columns, block_size)
        self.blocks = BlockManager(num_blocks, block_size, reserved_blocks)
        heads = cfg.num_kv_heads if num_kv_heads is None else num_kv_heads
        # one row past the blocks: where padding tokens of a fixed-shape step write (ssd.models.cuda_graph)
        self.pad_row = num_blocks * block_size
        shape = (cfg.num_layers, num_blocks * block_size + 1, heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.tables: list[list[int]] = [[] for _ in range(num_slots)]
        self._hashed: list[tuple[int, int]] = [(0, 0)] * num_slots   # (registered blocks, last chain hash)
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def capacity_tokens(self) -> int:
        return (self.blocks.num_blocks - self.blocks.reserved) * self.block_size

    @property
    def free_tokens(self) -> int:
        return max(0, self.blocks.num_free - self.blocks.reserved) * self.block_size

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError(f"KV cache full: all {self.num_slots} slots are in use")
        return self._free.pop()

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or slot in self._free:
            raise ValueError(f"slot {slot} is not allocated")
        self.drop(slot)
        self._free.append(slot)

    def drop(self, slot: int) -> None:
        """Give back every block of a slot (its KV is lost; registered blocks stay in the prefix cache)."""
        self.blocks.release(self.tables[slot])
        self.tables[slot] = []
        self._hashed[slot] = (0, 0)

    def blocks_needed(self, slot: int, columns: int) -> int:
        return max(0, blocks_for(columns, self.block_size) - len(self.tables[slot]))

    def ensure(self, slot: int, columns: int, scratch: bool = False) -> None:
        """Map columns 0..columns-1 of a slot; raises MemoryError when the blocks are not there."""
        need = self.blocks_needed(slot, columns)
        if need:
            self.tables[slot] += self.blocks.allocate(need, scratch)

    def trim(self, slot: int, columns: int) -> None:
        """Unmap the blocks wholly past `columns` (scratch space after a round)."""
        keep = blocks_for(columns, self.block_size)
        table = self.tables[slot]
        if len(table) > keep:
            self.blocks.release(table[keep:])
            del table[keep:]
            if self._hashed[slot][0] > keep:
                raise ValueError(f"slot {slot}: trimming below its registered prefix")

    def match_prefix(self, slot: int, tokens: list[int], limit: int | None = None) -> int:
        """Start an empty slot from the prefix cache; returns how many leading tokens have KV already.
        At most `limit` tokens (default all but the last, whose output the caller still needs)."""
        if self.tables[slot]:
            raise ValueError(f"slot {slot} already holds KV")
        limit = len(tokens) - 1 if limit is None else min(limit, len(tokens))
        blocks, last = self.blocks.match(tokens, max(0, limit))
        self.tables[slot] = blocks
        self._hashed[slot] = (len(blocks), last)
        return len(blocks) * self.block_size

    def register(self, slot: int, tokens: list[int], valid: int) -> None:
        """Offer the full blocks of `tokens[:valid]` (committed, KV written) to the prefix cache."""
        full = min(valid, len(tokens), len(self.tables[slot]) * self.block_size) // self.block_size
        done, last = self._hashed[slot]
        if full > done:
            last = self.blocks.register(self.tables[slot], tokens, done, full, last)
            self._hashed[slot] = (full, last)

    def index(self, slots: torch.Tensor, cols: torch.Tensor, valid: torch.Tensor | None, kv_len: int,
              lengths: torch.Tensor) -> PagedIndex:
        """Map what a forward writes (cols [B, T]) and reads (columns 0..kv_len-1) to physical rows."""
        bs = self.block_size
        slot_list = slots.tolist()
        last_col = cols.amax(dim=1).tolist()
        ends = [c + 1 for c in last_col] if valid is None else (torch.where(valid, cols, 0).amax(dim=1) + 1).tolist()
        for s, end in zip(slot_list, ends):
            self.ensure(s, end)
        width = max(blocks_for(kv_len, bs), blocks_for(max(last_col) + 1, bs))
        rows = [self.tables[s][:width] for s in slot_list]
        table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=self.k.device)
        write = table.gather(1, cols // bs) * bs + cols % bs
        if valid is not None:
            write = write[valid]
        col = torch.arange(kv_len, device=self.k.device)
        read = table[:, col // bs] * bs + col % bs
        return PagedIndex(write.reshape(-1), read, table, lengths.to(torch.int32))

    def write(self, layer: int, index: PagedIndex, k: torch.Tensor, v: torch.Tensor,
              valid: torch.Tensor | None) -> None:
        """k/v [B, T, Hkv, D]; rows where `valid` is False are not written."""
        if valid is not None:
            k, v = k[valid], v[valid]
        self.k[layer].index_copy_(0, index.write, k.reshape(-1, *k.shape[-2:]))
        self.v[layer].index_copy_(0, index.write, v.reshape(-1, *v.shape[-2:]))

    def read(self, layer: int, index: PagedIndex) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [B, Hkv, kv_len, D] gathered through the block tables."""
        shape, flat = (*index.read.shape, *self.k.shape[-2:]), index.read.reshape(-1)
        return (self.k[layer].index_select(0, flat).view(shape).transpose(1, 2),
                self.v[layer].index_select(0, flat).view(shape).transpose(1, 2))

    def block_view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[num_blocks, block_size, Hkv, D] views (the layout flash-attn's paged kernel reads)."""
        shape = (self.blocks.num_blocks, self.block_size, *self.k.shape[-2:])
        n = self.pad_row
        return self.k[layer][:n].view(shape), self.v[layer][:n].view(shape)
