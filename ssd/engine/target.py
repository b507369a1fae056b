"""The target's role: own the target model and its KV cache, prefill sequences and verify speculations.

It knows nothing of drafts or caches. A sequence is added with its prompt and sampling parameters; prefill
returns the first token. `verify` takes, per sequence, a speculation (0..K tokens, and when sampling the
sparse proposal q each token was drawn from) and returns the outcome `(j, t*)`: j tokens accepted and the
token the target emits after them. The accepted tokens and t* are committed here, so the target's KV stays
valid for every committed token but the last (the next verify writes it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ssd.models.decoder import Decoder, ForwardBatch
from ssd.sampling import SamplingParams, make_generator, probs_from_logits, sample
from ssd.spec.verify import verify_greedy_batch, verify_sampling

SparseRow = tuple[list[int], list[float]]


@dataclass(slots=True)
class VerifyItem:
    seq_id: int
    tokens: list[int]                      # the speculation s1..sK (K may be 0)
    proposal: list[SparseRow] | None = None  # q per token when the request samples; None = greedy/one-hot


@dataclass(slots=True)
class Outcome:
    seq_id: int
    accepted: int   # j
    token: int      # t*


@dataclass(slots=True)
class _TargetSeq:
    tokens: list[int]
    params: SamplingParams
    slot: int
    generator: torch.Generator | None = field(default=None)


class TargetWorker:
    def __init__(self, model: Decoder, max_seqs: int, max_len: int):
        self.model = model
        self.max_len = max_len
        self.cache = model.make_cache(max_seqs, max_len)
        self.seqs: dict[int, _TargetSeq] = {}
        self.device = model.embed.device
        self.last_verify_s = 0.0

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.seqs

    @property
    def free_slots(self) -> int:
        return self.cache.free_slots

    def committed(self, seq_id: int) -> list[int]:
        return self.seqs[seq_id].tokens

    @torch.inference_mode()
    def prefill(self, requests: list[tuple[int, list[int], SamplingParams]]) -> list[int]:
        """Add sequences and return each one's first generated token."""
        new = []
        for seq_id, prompt, params in requests:
            if seq_id in self.seqs:
                raise ValueError(f"sequence {seq_id} already exists on the target")
            if not 0 < len(prompt) < self.max_len:
                raise ValueError(f"prompt length {len(prompt)} must be in 1..{self.max_len - 1}")
            seq = _TargetSeq(list(prompt), params, self.cache.allocate(), make_generator(params.seed))
            self.seqs[seq_id] = seq
            new.append(seq)
        fb = ForwardBatch.ragged([s.tokens for s in new], [0] * len(new), [s.slot for s in new], self.device)
        last = torch.tensor([len(s.tokens) - 1 for s in new], device=self.device)
        hidden = self.model(fb, self.cache)[torch.arange(len(new), device=self.device), last]
        probs = probs_from_logits(self.model.logits(hidden), [s.params for s in new])
        firsts = sample(probs, [s.generator for s in new]).tolist()
        for s, t in zip(new, firsts):
            s.tokens.append(t)
        return firsts

    def check(self, item: VerifyItem) -> str | None:
        """Why a verify item from a peer cannot be run (None when it can)."""
        seq = self.seqs.get(item.seq_id)
        if seq is None:
            return f"unknown sequence {item.seq_id}"
        vocab = self.model.cfg.vocab_size
        if any(not 0 <= t < vocab for t in item.tokens):
            return f"speculated token ids must lie in [0, {vocab})"
        if len(seq.tokens) + len(item.tokens) > self.max_len:
            return f"speculation of {len(item.tokens)} tokens runs past the maximum length {self.max_len}"
        if item.proposal is not None and not seq.params.greedy:
            if len(item.proposal) != len(item.tokens):
                return f"{len(item.proposal)} proposal rows for {len(item.tokens)} speculated tokens"
            for tok, (ids, ps) in zip(item.tokens, item.proposal):
                if any(not 0 <= i < vocab for i in ids) or tok not in ids or ps[ids.index(tok)] <= 0:
                    return "a speculated token lies outside its proposal's support"
        return None

    @torch.inference_mode()
    def restore(self, requests: list[tuple[int, list[int], SamplingParams]]) -> None:
        """Re-create sequences from all their committed tokens (another target failed): KV for all but the
        last token, nothing sampled; the next verify continues exactly where the lost target stopped."""
        new = []
        for seq_id, tokens, params in requests:
            self.free(seq_id)
            if not 1 < len(tokens) <= self.max_len:
                raise ValueError(f"restore needs 2..{self.max_len} committed tokens, got {len(tokens)}")
            seq = _TargetSeq(list(tokens), params, self.cache.allocate(), make_generator(params.seed))
            self.seqs[seq_id] = seq
            new.append(seq)
        if new:
            fb = ForwardBatch.ragged([s.tokens[:-1] for s in new], [0] * len(new), [s.slot for s in new],
                                     self.device)
            self.model(fb, self.cache)

    @torch.inference_mode()
    def verify(self, items: list[VerifyItem]) -> list[Outcome]:
        t0 = time.perf_counter()
        seqs = [self.seqs[it.seq_id] for it in items]
        for it, s in zip(items, seqs):
            if len(s.tokens) + len(it.tokens) > self.max_len:
                raise ValueError(f"sequence {it.seq_id}: speculation runs past the maximum length {self.max_len}")
        rows = [[s.tokens[-1], *it.tokens] for it, s in zip(items, seqs)]
        fb = ForwardBatch.ragged(rows, [len(s.tokens) - 1 for s in seqs], [s.slot for s in seqs], self.device)
        logits = self.model.logits(self.model(fb, self.cache))  # [B, Kmax+1, V]
        outcomes = self._outcomes(items, seqs, logits)
        for out, it, s in zip(outcomes, items, seqs):
            s.tokens.extend(it.tokens[:out.accepted])
            s.tokens.append(out.token)
        self.last_verify_s = time.perf_counter() - t0
        return outcomes

    def _outcomes(self, items, seqs, logits) -> list[Outcome]:
        B, W = logits.shape[:2]
        outcomes: list[Outcome | None] = [None] * B
        greedy = [b for b, s in enumerate(seqs) if s.params.greedy]
        if greedy:
            idx = torch.tensor(greedy, device=logits.device)
            draft = torch.zeros((len(greedy), W - 1), dtype=torch.long)
            for r, b in enumerate(greedy):
                draft[r, :len(items[b].tokens)] = torch.tensor(items[b].tokens, dtype=torch.long)
            lengths = torch.tensor([len(items[b].tokens) for b in greedy])
            j, t = verify_greedy_batch(draft, logits[idx].argmax(-1).cpu(), lengths)
            for r, b in enumerate(greedy):
                outcomes[b] = Outcome(items[b].seq_id, int(j[r]), int(t[r]))
        for b, (it, s) in enumerate(zip(items, seqs)):
            if outcomes[b] is not None:
                continue
            K = len(it.tokens)
            p = probs_from_logits(logits[b, :K + 1], s.params)
            q = it.proposal if it.proposal is not None else [([tok], [1.0]) for tok in it.tokens]
            q = [(torch.tensor(ids, dtype=torch.long), torch.tensor(ps, dtype=torch.float32)) for ids, ps in q]
            j, t = verify_sampling(torch.tensor(it.tokens, dtype=torch.long), p.cpu(), q, s.generator)
            outcomes[b] = Outcome(it.seq_id, j, t)
        return outcomes

    def free(self, seq_id: int) -> None:
        seq = self.seqs.pop(seq_id, None)
        if seq is not None:
            self.cache.release(seq.slot)
