"""Fixed-size KV blocks: a free list, reference counts, and a prefix cache of full blocks.

A full block of committed tokens is identified by a chained hash (its tokens and the hash of the block before
it), so equal hashes mean equal prefixes, and is checked against the stored token ids on a match. A registered
block that no sequence references stays cached until space is needed; it is then evicted least recently used
first. Blocks without a hash go straight back to the free list. `reserved` blocks can only be taken by
allocations marked `scratch` (the draft's per-round branch space), so scratch never starves committed KV and
committed KV never starves scratch.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


def chain_hash(prev: int, tokens) -> int:
    return hash((prev, tuple(tokens)))


@dataclass(slots=True)
class PrefixStats:
    queried_tokens: int = 0   # prompt tokens looked up in the prefix cache
    hit_tokens: int = 0       # of those, tokens whose KV came from a cached block
    evictions: int = 0

    def unquery(self, queried: int, hit: int) -> None:
        """Take back a lookup whose sequence was not admitted after all."""
        self.queried_tokens -= queried
        self.hit_tokens -= hit

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, reserved: int = 0):
        if block_size < 1 or num_blocks < 1:
            raise ValueError(f"need at least one block of at least one token (got {num_blocks} x {block_size})")
        if not 0 <= reserved < num_blocks:
            raise ValueError(f"reserved blocks ({reserved}) must be fewer than all blocks ({num_blocks})")
        self.num_blocks, self.block_size, self.reserved = num_blocks, block_size, reserved
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.tokens_of: list[tuple[int, ...] | None] = [None] * num_blocks
        self.by_hash: dict[int, int] = {}
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.cached: OrderedDict[int, None] = OrderedDict()   # unreferenced registered blocks, LRU first
        self.stats = PrefixStats()

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take (free or evictable)."""
        return len(self.free) + len(self.cached)

    def can_allocate(self, n: int, scratch: bool = False) -> bool:
        return n <= self.num_free - (0 if scratch else self.reserved)

    def allocate(self, n: int, scratch: bool = False) -> list[int]:
        if not self.can_allocate(n, scratch):
            raise MemoryError(f"KV cache full: {n} blocks needed, {self.num_free} free "
                              f"({self.reserved} reserved for scratch)")
        out = []
        for _ in range(n):
            if self.free:
                b = self.free.pop()
            else:
                b, _ = self.cached.popitem(last=False)
                del self.by_hash[self.hash_of[b]]
                self.hash_of[b] = self.tokens_of[b] = None
                self.stats.evictions += 1
            self.ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: list[int]) -> None:
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] < 0:
                raise ValueError(f"block {b} released more often than taken")
            if self.ref[b] == 0:
                if self.hash_of[b] is None:
                    self.free.append(b)
                else:
                    self.cached[b] = None

    def match(self, tokens: list[int], limit: int) -> tuple[list[int], int]:
        """Take a reference on the cached blocks holding a prefix of `tokens[:limit]` (full blocks only);
        returns them and the hash of the last one."""
        bs, h, last, out = self.block_size, 0, 0, []
        for i in range(limit // bs):
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            h = chain_hash(h, chunk)
            b = self.by_hash.get(h)
            if b is None or self.tokens_of[b] != chunk:
                break
            last = h
            if self.ref[b] == 0:
                del self.cached[b]
            self.ref[b] += 1
            out.append(b)
        self.stats.queried_tokens += limit
        self.stats.hit_tokens += len(out) * bs
        return out, last

    def register(self, blocks: list[int], tokens: list[int], start: int, end: int, prev: int) -> int:
        """Hash blocks start..end-1 of a sequence (full, committed, KV written); returns the last hash."""
        bs = self.block_size
        for i in range(start, end):
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            prev = chain_hash(prev, chunk)
            b = blocks[i]
            if self.hash_of[b] is None and prev not in self.by_hash:
                self.hash_of[b], self.tokens_of[b] = prev, chunk
                self.by_hash[prev] = b
        return prev
