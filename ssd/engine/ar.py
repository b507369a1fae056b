"""The autoregressive baseline: one token per sequence per step, with continuous batching.

New requests join between steps: a step either prefills the waiting requests that fit in free KV slots or
decodes one token for every running sequence. The same model code and sampling serve SD and SSD, so this
engine is the reference they must match.
"""
from __future__ import annotations


import torch

from ssd.engine.base import Engine
from ssd.engine.sequence import Sequence
from ssd.models.decoder import Decoder, ForwardBatch
from ssd.sampling import probs_from_logits, sample


class AREngine(Engine):
    def __init__(self, model: Decoder, max_batch: int = 8, max_len: int | None = None,
                 eos_token_ids: tuple[int, ...] | None = None):
        super().__init__()
        cfg = model.cfg
        self.model = model
        self.max_len = min(max_len or 2048, cfg.max_position_embeddings)
        self.eos_token_ids = frozenset(cfg.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.vocab_size = cfg.vocab_size
        self.cache = model.make_cache(max_batch, self.max_len)
        self.device = model.embed.device

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """Run one forward; returns the sequences that received a token (finished ones included)."""
        if self.waiting and self.cache.free_slots:
            batch = []
            while self.waiting and self.cache.free_slots:
                seq = self.waiting.popleft()
                seq.slot = self.cache.allocate()
                batch.append(seq)
            fb = ForwardBatch.ragged([s.prompt for s in batch], [0] * len(batch), [s.slot for s in batch],
                                     device=self.device)
            lengths = torch.tensor([len(s.prompt) - 1 for s in batch], device=self.device)
            hidden = self.model(fb, self.cache)[torch.arange(len(batch), device=self.device), lengths]
            self.running.extend(batch)
        elif self.running:
            batch = list(self.running)
            fb = ForwardBatch.ragged([[s.last_token] for s in batch], [s.num_tokens - 1 for s in batch],
                                     [s.slot for s in batch], device=self.device)
            hidden = self.model(fb, self.cache)[:, -1]
        else:
            return []
        probs = probs_from_logits(self.model.logits(hidden), [s.params for s in batch])
        tokens = sample(probs, [s.generator for s in batch]).tolist()
        for seq, tok in zip(batch, tokens):
            seq.append(tok, self.eos_token_ids, self.max_len)
            if seq.finished:
                self._finish(seq)
        return batch

    def _finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cache.release(seq.slot)
        seq.slot = -1
