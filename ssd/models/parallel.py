"""Tensor parallelism over `torch.distributed`: NCCL on GPUs, gloo on CPU.

A `TPGroup` is this rank's place in the group. The decoder splits attention heads, the MLP's intermediate
size and the output layer's vocabulary across ranks; `shard_rows`/`shard_cols` cut a full checkpoint tensor
to this rank's part at load time. KV heads are split as evenly as they go (3 KV heads over 2 ranks: 2 and 1),
each rank taking the query heads that share its KV heads, so models whose head counts the size does not
divide (SmolLM2: 9 query, 3 KV heads) still run, with some imbalance.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ssd.config import ModelConfig


@dataclass(slots=True)
class TPGroup:
    rank: int
    size: int
    group: object = None   # a torch.distributed process group (None = the default group)

    @classmethod
    def init(cls, rank: int, size: int, init_method: str, backend: str | None = None) -> "TPGroup":
        """Join (or create) the default process group: gloo on CPU, NCCL when CUDA is available."""
        if not dist.is_initialized():
            backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
        return cls(rank, size)

    def check(self, cfg: ModelConfig) -> None:
        if cfg.num_kv_heads < self.size:
            raise ValueError(f"tensor parallel size {self.size} exceeds num_key_value_heads = {cfg.num_kv_heads}")
        if cfg.intermediate_size % self.size:
            raise ValueError(f"tensor parallel size {self.size} does not divide intermediate_size = "
                             f"{cfg.intermediate_size}")

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """This rank's KV heads [start, end): the first `num_kv_heads % size` ranks take one more."""
        base, extra = divmod(num_kv_heads, self.size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (self.rank < extra)

    def head_rows(self, t: torch.Tensor, num_kv_heads: int, dim: int = 0) -> torch.Tensor:
        """Rows (or columns, dim=1) of this rank's heads in a [heads * head_dim, ...] tensor."""
        a, b = self.kv_heads(num_kv_heads)
        per = t.shape[dim] // num_kv_heads   # rows per KV head (its query heads, or itself)
        return t.narrow(dim, a * per, (b - a) * per)

    def vocab_shard(self, vocab: int) -> int:
        return -(-vocab // self.size)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.group)
        return x

    def gather_vocab(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        dist.all_gather(parts, logits.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)[..., :vocab]

    def shard_rows(self, t: torch.Tensor) -> torch.Tensor:
        n = t.shape[0] // self.size
        return t[self.rank * n:(self.rank + 1) * n]

    def shard_cols(self, t: torch.Tensor) -> torch.Tensor:
        n = t.shape[1] // self.size
        return t[:, self.rank * n:(self.rank + 1) * n]

    def vocab_rows(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the output layer, zero-padded when the vocabulary does not divide evenly."""
        n = self.vocab_shard(t.shape[0])
        part = t[self.rank * n:(self.rank + 1) * n]
        if part.shape[0] < n:
            part = torch.cat([part, part.new_zeros(n - part.shape[0], *part.shape[1:])])
        return part


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
