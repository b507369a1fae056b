"""The autoregressive baseline: one token per sequence per step, with continuous batching.

New requests join between steps: a step either prefills the waiting requests that fit (a free slot and the
KV blocks for their tokens) or decodes one token for every running sequence. A prompt starts from the
longest prefix the KV cache already holds (prefix caching), so only its new tokens are computed. When a
decode step needs a block and none is free, the most recently admitted sequence is preempted: its KV is
dropped and it goes back to the front of the queue, to be recomputed (prompt and output so far) when it fits.
The same model code and sampling (penalties and biases included: `ssd.sampling.penalize` on each step's logits)
serve SD and SSD, so this engine is the reference they must match. A constrained sequence
(`SamplingParams.constraint`) has each step's logits masked to its grammar after the penalties. A sequence that
asks for prompt logprobs is admitted the first time without a prefix-cache lookup, so its prefill computes every
prompt position (`Sequence.prompt_logprobs`).
"""
from __future__ import annotations

import torch

from ssd.constraints import Matcher
from ssd.engine.base import Engine
from ssd.engine.sequence import Sequence
from ssd.models.blocks import PrefixStats
from ssd.models.cuda_graph import graphed_forward
from ssd.models.decoder import Decoder, ForwardBatch
from ssd.models.kv_cache import DEFAULT_BLOCK_SIZE, blocks_for, default_kv_tokens
from ssd.params import ending_tokens
from ssd.engine.target import constrain
from ssd.sampling import coupled_tokens, penalize, probs_from_logits, sample, token_logprobs


