"""A decode step (one token per row, a fixed batch size) replayed as a CUDA graph.

A graph replays fixed kernels on fixed buffers, so everything shape- or host-dependent happens outside it:
`cache.index` maps the KV blocks and builds the physical write rows and the read index over *all* columns of
the cache (a fixed width), which are copied into static buffers together with the token ids, positions and a
causal mask (column <= position). Inside, the decoder runs on those buffers and the output layer writes the
logits to a static tensor. Rows past the real batch are padding: they write one scratch row of the cache
(the last physical row, which `DecodeGraph` takes out of the block manager) and their logits are dropped.

`step(..., graph=False)` runs the same static path eagerly (any device), which is what the graph is tested
against; the CPU engines never use this module (it is only built when `torch.cuda.is_available()`).
"""
from __future__ import annotations

import torch

from ssd.models.decoder import Decoder, ForwardBatch
from ssd.models.kv_cache import KVCache, PagedIndex


class DecodeGraph:
    def __init__(self, model: Decoder, cache: KVCache, batch_size: int):
        self.model, self.cache, self.B = model, cache, batch_size
        dev = cache.k.device
        self.kv_len = cache.num_columns
        # padding rows write here: a physical row no sequence can own
        self.pad_block = self._reserve_pad_block()
        self.pad_row = self.pad_block * cache.block_size
        B, L = batch_size, self.kv_len
        self.ids = torch.zeros((B, 1), dtype=torch.long, device=dev)
        self.positions = torch.zeros((B, 1), dtype=torch.long, device=dev)
        self.mask = torch.zeros((B, 1, L), dtype=torch.bool, device=dev)
        self.mask[:, :, 0] = True
        blocks = -(-L // cache.block_size)
        self.index = PagedIndex(torch.full((B,), self.pad_row, dtype=torch.long, device=dev),
                                torch.full((B, L), self.pad_row, dtype=torch.long, device=dev),
                                torch.full((B, blocks), self.pad_block, dtype=torch.long, device=dev),
                                torch.ones((B,), dtype=torch.int32, device=dev))
        self.batch = ForwardBatch(self.ids, self.positions, torch.zeros(B, dtype=torch.long, device=dev), L,
                                  attn_mask=self.mask, causal=False)
        self.logits: torch.Tensor | None = None
        self.graph = None
        self._cols = torch.arange(L, device=dev)

    def _reserve_pad_block(self) -> int:
        blocks = self.cache.blocks
        if not blocks.free:
            raise MemoryError("no free KV block left for the CUDA graph's padding rows")
        b = blocks.free.pop(0)   # the block handed out last; taken for good
        blocks.ref[b] = 1
        return b

    @torch.inference_mode()
    def _run(self) -> torch.Tensor:
        hidden = self.model(self.batch, self.cache, self.index)
        return self.model.logits(hidden[:, -1])

    @torch.inference_mode()
    def capture(self, warmup: int = 2) -> "DecodeGraph":
        """Record the graph (the static buffers point at the padding row meanwhile: nothing real is written)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self._run()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._run()
        return self

    @torch.inference_mode()
    def step(self, tokens: list[int], positions: list[int], slots: list[int], graph: bool = True) -> torch.Tensor:
        """Logits [n, V] for one token per sequence: `tokens[b]` at `positions[b]` of cache slot `slots[b]`."""
        n = len(tokens)
        if not 0 < n <= self.B:
            raise ValueError(f"a decode graph of batch size {self.B} cannot run {n} rows")
        dev = self.ids.device
        pos = torch.tensor(positions, dtype=torch.long, device=dev)[:, None]
        real = self.cache.index(torch.tensor(slots, dtype=torch.long, device=dev), pos, None, self.kv_len,
                                pos[:, 0] + 1)
        self.ids[:n, 0] = torch.tensor(tokens, dtype=torch.long, device=dev)
        self.positions[:n] = pos
        self.mask[:n] = self._cols[None, None, :] <= pos[:, :, None]
        self.index.write[:n] = real.write
        self.index.read[:n] = real.read
        self.index.table[:n] = real.table[:, :self.index.table.shape[1]]
        self.index.lengths[:n] = real.lengths
        if n < self.B:   # rows left over from a larger step go back to the padding row
            self.ids[n:], self.positions[n:], self.index.write[n:] = 0, 0, self.pad_row
            self.index.read[n:], self.mask[n:], self.index.lengths[n:] = self.pad_row, False, 1
            self.mask[n:, :, 0] = True
        if graph and self.graph is not None:
            self.graph.replay()
            return self.logits[:n]
        return self._run()[:n]
