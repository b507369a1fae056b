"""The target's role: own the target model and its KV cache, prefill sequences and verify speculations.

It knows nothing of drafts or caches. A sequence is added with its prompt and sampling parameters; prefill
returns the first token. A sequence's penalties and biases apply to every position a verify computes, as if the
drafted tokens before it were committed (`ssd.sampling.penalize`), so the outcome is the one autoregressive
decoding would give. `verify` takes, per sequence, a speculation (a `wire.VerifyItem`: 0..K tokens, and
when sampling the sparse proposal q each token was drawn from; None: greedy, one-hot) and returns its
`wire.Outcome` `(j, t*)`: j tokens accepted and the token the target emits after them. Items and outcomes name
the sequence by the worker's own key (`seq`: whatever `prefill` added it as; the handler uses (peer, seq)). The
accepted tokens and t* are committed here, so the target's KV stays valid for every committed token but the
last (the next verify writes it).

A constrained sequence (`SamplingParams.constraint`) keeps a grammar `Matcher` advanced by its committed output:
each position a prefill or verify computes is masked to the grammar (-inf outside it, after the penalties) along
the drafted tokens, so a drafted token outside the grammar has p = 0 and is rejected, and what is verified is the
masked distribution autoregressive decoding samples from (`ssd.engine.ar`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ssd.constraints import Matcher
from ssd.models.blocks import PrefixStats
from ssd.models.cuda_graph import graphed_forward
from ssd.models.decoder import Decoder, ForwardBatch
from ssd.models.kv_cache import DEFAULT_BLOCK_SIZE, blocks_for, default_kv_tokens
from ssd.engine.features import FeatureBlock
from ssd.sampling import (SamplingParams, coupled_tokens, make_generator, penalize, probs_from_logits, sample,
                          token_logprobs)
from ssd.spec.check import speculation_problem
from ssd.engine.verify import verify_greedy_batch, verify_sampling
from ssd.wire import Outcome, VerifyItem


def constrain(logits: torch.Tensor, masks) -> torch.Tensor:
    """`logits[T, V]` with -inf outside each row's allowed tokens (`masks`: [T, V] bool, a `Matcher`'s)."""
    allowed = torch.from_numpy(masks).to(logits.device)
    return logits.masked_fill(~allowed, float("-inf"))


@dataclass(slots=True)
class _TargetSeq:
    tokens: list[int]
    params: SamplingParams
    slot: int
    prompt_len: int                 # tokens[:prompt_len] are the prompt, the rest its output (for penalties)
    generator: torch.Generator | None = field(default=None)
    kv: int = 0     # tokens[:kv] have KV in the cache (0 after preemption: recomputed when next used)
    used: int = 0   # the last forward that used it (preemption takes the least recently used first)
    matcher: Matcher | None = None   # the constraint's grammar state after tokens[prompt_len:]
    whole: bool = False   # its prefill computes every prompt position (prompt logprobs): no prefix-cache lookup


class TargetWorker:
    """`kv_tokens` bounds the KV cache (0 = `default_kv_tokens`: every slot at full length, within a default
    budget); it must hold one sequence of `max_len`. When a forward needs more blocks than are free, sequences
    outside it are preempted (their KV dropped, recomputed when next verified) and a batch that still does not
    fit runs in chunks. Full blocks of committed tokens are shared through the prefix cache."""

    def __init__(self, model: Decoder, max_seqs: int, max_len: int, kv_tokens: int = 0,
                 block_size: int = DEFAULT_BLOCK_SIZE, prefix_caching: bool = True, cuda_graphs: str = "auto",
                 grammar_tokenizer=None):
        self.model = model
        self._grammar = grammar_tokenizer   # an llguidance tokenizer, or a function that makes it (on first use)
        self.max_len = max_len
        if 0 < kv_tokens < max_len:   # checked before anything is allocated
            raise ValueError(f"a KV cache of {kv_tokens} tokens (--kv-tokens) cannot hold one full context of "
                             f"{max_len} tokens (--max-len); raise --kv-tokens or lower --max-len")
        kv_tokens = kv_tokens or default_kv_tokens(max_seqs, max_len)
        self.cache = model.make_cache(max_seqs, max_len, num_blocks=blocks_for(kv_tokens, block_size),
                                      block_size=block_size)
        self.prefix_caching = prefix_caching
        self.forward = graphed_forward(model, self.cache, max_seqs, mode=cuda_graphs)
        self.seqs: dict[int, _TargetSeq] = {}
        self.device = model.embed.device
        self.last_verify_s = 0.0
        self.prefill_tokens = 0    # prompt tokens run through the model (prefix-cache hits excluded)
        self.recomputed_tokens = 0  # tokens run again after a preemption
        self.preemptions = 0
        self._forwards = 0
        self.last_features: dict = {}   # seq_id -> FeatureBlock of the last prefill/verify (with features=True)
        self.last_logprobs: dict = {}   # seq_id -> [TokenLogprob] of the tokens the last prefill/verify committed
        self.last_prompt_logprobs: dict = {}   # seq_id -> [TokenLogprob] of prompt tokens 1.., of the last prefill

    def _grammar_tokenizer(self):
        if self._grammar is None:
            raise ValueError("constraint: this target has no grammar tokenizer (structured output is off)")
        if callable(self._grammar):
            self._grammar = self._grammar()
        return self._grammar

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.seqs

    @property
    def free_slots(self) -> int:
        return self.cache.free_slots

    @property
    def prefix_stats(self) -> PrefixStats:
        return self.cache.blocks.stats

    def committed(self, seq_id: int) -> list[int]:
        return self.seqs[seq_id].tokens

    @torch.inference_mode()
    def prefill(self, requests: list[tuple[int, list[int], SamplingParams]], features: bool = False) -> list[int]:
        """Add sequences and return each one's first generated token. With `features`, `last_features` holds
        the features of the prompt positions this call computed (prefix-cache hits are not recomputed). A
        sequence whose params ask for `prompt_logprobs` skips the prefix cache, so this forward computes every
        prompt position; `last_prompt_logprobs` holds them (a TokenLogprob per prompt token after the first)."""
        new = self._add(requests, lambda n: 0 < n < self.max_len, "prompt length {n} must be in 1..{m}")
        for s in new:
            s.whole = s.params.prompt_logprobs is not None
        hidden, blocks = self._run([(s, []) for s in new], prefill=True, features=features)
        self.last_features = {seq_id: blk for (seq_id, *_), blk in zip(requests, blocks)}
        self.last_prompt_logprobs = {}
        for b, s in enumerate(new):
            if s.whole:   # hidden[b] holds every prompt position: row i predicts token i + 1
                rows = self.model.logits(hidden[b][:-1])
                self.last_prompt_logprobs[requests[b][0]] = token_logprobs(rows, s.tokens[1:len(hidden[b])],
                                                                           s.params.prompt_logprobs, ranks=True)
                hidden[b], s.whole = hidden[b][-1:], False
        logits = self.model.logits(torch.cat(hidden))
        raw = {b: logits[b:b + 1] for b, s in enumerate(new) if s.params.logprobs is not None}
        if any(s.params.penalized or s.matcher for s in new):
            logits = logits.float().clone()
            for b, s in enumerate(new):
                if s.params.penalized:
                    logits[b] = self._penalize(s, logits[b:b + 1], [])[0]
                if s.matcher:
                    logits[b:b + 1] = constrain(logits[b:b + 1], s.matcher.masks())
        probs = probs_from_logits(logits, [s.params for s in new])
        firsts = sample(probs, [s.generator for s in new]).tolist()
        for b, s in enumerate(new):   # a coupled row's token is its position's (consumes no stream)
            if s.params.coupled:
                firsts[b] = coupled_tokens(probs[b:b + 1], s.params.seed, [len(s.tokens)])[0]
        self.last_logprobs = {requests[b][0]: token_logprobs(rows, [firsts[b]], new[b].params.logprobs)
                              for b, rows in raw.items()}
        for s, t in zip(new, firsts):
            s.tokens.append(t)
            if s.matcher:
                s.matcher.commit([t])
        return firsts

    def _add(self, requests, ok, problem) -> list[_TargetSeq]:
        new = []
        vocab = self.model.cfg.vocab_size
        for _, tokens, params, *prompt_len in requests:
            if not ok(len(tokens)):
                raise ValueError(problem.format(n=len(tokens), m=self.max_len - 1, M=self.max_len))
            if not 0 < (prompt_len or [len(tokens)])[0] <= len(tokens):
                raise ValueError(f"prompt length must be in 1..{len(tokens)}, got {prompt_len[0]}")
            if params.logit_bias and params.logit_bias[-1][0] >= vocab:
                raise ValueError(f"logit_bias token ids must lie in [0, {vocab})")
        matchers = [Matcher(self._grammar_tokenizer(), params.constraint, vocab) if params.constraint else None
                    for _, _, params, *_ in requests]   # compiled first: a bad grammar adds nothing
        for (seq_id, tokens, params, *prompt_len), matcher in zip(requests, matchers):
            if seq_id in self.seqs:
                raise ValueError(f"sequence {seq_id} already exists on the target")
            seq = _TargetSeq(list(tokens), params, self.cache.allocate(), (prompt_len or [len(tokens)])[0],
                             make_generator(params.seed), matcher=matcher)
            if matcher:
                matcher.commit(seq.tokens[seq.prompt_len:])
            self.seqs[seq_id] = seq
            new.append(seq)
        return new

    def _run(self, pairs: list[tuple[_TargetSeq, list[int]]], prefill: bool = False,
             features: bool = False) -> tuple[list[torch.Tensor], list[FeatureBlock]]:
        """Forward each sequence's tokens without KV plus `extra` speculated tokens; returns, per pair, the
        hidden states of its last committed token and the extra ones (of all its tokens when it is `whole`: a
        whole sequence has no KV, so all are computed). Runs in chunks of whole sequences when KV is short. With
        `features`, also per pair the pre-norm hidden states of every position computed (else no blocks)."""
        out: list[torch.Tensor] = []
        blocks: list[FeatureBlock] = []
        i = 0
        while i < len(pairs):
            j = self._fit(pairs, i)
            chunk = pairs[i:j]
            self._forwards += 1
            rows = [s.tokens[s.kv:] + extra for s, extra in chunk]
            fb = ForwardBatch.ragged(rows, [s.kv for s, _ in chunk], [s.slot for s, _ in chunk], self.device)
            hidden = self.forward(fb, self.cache, features=features)
            if features:
                hidden, pre = hidden
            for r, (s, extra) in enumerate(chunk):
                n = len(rows[r])
                m = n if s.whole else len(extra) + 1
                out.append(hidden[r, n - m:n])
                if features:
                    blocks.append(FeatureBlock(s.kv, pre[r, :n].to(torch.float16)))
                fresh = len(s.tokens) - s.kv
                if prefill:
                    self.prefill_tokens += fresh
                else:
                    self.recomputed_tokens += fresh - 1
                s.kv, s.used = len(s.tokens), self._forwards
                if self.prefix_caching:
                    self.cache.register(s.slot, s.tokens, s.kv)
            i = j
        return out, blocks

    def _fit(self, pairs, i: int) -> int:
        """Map blocks for pairs[i:j] with j as large as possible (at least i+1), preempting others."""
        chunk: set[int] = set()
        later = {id(s): n for n, (s, _) in enumerate(pairs[i:])}
        for k in range(i, len(pairs)):
            s, extra = pairs[k]
            chunk.add(id(s))
            if s.kv == 0 and not self.cache.tables[s.slot] and self.prefix_caching and not s.whole:
                s.kv = self.cache.match_prefix(s.slot, s.tokens)
            need = self.cache.blocks_needed(s.slot, len(s.tokens) + len(extra))
            while not self.cache.blocks.can_allocate(need):
                victim = self._victim(chunk, later)
                if victim is None:
                    if k == i:
                        raise MemoryError(f"the KV cache cannot hold one sequence of {len(s.tokens)} tokens")
                    return k
                self._preempt(victim)
            self.cache.ensure(s.slot, len(s.tokens) + len(extra))
        return len(pairs)

    def _victim(self, chunk: set[int], later: dict[int, int]) -> _TargetSeq | None:
        """Least recently used among sequences this call does not need, then the last pending one."""
        best, best_key = None, None
        for s in self.seqs.values():
            if id(s) in chunk or not self.cache.tables[s.slot]:
                continue
            key = (1, -later[id(s)]) if id(s) in later else (0, s.used)
            if best_key is None or key < best_key:
                best, best_key = s, key
        return best

    def _preempt(self, s: _TargetSeq) -> None:
        if self.prefix_caching:
            self.cache.register(s.slot, s.tokens, s.kv)
        self.cache.drop(s.slot)
        s.kv = 0
        self.preemptions += 1

    def check(self, item: VerifyItem) -> str | None:
        """Why a verify item from a peer cannot be run (None when it can)."""
        seq = self.seqs.get(item.seq)
        if seq is None:
            return f"unknown sequence {item.seq}"
        if len(seq.tokens) + len(item.tokens) > self.max_len:
            return f"speculation of {len(item.tokens)} tokens runs past the maximum length {self.max_len}"
        return speculation_problem(item.tokens, item.proposal if seq.params.needs_proposal else None,
                                   self.model.cfg.vocab_size)

    def restore(self, requests: list[tuple[int, list[int], SamplingParams, int]]) -> None:
        """Re-create sequences from all their committed tokens (another target failed), nothing sampled; each
        request is (seq_id, tokens, params, prompt length). Their KV (all but the last token) is computed by the
        next verify, which continues exactly where the lost target stopped."""
        for _, tokens, *_ in requests:
            if not 1 < len(tokens) <= self.max_len:
                raise ValueError(f"restore needs 2..{self.max_len} committed tokens, got {len(tokens)}")
        for seq_id, *_ in requests:
            self.free(seq_id)
        self._add(requests, lambda n: True, "")

    @torch.inference_mode()
    def verify(self, items: list[VerifyItem], features: bool = False) -> list[Outcome]:
        """Verify each item's speculation. With `features`, `last_features` holds each sequence's features
        from this call up to its last accepted token (from wherever its KV had to be recomputed)."""
        t0 = time.perf_counter()
        seqs = [self.seqs[it.seq] for it in items]
        for it, s in zip(items, seqs):
            if len(s.tokens) + len(it.tokens) > self.max_len:
                raise ValueError(f"sequence {it.seq}: speculation runs past the maximum length {self.max_len}")
        hidden, blocks = self._run([(s, list(it.tokens)) for it, s in zip(items, seqs)], features=features)
        outcomes = self._outcomes(items, seqs, self._row_logits(hidden))
        # each block through the last accepted token
        self.last_features = {out.seq: FeatureBlock(blk.start, blk.rows[:len(s.tokens) + out.accepted - blk.start])
                              for out, s, blk in zip(outcomes, seqs, blocks)}
        for out, it, s in zip(outcomes, items, seqs):
            s.tokens.extend(it.tokens[:out.accepted])
            s.tokens.append(out.token)
            if s.matcher:
                s.matcher.commit(list(it.tokens[:out.accepted]) + [out.token])
            if s.kv:   # 0: a later chunk of this call preempted it, so its KV is gone and is recomputed next time
                s.kv += out.accepted
        self.last_verify_s = time.perf_counter() - t0
        return outcomes

    def _row_logits(self, hidden: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each sequence's logits, [its rows, V]: views of one output-layer product over the real rows of all.
        Never a batch padded to its longest row: in a verify of one sequence at K = 3 among fifteen at K = 0 the
        padded product computed 64 rows for 19 real ones, and its [16, 4, V] result cost a 12 MB fill on top."""
        flat = self.model.logits(torch.cat(hidden))
        return list(flat.split([h.shape[0] for h in hidden]))

    @staticmethod
    def _penalize(s: _TargetSeq, logits: torch.Tensor, drafted: list[int]) -> torch.Tensor:
        """The sequence's penalties and biases on the logits of the positions after its tokens and each prefix of
        `drafted`. The router names every token that ends the sequence in its stop ids (EOS included), so those
        are what `min_tokens` masks."""
        return penalize(logits, s.params, s.tokens, s.prompt_len, s.params.stop_token_ids, drafted)

    def _outcomes(self, items, seqs, logits: list[torch.Tensor]) -> list[Outcome]:
        """`logits[b]`: sequence b's rows, [K + 1, V] (its last committed token's and each drafted one's)."""
        raw = {b: logits[b] for b, s in enumerate(seqs)
               if s.params.logprobs is not None}   # logprobs are of the raw logits: kept apart from the penalties
        outcomes = self._decide(items, seqs, logits)
        self.last_logprobs = {}
        for b, rows in raw.items():
            out, drafted = outcomes[b], list(items[b].tokens)
            self.last_logprobs[out.seq] = token_logprobs(rows[:out.accepted + 1], drafted[:out.accepted] + [out.token],
                                                         seqs[b].params.logprobs)
        return outcomes

    def _decide(self, items, seqs, logits: list[torch.Tensor]) -> list[Outcome]:
        if any(s.params.penalized or s.matcher for s in seqs):
            logits = [rows.float().clone() if s.params.penalized or s.matcher else rows
                      for rows, s in zip(logits, seqs)]
            for b, (it, s) in enumerate(zip(items, seqs)):
                if s.params.penalized:
                    logits[b] = self._penalize(s, logits[b], list(it.tokens))
                if s.matcher:
                    logits[b] = constrain(logits[b], s.matcher.masks(list(it.tokens)))
        B, W = len(logits), max(len(it.tokens) for it in items) + 1
        outcomes: list[Outcome | None] = [None] * B
        # greedy and coupled rows: accept while the drafted token is the target's own pick (the argmax, or the
        # position-keyed Gumbel-max token of the distribution), then emit the target's pick
        greedy = [b for b, s in enumerate(seqs) if not s.params.needs_proposal]
        if greedy:
            rows = [list(items[b].tokens) for b in greedy]
            draft = torch.tensor([r + [0] * (W - 1 - len(r)) for r in rows], dtype=torch.long).view(len(rows), W - 1)
            lengths = torch.tensor([len(r) for r in rows])
            # per sequence's rows (no copy of the logits), brought over in one transfer
            argmax = torch.cat([logits[b].argmax(-1) for b in greedy]).cpu().split([len(r) + 1 for r in rows])
            picks = torch.zeros(len(greedy), W, dtype=torch.long)
            for r, b in enumerate(greedy):
                s, K = seqs[b], len(items[b].tokens)
                if s.params.coupled:
                    p = probs_from_logits(logits[b], s.params)
                    picks[r, :K + 1] = torch.tensor(coupled_tokens(p, s.params.seed, range(len(s.tokens),
                                                                                          len(s.tokens) + K + 1)))
                else:
                    picks[r, :K + 1] = argmax[r]
            j, t = verify_greedy_batch(draft, picks, lengths)
            for r, b in enumerate(greedy):
                outcomes[b] = Outcome(items[b].seq, int(j[r]), int(t[r]))
        for b, (it, s) in enumerate(zip(items, seqs)):
            if outcomes[b] is not None:
                continue
            p = probs_from_logits(logits[b], s.params)
            q = it.proposal if it.proposal is not None else [([tok], [1.0]) for tok in it.tokens]
            q = [(torch.tensor(ids, dtype=torch.long), torch.tensor(ps, dtype=torch.float32)) for ids, ps in q]
            j, t = verify_sampling(torch.tensor(it.tokens, dtype=torch.long), p.cpu(), q, s.generator)
            outcomes[b] = Outcome(it.seq, j, t)
        return outcomes

    def free(self, seq_id: int) -> None:
        seq = self.seqs.pop(seq_id, None)
        if seq is not None:
            if self.prefix_caching:
                self.cache.register(seq.slot, seq.tokens, seq.kv)
            self.cache.release(seq.slot)
