"""The draft's role: own the draft model and the draft KV of its sequences; speculate.

Two kinds of work, both batched over sequences:
- `jit`: decode k tokens now from the committed tokens (SD's drafting, and SSD's JIT backup on a miss).
- `speculate`: SSD's per-round work for a speculation S = (s1..sK) that the target is verifying: a glue
  forward over [last committed token, s1..sK], forks (top-F_j candidates for t* after each acceptance length
  j), then K batched steps that grow every fork into a chain of K tokens: the next speculation for outcome
  (j, t*), one `wire.CacheEntry` each (`ssd/engine/draft_branches.py`).

The draft's KV stays valid for the committed tokens; speculative KV that later turns out committed (accepted
tokens) is kept by `commit` without recomputation. Tokens are drawn from the proposal q
(`ssd.engine.proposal.draw`).

A feature-reading draft (`ssd.models.eagle`) also takes the target's features: `add` and `commit` accept a
`FeatureBlock`, kept per sequence as the input feature of each position (`ssd/engine/draft_features.py`).
Committed positions are computed from those; speculated positions read the draft's own output at the previous
position instead. KV computed before its input feature was known (speculated tokens that were then accepted)
is recomputed once the feature arrives (`fresh` marks how far KV is final).

The KV cache is paged. The branches' scratch blocks come from a pool reserved for them, mapped for the round
and given back after it, so they never take committed KV's blocks nor wait for them. A sequence starts from
the prefix cache; when committed KV runs out, the least recently used other sequence loses its KV (it is
rebuilt from its committed tokens when next used: the draft holds no state that cannot be recomputed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ssd.constraints import Constraint, Matcher
from ssd.engine import draft_grammar as grammar
from ssd.engine.draft_branches import BranchDecoding
from ssd.engine.draft_features import Chains, FeatureInputs
from ssd.engine.features import FeatureBlock
from ssd.engine.proposal import draw
from ssd.models.blocks import PrefixStats
from ssd.models.cuda_graph import graphed_forward
from ssd.models.decoder import Decoder, ForwardBatch
from ssd.models.kv_cache import DEFAULT_BLOCK_SIZE, blocks_for
from ssd.sampling import SamplingParams, coupled_tokens, make_generator, position_noise, probs_from_logits
from ssd.wire import CacheEntry

SEED_OFFSET = 0x5D_5D  # the draft's generator differs from the target's for the same request seed


@dataclass(slots=True)
class DraftParams:
    """How a sequence's proposals are drawn: temperature 0 = greedy; top_k keeps q sparse on the wire. A coupled
    sequence (`SamplingParams.coupled`) picks each token as the position-keyed Gumbel-max choice of q filtered with
    the target's top_k, top_p and min_p (`ssd.sampling.coupled_tokens`, the target's rule and noise), ships no q,
    and ranks its forks by the same noise."""
    temperature: float = 0.0
    top_k: int = 0
    saguaro_c: float = 1.0
    saguaro_f: int = 0
    seed: int | None = None
    coupled: bool = False
    top_p: float = 1.0
    min_p: float = 0.0
    constraint: Constraint | None = None   # the request's grammar: proposals are steered by it (draft_grammar)

    def __post_init__(self) -> None:
        if self.coupled and (self.seed is None or self.temperature == 0):
            raise ValueError("a coupled draft sequence needs a seed and a temperature > 0")

    @property
    def sampling(self) -> SamplingParams:
        """A coupled sequence's q rule: the target's temperature and filters."""
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)


@dataclass(slots=True)
class Speculation:
    tokens: list[int]
    proposal: list[tuple[list[int], list[float]]] | None = None


@dataclass(slots=True)
class _DraftSeq:
    tokens: list[int]
    params: DraftParams
    slot: int
    kv_len: int = 0                                   # KV valid for tokens[:kv_len]
    written: list[int] = field(default_factory=list)  # speculative tokens whose KV follows kv_len
    generator: torch.Generator | None = None
    used: int = 0                                     # last forward that used it (for eviction)
    feats: torch.Tensor | None = None                 # feature drafts: row p = input feature of position p
    nfeat: int = 0                                    # the target's features 0..nfeat-1 are known
    fresh: int = 0                                    # KV of positions < fresh was computed from known inputs
    chains: Chains | None = None                      # feature drafts: the last speculations made, with outputs
    matcher: Matcher | None = None                    # a constrained sequence's grammar state (draft_grammar)


class DraftWorker(BranchDecoding):
    """`kv_tokens` bounds committed KV (0 = every slot at full length plus one speculation); scratch blocks
    for every slot's branches are reserved on top of it."""

    def __init__(self, model: Decoder, max_seqs: int, max_len: int, k: int, fanout: list[int],
                 kv_tokens: int = 0, block_size: int = DEFAULT_BLOCK_SIZE, prefix_caching: bool = True,
                 cuda_graphs: str = "auto", grammar_tokenizer=None, min_confidence: float = 0.0):
        if len(fanout) != k + 1:
            raise ValueError(f"fanout needs K+1 = {k + 1} entries, got {fanout}")
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"min_confidence must be in [0, 1), got {min_confidence}")
        self.model, self.k, self.fanout = model, k, list(fanout)
        self.min_confidence = min_confidence
        self.last_confidence: list[float] | None = None   # `_propose`'s q(token) per row (None: not measured)
        self.confidence_stops = 0   # chains stopped short of their depth by `min_confidence`
        self.max_len = max_len
        committed = blocks_for(kv_tokens, block_size) or max_seqs * blocks_for(max_len + k + 1, block_size)
        reserved = max_seqs * (blocks_for(sum(fanout) * k, block_size) + 1)
        self.cache = model.make_cache(max_seqs, max_len, scratch=k + 1 + sum(fanout) * k,
                                      num_blocks=committed + reserved, block_size=block_size,
                                      reserved_blocks=reserved)
        if self.cache.capacity_tokens < max_len + k + 1:
            raise ValueError(f"kv_tokens={kv_tokens} cannot hold one sequence of the maximum length {max_len}")
        self.prefix_caching = prefix_caching
        self._grammar = grammar_tokenizer   # an llguidance tokenizer, or a function that makes it (on first use)
        self.forward = graphed_forward(model, self.cache, max_seqs, max(16, sum(fanout)), cuda_graphs)
        self.seqs: dict[int, _DraftSeq] = {}
        self.device = model.embed.device
        self.last_jit_step_s = 0.0
        self.last_speculate_s = 0.0
        self.evictions = 0
        self._forwards = 0
        self.feature_size = model.feature_size if getattr(model, "reads_features", False) else 0
        self.feature_inputs = FeatureInputs(self.feature_size, max_len, max_len + k + 1, model.embed.dtype,
                                            self.device)
        self.feature_rows_received = 0   # target feature rows taken by add/commit
        self.stepwise_glues = 0          # feature drafts: speculations glued one token a step (not a chain of its own)
        self._vocab_ids = model.vocab_ids if hasattr(model, "draft_logits") else None   # a draft vocabulary's ids
        self._vocab_sorted = self._vocab_ids is not None and bool((self._vocab_ids.diff() > 0).all())

    @property
    def prefix_stats(self) -> PrefixStats:
        return self.cache.blocks.stats

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.seqs

    def add(self, seq_id: int, tokens: list[int], params: DraftParams, features: FeatureBlock | None = None,
            prompt_len: int = 0) -> None:
        """Start (or rebuild) a sequence from its committed tokens; its KV is computed lazily. `prompt_len`: how
        many of `tokens` are the prompt (a constrained sequence's grammar follows the rest)."""
        self.free(seq_id)
        seed = None if params.seed is None else (params.seed + SEED_OFFSET) % 2**63
        s = _DraftSeq(list(tokens), params, self.cache.allocate(), generator=make_generator(seed))
        if params.constraint is not None:
            s.matcher = grammar.follow(self._grammar_tokenizer(), params.constraint, self.model.cfg.vocab_size,
                                       s.tokens[prompt_len or len(tokens):])
        self.seqs[seq_id] = s
        self.feature_rows_received += self.feature_inputs.take(s, features)

    def _grammar_tokenizer(self):
        if callable(self._grammar):
            self._grammar = self._grammar()
        return self._grammar

    def commit(self, seq_id: int, new_tokens: list[int], features: FeatureBlock | None = None) -> None:
        """Append newly committed tokens; KV already written for a matching speculative prefix is kept."""
        s = self.seqs[seq_id]
        self.feature_rows_received += self.feature_inputs.take(s, features)
        if s.kv_len == len(s.tokens):
            m = 0
            while m < min(len(new_tokens), len(s.written)) and new_tokens[m] == s.written[m]:
                m += 1
            s.kv_len += m
        s.tokens.extend(new_tokens)
        s.written = []
        s.matcher = grammar.advance(s.matcher, new_tokens)
        self._register(s)

    def free(self, seq_id: int) -> None:
        s = self.seqs.pop(seq_id, None)
        if s is not None:
            self._register(s)
            self.cache.release(s.slot)

    def _register(self, s: _DraftSeq) -> None:
        """Full blocks of committed tokens with KV; the last token's column may be rewritten, so not its block."""
        if self.prefix_caching:
            final = min(s.kv_len, s.fresh) if self.feature_size else s.kv_len
            self.cache.register(s.slot, s.tokens, min(final, len(s.tokens) - 1))

    def _caught_up(self, s: _DraftSeq, start: int) -> None:
        """After a forward over positions start..len(tokens)-1 from stored input features."""
        s.kv_len = len(s.tokens)
        if s.fresh >= start:
            s.fresh = min(len(s.tokens), max(start, s.nfeat + 1))

    def _map(self, seqs: list[_DraftSeq], ends: list[int]) -> None:
        """Map columns 0..end-1 of each sequence, evicting the KV of others (LRU) when blocks run out."""
        self._forwards += 1
        batch = {id(s) for s in seqs}
        for s, end in zip(seqs, ends):
            s.used = self._forwards
            need = self.cache.blocks_needed(s.slot, end)
            while not self.cache.blocks.can_allocate(need):
                others = [o for o in self.seqs.values() if id(o) not in batch and self.cache.tables[o.slot]]
                if not others:
                    raise MemoryError(f"the draft's KV cache cannot hold this batch of {len(seqs)} sequences")
                victim = min(others, key=lambda o: o.used)
                self._register(victim)
                self.cache.drop(victim.slot)
                victim.kv_len, victim.written, victim.fresh = 0, [], 0
                self.evictions += 1
            self.cache.ensure(s.slot, end)

    def _propose(self, hidden: torch.Tensor, seqs: list[_DraftSeq], positions: list[int] | None = None,
                 paths: list[list[int]] | None = None) -> tuple[list[int], list | None]:
        """Draw one token per row of the outputs `hidden` from the proposal q; return the tokens and q's sparse
        support (or None; a coupled row's entry is None). A greedy batch of a draft with its own vocabulary takes
        the argmax over that vocabulary (the lowest target id among equal maxima, as the argmax over the full one),
        never building full rows. `positions`: each row's token position (coupled rows pick with its noise);
        `paths`: each row's speculated tokens after the committed ones (a constrained row proposes within its
        grammar after them, `draft_grammar`). With `min_confidence` set, `last_confidence` holds each row's q of its
        token (the probability the draft gave its own pick; greedy: the largest) when every row is plain (neither
        coupled nor constrained), else None."""
        self.last_confidence = None
        steered = [] if paths is None else [b for b, s in enumerate(seqs) if s.matcher is not None]
        if steered and len(steered) < len(seqs):   # the others keep their fast paths (no full-vocabulary rows)
            others = [b for b in range(len(seqs)) if seqs[b].matcher is None]
            return _merge(len(seqs), [
                (steered, self._propose(hidden[steered], [seqs[b] for b in steered], _pick(positions, steered),
                                        [paths[b] for b in steered])),
                (others, self._propose(hidden[others], [seqs[b] for b in others], _pick(positions, others)))])
        allowed = grammar.proposal_rows([s.matcher for s in seqs], paths, self.model.cfg.vocab_size) \
            if steered else None
        coupled = [b for b, s in enumerate(seqs) if s.params.coupled]
        if not coupled:
            return self._propose_q(hidden, seqs, allowed)
        if positions is None:
            raise ValueError("coupled sequences need the positions of the tokens they propose")
        others = [b for b in range(len(seqs)) if not seqs[b].params.coupled]
        parts = [(coupled, (self._coupled_picks(hidden[coupled], [seqs[b] for b in coupled],
                                                [positions[b] for b in coupled],
                                                None if allowed is None else allowed[coupled]), None))]
        if others:
            parts.append((others, self._propose_q(hidden[others], [seqs[b] for b in others],
                                                  None if allowed is None else allowed[others])))
        return _merge(len(seqs), parts)

    def _coupled_q(self, hidden: torch.Tensor, seqs: list[_DraftSeq],
                   allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows of q for coupled sequences: over the draft's own vocabulary when it has one (with those ids), else
        (or when steered by a grammar, `allowed`) over the full vocabulary (ids None)."""
        small = self._vocab_ids is not None and allowed is None
        logits = self.model.draft_logits(hidden) if small else self.model.logits(hidden)
        if allowed is not None:
            logits = grammar.steer(logits, allowed)
        q = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        groups: dict = {}
        for b, s in enumerate(seqs):
            groups.setdefault((s.params.temperature, s.params.top_k, s.params.top_p, s.params.min_p), []).append(b)
        for rows in groups.values():
            q[rows] = probs_from_logits(logits[rows], seqs[rows[0]].params.sampling)
        return q, (self._vocab_ids if small else None)

    def _coupled_picks(self, hidden, seqs, positions, allowed=None) -> list[int]:
        """Each coupled row's token: the Gumbel-max choice of its q with the (seed, position) noise; over a draft
        vocabulary, with the noise the target's full rows get at those ids."""
        q, ids = self._coupled_q(hidden, seqs, allowed)
        if ids is None:
            return [coupled_tokens(q[r:r + 1], s.params.seed, [pos])[0]
                    for r, (s, pos) in enumerate(zip(seqs, positions))]
        V, cpu_ids = self.model.cfg.vocab_size, ids.cpu()
        e = torch.stack([position_noise(s.params.seed, pos, V)[cpu_ids] for s, pos in zip(seqs, positions)])
        return ids[(q.double() / e.to(q.device)).argmax(-1)].tolist()

    def _propose_q(self, hidden: torch.Tensor, seqs: list[_DraftSeq],
                   allowed: torch.Tensor | None = None) -> tuple[list[int], list | None]:
        """`_propose` for sequences that are not coupled."""
        params = [s.params for s in seqs]
        if allowed is not None:
            return draw(grammar.steer(self.model.logits(hidden), allowed), params, [s.generator for s in seqs])
        greedy = all(p.temperature == 0 for p in params)
        if greedy:
            logits = self.model.draft_logits(hidden) if self._vocab_ids is not None else self.model.logits(hidden)
            if self.min_confidence:
                self.last_confidence = torch.softmax(logits.float(), -1).amax(-1).tolist()
            if self._vocab_ids is None:
                return logits.argmax(-1).tolist(), None
            if self._vocab_sorted:   # the first maximum is the lowest id
                return self._vocab_ids[logits.argmax(-1)].tolist(), None
            top = logits == logits.max(-1, keepdim=True).values
            return torch.where(top, self._vocab_ids, self.model.cfg.vocab_size).min(-1).values.tolist(), None
        tokens, support = draw(self.model.logits(hidden), params, [s.generator for s in seqs])
        if self.min_confidence:   # a greedy row among sampled ones has the one-hot support: confidence 1
            self.last_confidence = [ps[ids.index(t)] if t in ids else 0.0 for t, (ids, ps) in zip(tokens, support)]
        return tokens, support

    def _catch_up_rows(self, seqs: list[_DraftSeq]) -> tuple[list[list[int]], list[int]]:
        """Tokens each sequence must (re)feed so its last committed token's output is computed."""
        for s in seqs:
            if self.prefix_caching and s.kv_len == 0 and not self.cache.tables[s.slot]:
                s.kv_len = s.fresh = self.cache.match_prefix(s.slot, s.tokens)
        # a feature draft recomputes KV whose input feature has arrived since it was computed
        starts = [min(s.fresh if self.feature_size and s.fresh < s.kv_len and s.nfeat >= s.fresh else s.kv_len,
                      len(s.tokens) - 1) for s in seqs]
        return [s.tokens[st:] for s, st in zip(seqs, starts)], starts

    def _groups(self, seq_ids: list) -> list[list]:
        """Consecutive groups of sequences whose committed KV fits at once (one group unless KV is short)."""
        cap = self.cache.blocks.num_blocks - self.cache.blocks.reserved
        groups, used = [[]], 0
        for i in seq_ids:
            need = blocks_for(len(self.seqs[i].tokens) + self.k + 1, self.cache.block_size)
            if groups[-1] and used + need > cap:
                groups.append([])
                used = 0
            groups[-1].append(i)
            used += need
        return groups

    def jit(self, seq_ids: list[int], k: int | None = None) -> list[Speculation]:
        """Decode k tokens now for each sequence (the speculation for its next verification)."""
        return [sp for group in self._groups(seq_ids) for sp in self._jit(group, k)]

    def check_fanout(self, fanout) -> list[int]:
        """A fan-out this draft can run instead of its own: K+1 counts >= 0 whose sum is at most its own (the
        scratch space is sized for that). Raises ValueError naming what is wrong."""
        f = list(fanout)
        if len(f) != self.k + 1 or any(not isinstance(x, int) or x < 0 for x in f):
            raise ValueError(f"fanout must be K+1 = {self.k + 1} counts >= 0, got {f}")
        if sum(f) > sum(self.fanout):
            raise ValueError(f"fanout {f} sums to {sum(f)}, more than this draft's budget {sum(self.fanout)}")
        return f

    def check_depth(self, depth) -> int:
        """A chain length this draft can grow: 1..K, or 0 for K. Raises ValueError naming what is wrong."""
        if not isinstance(depth, int) or not 0 <= depth <= self.k:
            raise ValueError(f"depth must be 0 (the draft's K) or 1..K = 1..{self.k}, got {depth}")
        return depth or self.k

    def speculate(self, items: list[tuple[int, list[int]]], fanouts: dict | None = None,
                  depths: dict | None = None) -> dict[int, list[CacheEntry]]:
        """For each (seq_id, speculation being verified): its cache entries, one per anticipated outcome (j, t*).
        `fanouts` (seq_id -> F_0..F_K, checked by `check_fanout`) replaces the draft's own for those sequences;
        `depths` (seq_id -> 1..K, checked by `check_depth`; 0 or absent: K) is the length of their chains (the K of
        their next round: a longer chain would be cut by the router, its steps spent for nothing)."""
        t0 = time.perf_counter()
        specs = dict(items)
        fans = {i: self.check_fanout(f) for i, f in (fanouts or {}).items() if i in specs}
        deep = {i: self.check_depth(d) for i, d in (depths or {}).items() if i in specs}
        out = {}
        for group in self._groups([i for i, _ in items]):
            out |= self._speculate([(i, specs[i]) for i in group], [fans.get(i, self.fanout) for i in group],
                                   [deep.get(i, self.k) for i in group])
        self.last_speculate_s = time.perf_counter() - t0
        return out

    @torch.inference_mode()
    def _jit(self, seq_ids: list[int], k: int | None = None) -> list[Speculation]:
        k = self.k if k is None else k
        seqs = [self.seqs[i] for i in seq_ids]
        k_eff = [max(0, min(k, self.max_len - len(s.tokens))) for s in seqs]
        specs = [Speculation([], [] if s.params.temperature and not s.params.coupled else None) for s in seqs]
        rows, starts = self._catch_up_rows(seqs)
        self._map(seqs, [st + len(r) + max(0, ke - 1) for st, r, ke in zip(starts, rows, k_eff)])
        t0 = time.perf_counter()
        prev = None   # feature drafts: each row's output at its last position, the next step's input feature
        along = [[] for _ in seqs]   # feature drafts: those outputs per sequence, step by step
        sure = [1.0] * len(seqs)     # with min_confidence: the product of q(token) along each chain so far
        steps = 0
        for step in range(max(k_eff, default=0)):
            active = [b for b in range(len(seqs)) if k_eff[b] > step]
            if not active:   # every chain stopped for want of confidence
                break
            steps += 1
            fb = ForwardBatch.ragged([rows[b] for b in active], [starts[b] for b in active],
                                     [seqs[b].slot for b in active], self.device)
            lengths = torch.tensor([len(rows[b]) - 1 for b in active], device=self.device)
            pick = torch.arange(len(active), device=self.device), lengths
            if self.feature_size:
                fb.features = (self.feature_inputs.inputs([seqs[b] for b in active], [rows[b] for b in active],
                                                          [starts[b] for b in active]) if step == 0
                               else prev[active][:, None])
                hidden, pre = self.forward(fb, self.cache, features=True)
                if prev is None:
                    prev = torch.zeros(len(seqs), self.feature_size, dtype=pre.dtype, device=self.device)
                out = pre[pick]
                prev[active] = out
                for r, b in enumerate(active):
                    along[b].append(out[r])
                hidden = hidden[pick]
            else:
                hidden = self.forward(fb, self.cache)[pick]
            tokens, support = self._propose(hidden, [seqs[b] for b in active],
                                            [len(seqs[b].tokens) + step for b in active],
                                            [specs[b].tokens for b in active])
            conf = self.last_confidence
            for r, b in enumerate(active):
                if step == 0:
                    self._caught_up(seqs[b], starts[b])
                else:
                    seqs[b].written.append(rows[b][0])
                if conf is not None:
                    sure[b] *= conf[r]
                    if step > 0 and sure[b] < self.min_confidence:   # the chain stops before this token
                        k_eff[b] = step
                        self.confidence_stops += 1
                        continue
                specs[b].tokens.append(tokens[r])
                if specs[b].proposal is not None:
                    specs[b].proposal.append(support[r])
                starts[b] += len(rows[b])
                rows[b] = [tokens[r]]
        if self.feature_size:   # the next round's glue reads these (`ssd.engine.draft_features.chain_inputs`)
            for s, sp, outs in zip(seqs, specs, along):
                outs = outs[:len(sp.tokens)]   # a chain stopped by min_confidence computed one output more
                s.chains = Chains(len(s.tokens) - 1, 1, {(s.tokens[-1],): (sp.tokens, torch.stack(outs))}) \
                    if outs else None
        self.last_jit_step_s = (time.perf_counter() - t0) / max(1, steps)
        return specs


def _pick(values: list | None, rows: list[int]) -> list | None:
    return None if values is None else [values[b] for b in rows]


def _merge(n: int, parts) -> tuple[list[int], list | None]:
    """`_propose`'s answer for n rows from the answers of row subsets [(rows, (tokens, support or None))]; the
    support is None only when no part has one (a row without its own support gets None)."""
    tokens: list[int] = [0] * n
    support: list | None = None
    for rows, (picked, sup) in parts:
        if sup is not None and support is None:
            support = [None] * n
        for r, b in enumerate(rows):
            tokens[b] = picked[r]
            if sup is not None:
                support[b] = sup[r]
    return tokens, support
