"""Forwards replayed as CUDA graphs: decode steps, verify steps and the draft's branch steps alike.

A graph replays fixed kernels on fixed buffers, so it is captured per shape: B rows of T tokens reading L KV
columns, with B, T and L rounded up to a bucket (`GraphRunner.key`). Everything host- or shape-dependent
happens before the replay: `cache.index` maps the KV blocks and gives the physical rows each token writes and
each row reads; those, the token ids, positions, the attention mask and (for a feature-reading draft) the
input features are copied into the graph's static buffers. Inside, the decoder runs on those buffers with an
explicit mask, which is why one graph serves every kind of step: a decode step (T = 1), a verify step
(T = K + 1) and a branch step (T = the forks of a sequence, each attending its own chain) differ only in
what the buffers hold.

Padding (rows past the batch, tokens past a row's end, tokens a ragged batch marks invalid) writes the cache's
`pad_row`, one row past its blocks that no sequence can own, and attends column 0 only; its outputs are
dropped. Columns past the batch's `kv_len` read that row too and are
masked out. So a padded step computes the same values for the real tokens as the ordinary forward, up to the
floating-point effect of the different matrix shapes (the tests bound it).

`GraphRunner` is called like the model (`runner(batch, cache, features=...)`) and falls back to the ordinary
forward for shapes outside its buckets (long prefills) or another cache. With `graphs=False` it runs the same
static path eagerly on any device: what the CPU tests check against the ordinary forward. The engines build
one only where `cuda_graphs` resolves to on (`resolve_graphs`): never on the CPU unless asked.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ssd.models.decoder import Decoder, ForwardBatch
from ssd.models.kv_cache import KVCache, PagedIndex

GRAPH_MODES = ("auto", "on", "off", "static")


def resolve_graphs(mode: str | bool | None, device) -> str:
    """'graph' (CUDA graphs), 'static' (the static path run eagerly) or 'off' (the ordinary forward).
    auto = graphs on a CUDA device, off elsewhere."""
    if mode is None or mode is True:
        mode = "auto" if mode is None else "on"
    if mode is False:
        mode = "off"
    if mode not in GRAPH_MODES:
        raise ValueError(f"cuda_graphs must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    cuda = torch.device(device).type == "cuda"
    if mode == "on" and not cuda:
        raise ValueError("cuda_graphs='on' needs the model on a CUDA device")
    if mode == "auto":
        return "graph" if cuda else "off"
    return {"on": "graph", "off": "off", "static": "static"}[mode]


def _bucket_tokens(t: int) -> int:
    return t if t <= 8 else 1 << (t - 1).bit_length()


def _bucket_rows(b: int, max_rows: int) -> int:
    return min(1 << (b - 1).bit_length(), max_rows)


def _bucket_columns(n: int, total: int, smallest: int = 64) -> int:
    return min(max(smallest, 1 << (n - 1).bit_length()), total)


@dataclass(slots=True)
class GraphStats:
    captured: int = 0        # graphs recorded
    capture_s: float = 0.0   # time spent recording them
    replays: int = 0         # forwards that ran a graph (or the static path eagerly)
    fallbacks: int = 0       # forwards that took the ordinary path (shape outside the buckets)


class _Step:
    """One shape's static buffers and, once captured, its graph."""

    def __init__(self, runner: "GraphRunner", B: int, T: int, L: int, features: bool):
        model, dev = runner.model, runner.device
        self.runner, self.B, self.T, self.L, self.features = runner, B, T, L, features
        pad = runner.pad_row
        self.ids = torch.zeros((B, T), dtype=torch.long, device=dev)
        self.positions = torch.zeros((B, T), dtype=torch.long, device=dev)
        self.mask = torch.zeros((B, T, L), dtype=torch.bool, device=dev)
        self.mask[..., 0] = True
        self.index = PagedIndex(torch.full((B * T,), pad, dtype=torch.long, device=dev),
                                torch.full((B, L), pad, dtype=torch.long, device=dev),
                                torch.zeros((B, 1), dtype=torch.long, device=dev),
                                torch.ones((B,), dtype=torch.int32, device=dev))
        self.batch = ForwardBatch(self.ids, self.positions, torch.zeros(B, dtype=torch.long, device=dev), L,
                                  attn_mask=self.mask, causal=False)
        if getattr(model, "reads_features", False):
            self.batch.features = torch.zeros((B, T, model.feature_size), dtype=model.embed.dtype, device=dev)
        self.out = None
        self.graph = None

    def run(self):
        return self.runner.model(self.batch, self.runner.cache, self.index, features=self.features)

    def capture(self, pool) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.run()   # warm-up: lazy initialisation and the allocator's first blocks happen outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = self.run()

    def load(self, batch: ForwardBatch, index: PagedIndex) -> None:
        b, t = batch.input_ids.shape
        pad = self.runner.pad_row
        self.ids.zero_()
        self.ids[:b, :t] = batch.input_ids
        self.positions.zero_()
        self.positions[:b, :t] = batch.positions
        write = self.index.write.view(self.B, self.T)
        write.fill_(pad)
        if batch.valid is None:
            write[:b, :t] = index.write.view(b, t)
        else:
            rows = torch.full((b, t), pad, dtype=torch.long, device=write.device)
            rows[batch.valid] = index.write
            write[:b, :t] = rows
        n = batch.kv_len
        self.index.read.fill_(pad)
        self.index.read[:b, :n] = index.read
        self.mask.zero_()
        self.mask[..., 0] = True
        if batch.attn_mask is not None:
            self.mask[:b, :t, :n] = batch.attn_mask
        else:
            self.mask[:b, :t, :n] = self.runner.columns[:n] <= batch.positions[:, :, None]
        if batch.valid is not None:   # invalid tokens attend column 0 only, like every padding token
            self.mask[:b, :t][~batch.valid] = self.runner.columns[:self.L] == 0
        if self.batch.features is not None:
            self.batch.features.zero_()
            if batch.features is not None:
                self.batch.features[:b, :t] = batch.features

    def __call__(self, batch: ForwardBatch, index: PagedIndex, graph: bool):
        self.load(batch, index)
        if graph:
            self.graph.replay()
            out = self.out
        else:
            out = self.run()
        b, t = batch.input_ids.shape
        if self.features:   # copies: the next replay overwrites the graph's outputs
            return out[0][:b, :t].clone(), out[1][:b, :t].clone()
        return out[:b, :t].clone()