class AREngine(Engine):
    def __init__(self, model: Decoder, max_batch: int = 8, max_len: int | None = None,
                 eos_token_ids: tuple[int, ...] | None = None, kv_tokens: int = 0,
                 block_size: int = DEFAULT_BLOCK_SIZE, prefix_caching: bool = True, cuda_graphs: str = "auto",
                 grammar_tokenizer=None):
        super().__init__()
        cfg = model.cfg
        self.grammar_tokenizer = grammar_tokenizer   # an llguidance tokenizer (ssd.constraints.grammar_tokenizer)
        self._matchers: dict[int, Matcher] = {}      # Sequence.seq_id -> its grammar state after its output
        self.model = model
        self.max_len = cfg.context_length(max_len or 0)
        self.eos_token_ids = frozenset(cfg.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.vocab_size = cfg.vocab_size
        if 0 < kv_tokens < self.max_len:
            raise ValueError(f"kv_tokens={kv_tokens} cannot hold one sequence of the maximum length {self.max_len}")
        kv_tokens = kv_tokens or default_kv_tokens(max_batch, self.max_len)
        self.cache = model.make_cache(max_batch, self.max_len, num_blocks=blocks_for(kv_tokens, block_size),
                                      block_size=block_size)
        self.prefix_caching = prefix_caching
        self.forward = graphed_forward(model, self.cache, max_batch, mode=cuda_graphs)
        self.device = model.embed.device
        self.prefill_tokens = 0   # tokens computed by prefills (prefix-cache hits excluded, recomputation included)
        self.preemptions = 0

    @property
    def prefix_stats(self) -> PrefixStats:
        return self.cache.blocks.stats

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """Run one forward; returns the sequences that received a token (finished ones included)."""
        batch, cached = self._admit()
        if batch:
            rows = [(s.prompt + s.output)[c:] for s, c in zip(batch, cached)]
            fb = ForwardBatch.ragged(rows, cached, [s.slot for s in batch], device=self.device)
            lengths = torch.tensor([len(r) - 1 for r in rows], device=self.device)
            every = self.forward(fb, self.cache)
            hidden = every[torch.arange(len(batch), device=self.device), lengths]
            for b, s in enumerate(batch):   # admitted without a prefix-cache lookup: every prompt position is here
                if s.params.prompt_logprobs is not None and s.prompt_logprobs is None:
                    n = len(s.prompt)
                    s.prompt_logprobs = [None] + token_logprobs(self.model.logits(every[b, :n - 1]), s.prompt[1:],
                                                                s.params.prompt_logprobs, ranks=True)
            self.prefill_tokens += sum(len(r) for r in rows)
            if self.prefix_caching:
                for s in batch:
                    self.cache.register(s.slot, s.prompt + s.output, s.num_tokens)
            self.running.extend(batch)
        elif self.running:
            self._reserve_decode()
            batch = list(self.running)
            fb = ForwardBatch.ragged([[s.last_token] for s in batch], [s.num_tokens - 1 for s in batch],
                                     [s.slot for s in batch], device=self.device)
            hidden = self.forward(fb, self.cache)[:, -1]
        else:
            return []
        logits = self.model.logits(hidden)
        raw = {b: logits[b:b + 1] for b, s in enumerate(batch) if s.params.logprobs is not None}
        if any(s.params.penalized or s.params.constraint for s in batch):
            logits = logits.float().clone()
            for b, s in enumerate(batch):
                if s.params.penalized:
                    logits[b] = penalize(logits[b:b + 1], s.params, s.prompt + s.output, len(s.prompt),
                                         ending_tokens(s.params, self.eos_token_ids))[0]
                if s.params.constraint:
                    logits[b:b + 1] = constrain(logits[b:b + 1], self._matcher(s).masks())
        probs = probs_from_logits(logits, [s.params for s in batch])
        tokens = sample(probs, [s.generator for s in batch]).tolist()
        for b, s in enumerate(batch):   # a coupled row's token is its position's (`ssd.sampling.coupled_tokens`)
            if s.params.coupled:
                tokens[b] = coupled_tokens(probs[b:b + 1], s.params.seed, [len(s.prompt) + len(s.output)])[0]
        for b, rows in raw.items():
            batch[b].logprobs.extend(token_logprobs(rows, [tokens[b]], batch[b].params.logprobs))
        for seq, tok in zip(batch, tokens):
            if seq.params.constraint:
                self._matchers[seq.seq_id].commit([tok])
            seq.append(tok, self.eos_token_ids, self.max_len)
            if seq.finished:
                self._finish(seq)
        return batch

    def _matcher(self, seq: Sequence) -> Matcher:
        if seq.seq_id not in self._matchers:
            if self.grammar_tokenizer is None:
                raise ValueError("constraint: this engine has no grammar tokenizer (structured output is off)")
            self._matchers[seq.seq_id] = Matcher(self.grammar_tokenizer, seq.params.constraint, self.vocab_size)
        return self._matchers[seq.seq_id]

    def _admit(self) -> tuple[list[Sequence], list[int]]:
        """Waiting sequences that get a slot and the blocks for all their tokens, in arrival order. A block
        per running sequence is kept free, so that new arrivals do not force the next decode to preempt."""
        batch, cached = [], []
        while self.waiting and self.cache.free_slots:
            seq = self.waiting[0]
            tokens = seq.prompt + seq.output
            slot = self.cache.allocate()
            whole = seq.params.prompt_logprobs is not None and seq.prompt_logprobs is None   # every position
            hit = self.cache.match_prefix(slot, tokens) if self.prefix_caching and not whole else 0
            need = self.cache.blocks_needed(slot, len(tokens))
            headroom = len(self.running) + len(batch)
            if not self.cache.blocks.can_allocate(need + headroom):
                self.cache.release(slot)
                if self.prefix_caching and not whole:
                    self.cache.blocks.stats.unquery(len(tokens) - 1, hit)
                break
            self.cache.ensure(slot, len(tokens))
            seq.slot = slot
            batch.append(self.waiting.popleft())
            cached.append(hit)
        return batch, cached

    def _reserve_decode(self) -> None:
        """Map the block each running sequence writes next; preempt the latest admitted when none is free."""
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            if self.cache.blocks.can_allocate(self.cache.blocks_needed(seq.slot, seq.num_tokens)):
                self.cache.ensure(seq.slot, seq.num_tokens)
                i += 1
            else:
                self._preempt(self.running[-1])

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def _release(self, seq: Sequence) -> None:
        if self.prefix_caching:  # KV is valid for every token but the last
            self.cache.register(seq.slot, seq.prompt + seq.output, seq.num_tokens - 1)
        self.cache.release(seq.slot)
        seq.slot = -1

    def _finish(self, seq: Sequence) -> None:
        self._matchers.pop(seq.seq_id, None)
        self.running.remove(seq)
        self._release(seq)