class GraphRunner:
    """Runs a model's forwards on one cache through captured (or static) steps; callable like the model.

    Shapes are bucketed: rows to a power of two (at most `max_rows`), tokens exactly up to 8 then to a power of
    two (at most `max_tokens`), columns to a power of two from 64 (at most the cache's). A bucket's graph is
    captured the first time it is needed, at most `max_graphs` of them (then the ordinary forward runs)."""

    def __init__(self, model: Decoder, cache: KVCache, max_rows: int, max_tokens: int = 16, graphs: bool = True,
                 max_graphs: int = 128):
        if graphs and not torch.cuda.is_available():
            raise ValueError("CUDA graphs need a CUDA device")
        self.model, self.cache, self.max_rows, self.max_tokens = model, cache, max_rows, max_tokens
        self.graphs, self.max_graphs = graphs, max_graphs
        self.device = cache.k.device
        self.pad_row = cache.pad_row
        self.columns = torch.arange(cache.num_columns, device=self.device)
        self.rope = model.rope(cache.num_columns)   # built now and kept: a graph reads its tables in place
        self.steps: dict[tuple[int, int, int, bool], _Step] = {}
        self.pool = torch.cuda.graph_pool_handle() if graphs else None
        self.stats = GraphStats()

    def key(self, batch: ForwardBatch, features: bool) -> tuple[int, int, int, bool] | None:
        b, t = batch.input_ids.shape
        if b > self.max_rows or t > self.max_tokens or batch.kv_len > self.cache.num_columns:
            return None
        return (_bucket_rows(b, self.max_rows), min(_bucket_tokens(t), self.max_tokens),
                _bucket_columns(batch.kv_len, self.cache.num_columns), features)

    @torch.inference_mode()
    def __call__(self, batch: ForwardBatch, cache: KVCache, index: PagedIndex | None = None, features: bool = False):
        key = None if cache is not self.cache or index is not None else self.key(batch, features)
        step = None if key is None else self.steps.get(key)
        if key is not None and step is None and len(self.steps) < self.max_graphs:
            step = self.steps[key] = _Step(self, *key)
            if self.graphs:
                t0 = time.perf_counter()
                step.capture(self.pool)
                self.stats.captured += 1
                self.stats.capture_s += time.perf_counter() - t0
        if step is None:
            self.stats.fallbacks += 1
            return self.model(batch, cache, index, features=features)
        self.stats.replays += 1
        return step(batch, self.model.paged_index(batch, cache), self.graphs)


def graphed_forward(model: Decoder, cache: KVCache, max_rows: int, max_tokens: int = 16, mode: str = "auto"):
    """What an engine calls for its forwards on `cache`: the model itself, or a `GraphRunner` over it."""
    how = resolve_graphs(mode, model.embed.device)
    if how == "off":
        return model
    return GraphRunner(model, cache, max_rows, max_tokens, graphs=how == "graph")
