"""The draft's role: own the draft model and the draft KV of its sequences; speculate.

Two kinds of work, both batched over sequences:
- `jit`: decode k tokens now from the committed tokens (SD's drafting, and SSD's JIT backup on a miss).
- `speculate`: SSD's per-round work for a speculation S = (s1..sK) that the target is verifying: a glue
  forward over [last committed token, s1..sK] at their real positions (draft KV for the round, and the
  draft's distribution for t* after each acceptance length j), forks (top-F_j candidates for t*), then K
  batched steps that grow every fork into a chain of K tokens: the next speculation for outcome (j, t*).

Branch chains of one sequence are the T queries of one forward row: each attends the committed prefix plus
s1..sj and its own chain, through an explicit mask, and writes its KV to scratch columns past the
speculated region, so committed KV is never overwritten. The draft's KV stays valid for the committed tokens;
speculative KV that later turns out committed (accepted tokens) is kept by `commit` without recomputation.

A feature-reading draft (`ssd.models.eagle`) also takes the target's features: `add` and `commit` accept a
`FeatureBlock`, kept per sequence as the input feature of each position (the target's feature one position
earlier; zeros where none arrived). Committed positions are computed from those; speculated positions (the
glue's s1..sK, every branch step) read the draft's own output at the previous position instead, so the glue
runs as one forward over the committed catch-up plus one single-token step per speculated token. KV computed
before its input feature was known (speculated tokens that were then accepted) is recomputed once the
feature arrives (`fresh` marks how far KV is final).

The KV cache is paged. The branches' scratch blocks come from a pool reserved for them, mapped for the round
and given back after it, so they never take committed KV's blocks nor wait for them. A sequence starts from
the prefix cache; when committed KV runs out, the least recently used other sequence loses its KV (it is
rebuilt from its committed tokens when next used: the draft holds no state that cannot be recomputed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ssd.engine.features import FeatureBlock
from ssd.models.blocks import PrefixStats
from ssd.models.cuda_graph import graphed_forward
from ssd.models.decoder import Decoder, ForwardBatch
from ssd.models.kv_cache import DEFAULT_BLOCK_SIZE, blocks_for
from ssd.sampling import SamplingParams, make_generator, sample
from ssd.engine.forks import select_forks
from ssd.engine.proposal import proposal_probs, sparse_support
from ssd.wire import CacheEntry

SEED_OFFSET = 0x5D_5D  # the draft's generator differs from the target's for the same request seed


@dataclass(slots=True)
class DraftParams:
    """How a sequence's proposals are drawn: temperature 0 = greedy; top_k keeps q sparse on the wire."""
    temperature: float = 0.0
    top_k: int = 0
    saguaro_c: float = 1.0
    saguaro_f: int = 0
    seed: int | None = None


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


class DraftWorker:
    """`kv_tokens` bounds committed KV (0 = every slot at full length plus one speculation); scratch blocks
    for every slot's branches are reserved on top of it."""

    def __init__(self, model: Decoder, max_seqs: int, max_len: int, k: int, fanout: list[int],
                 kv_tokens: int = 0, block_size: int = DEFAULT_BLOCK_SIZE, prefix_caching: bool = True,
                 cuda_graphs: str = "auto"):
        if len(fanout) != k + 1:
            raise ValueError(f"fanout needs K+1 = {k + 1} entries, got {fanout}")
        self.model, self.k, self.fanout = model, k, list(fanout)
        self.max_len = max_len
        committed = blocks_for(kv_tokens, block_size) or max_seqs * blocks_for(max_len + k + 1, block_size)
        reserved = max_seqs * (blocks_for(sum(fanout) * k, block_size) + 1)
        self.cache = model.make_cache(max_seqs, max_len, scratch=k + 1 + sum(fanout) * k,
                                      num_blocks=committed + reserved, block_size=block_size,
                                      reserved_blocks=reserved)
        if self.cache.capacity_tokens < max_len + k + 1:
            raise ValueError(f"kv_tokens={kv_tokens} cannot hold one sequence of the maximum length {max_len}")
        self.prefix_caching = prefix_caching
        self.forward = graphed_forward(model, self.cache, max_seqs, max(16, sum(fanout)), cuda_graphs)
        self.seqs: dict[int, _DraftSeq] = {}
        self.device = model.embed.device
        self.last_jit_step_s = 0.0
        self.last_speculate_s = 0.0
        self.evictions = 0
        self._forwards = 0
        self.feature_size = model.feature_size if getattr(model, "reads_features", False) else 0
        self.feature_rows_received = 0   # target feature rows taken by add/commit

    @property
    def prefix_stats(self) -> PrefixStats:
        return self.cache.blocks.stats

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.seqs

    def add(self, seq_id: int, tokens: list[int], params: DraftParams, features: FeatureBlock | None = None) -> None:
        """Start (or rebuild) a sequence from its committed tokens; its KV is computed lazily."""
        self.free(seq_id)
        seed = None if params.seed is None else (params.seed + SEED_OFFSET) % 2**63
        self.seqs[seq_id] = _DraftSeq(list(tokens), params, self.cache.allocate(), generator=make_generator(seed))
        self._take_features(self.seqs[seq_id], features)

    def commit(self, seq_id: int, new_tokens: list[int], features: FeatureBlock | None = None) -> None:
        """Append newly committed tokens; KV already written for a matching speculative prefix is kept."""
        s = self.seqs[seq_id]
        self._take_features(s, features)
        if s.kv_len == len(s.tokens):
            m = 0
            while m < min(len(new_tokens), len(s.written)) and new_tokens[m] == s.written[m]:
                m += 1
            s.kv_len += m
        s.tokens.extend(new_tokens)
        s.written = []
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

    @torch.inference_mode()   # the buffer may have been made in inference mode (a forward grew it)
    def _take_features(self, s: _DraftSeq, block: FeatureBlock | None) -> None:
        """Store the target's features block.start.. as the input features of the positions after them."""
        if block is None or not self.feature_size or block.rows.shape[0] == 0:
            return
        if block.rows.ndim != 2 or block.rows.shape[1] != self.feature_size:
            raise ValueError(f"feature rows must be [n, {self.feature_size}], got {list(block.rows.shape)}")
        end = block.start + block.rows.shape[0]
        if end > self.max_len + self.k + 1:
            raise ValueError(f"features up to position {end} run past the maximum length {self.max_len}")
        self._grow(s, end + 1)
        s.feats[block.start + 1:end + 1] = block.rows.to(s.feats.dtype)
        if block.start < s.nfeat:          # known features rewritten: KV computed from them is stale
            s.fresh = min(s.fresh, block.start + 1)
        s.nfeat = max(s.nfeat, end)
        self.feature_rows_received += block.rows.shape[0]

    @torch.inference_mode()
    def _grow(self, s: _DraftSeq, rows: int) -> None:
        have = 0 if s.feats is None else s.feats.shape[0]
        if rows > have:
            new = torch.zeros(max(rows, 2 * have, 64), self.feature_size, dtype=self.model.embed.dtype,
                              device=self.device)
            if have:
                new[:have] = s.feats
            s.feats = new

    def _input_features(self, seqs: list[_DraftSeq], rows: list[list[int]], starts: list[int]) -> torch.Tensor:
        """[B, T, F]: the stored input features of each row's positions (zeros where unknown or padding)."""
        T = max(len(r) for r in rows)
        out = torch.zeros(len(seqs), T, self.feature_size, dtype=self.model.embed.dtype, device=self.device)
        for b, (s, r, st) in enumerate(zip(seqs, rows, starts)):
            self._grow(s, st + len(r))
            out[b, :len(r)] = s.feats[st:st + len(r)]
        return out

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

    def _propose(self, logits: torch.Tensor, seqs: list[_DraftSeq]) -> tuple[list[int], list | None]:
        """Draw one token per row from the proposal q; return the tokens and q's sparse support (or None)."""
        if all(s.params.temperature == 0 for s in seqs):
            return logits.argmax(-1).tolist(), None
        groups: dict[tuple, list[int]] = {}
        for b, s in enumerate(seqs):
            p = s.params
            groups.setdefault((p.temperature, p.top_k, p.saguaro_c, p.saguaro_f), []).append(b)
        if len(groups) == 1:
            q = proposal_probs(logits, *next(iter(groups)))
        else:
            q = torch.empty_like(logits)
            for key, rows in groups.items():
                q[rows] = proposal_probs(logits[rows], *key)
        tokens = sample(q, [s.generator for s in seqs]).tolist()
        support = [(ids.tolist(), ps.tolist()) for ids, ps in sparse_support(q)]
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

    def speculate(self, items: list[tuple[int, list[int]]],
                  fanouts: dict | None = None) -> dict[int, list[CacheEntry]]:
        """For each (seq_id, speculation being verified): its cache entries, one per anticipated outcome (j, t*).
        `fanouts` (seq_id -> F_0..F_K, checked by `check_fanout`) replaces the draft's own for those sequences."""
        t0 = time.perf_counter()
        specs = dict(items)
        fans = {i: self.check_fanout(f) for i, f in (fanouts or {}).items() if i in specs}
        out = {}
        for group in self._groups([i for i, _ in items]):
            out |= self._speculate([(i, specs[i]) for i in group], [fans.get(i, self.fanout) for i in group])
        self.last_speculate_s = time.perf_counter() - t0
        return out

    @torch.inference_mode()
    def _jit(self, seq_ids: list[int], k: int | None = None) -> list[Speculation]:
        k = self.k if k is None else k
        seqs = [self.seqs[i] for i in seq_ids]
        k_eff = [max(0, min(k, self.max_len - len(s.tokens))) for s in seqs]
        specs = [Speculation([], [] if s.params.temperature else None) for s in seqs]
        rows, starts = self._catch_up_rows(seqs)
        self._map(seqs, [st + len(r) + max(0, ke - 1) for st, r, ke in zip(starts, rows, k_eff)])
        t0 = time.perf_counter()
        prev = None   # feature drafts: each row's output at its last position, the next step's input feature
        for step in range(max(k_eff, default=0)):
            active = [b for b in range(len(seqs)) if k_eff[b] > step]
            fb = ForwardBatch.ragged([rows[b] for b in active], [starts[b] for b in active],
                                     [seqs[b].slot for b in active], self.device)
            lengths = torch.tensor([len(rows[b]) - 1 for b in active], device=self.device)
            pick = torch.arange(len(active), device=self.device), lengths
            if self.feature_size:
                fb.features = (self._input_features([seqs[b] for b in active], [rows[b] for b in active],
                                                    [starts[b] for b in active]) if step == 0
                               else prev[active][:, None])
                hidden, pre = self.forward(fb, self.cache, features=True)
                if prev is None:
                    prev = torch.zeros(len(seqs), self.feature_size, dtype=pre.dtype, device=self.device)
                prev[active] = pre[pick]
                hidden = hidden[pick]
            else:
                hidden = self.forward(fb, self.cache)[pick]
            tokens, support = self._propose(self.model.logits(hidden), [seqs[b] for b in active])
            for r, b in enumerate(active):
                if step == 0:
                    self._caught_up(seqs[b], starts[b])
                else:
                    seqs[b].written.append(rows[b][0])
                specs[b].tokens.append(tokens[r])
                if specs[b].proposal is not None:
                    specs[b].proposal.append(support[r])
                starts[b] += len(rows[b])
                rows[b] = [tokens[r]]
        self.last_jit_step_s = (time.perf_counter() - t0) / max(1, max(k_eff, default=0))
        return specs

    @torch.inference_mode()
    def _speculate(self, items: list[tuple[int, list[int]]],
                   fanouts: list[list[int]]) -> dict[int, list[CacheEntry]]:
        seqs = [self.seqs[i] for i, _ in items]
        specs = [list(s) for _, s in items]
        rows, starts = self._catch_up_rows(seqs)
        glue_feats = None
        if self.feature_size:
            logits, glue_feats = self._glue_with_features(seqs, specs, rows, starts)
        else:
            rows = [r + sp for r, sp in zip(rows, specs)]
            self._map(seqs, [st + len(r) for st, r in zip(starts, rows)])
            fb = ForwardBatch.ragged(rows, starts, [s.slot for s in seqs], self.device)
            hidden = self.forward(fb, self.cache)
            # the outputs at the last committed token and at s1..sK: the draft's view of t* for j = 0..len(sp)
            picks = [(b, c) for b, sp in enumerate(specs) for c in range(len(rows[b]) - len(sp) - 1, len(rows[b]))]
            logits = self.model.logits(hidden[[b for b, _ in picks], [c for _, c in picks]])
        for s, sp in zip(seqs, specs):
            s.kv_len, s.written = len(s.tokens), list(sp)
        forks_per_seq = select_forks_batch(logits, specs, fanouts)
        for s, sp, forks in zip(seqs, specs, forks_per_seq):
            self.cache.ensure(s.slot, len(s.tokens) + len(sp) + 1 + len(forks) * self.k, scratch=True)
        entries = self._grow_branches(seqs, specs, forks_per_seq, glue_feats)
        for s, sp in zip(seqs, specs):
            self.cache.trim(s.slot, len(s.tokens) + len(sp))
        return {seq_id: e for (seq_id, _), e in zip(items, entries)}

    def _glue_with_features(self, seqs, specs, rows, starts) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A feature draft's glue: the committed catch-up in one forward (stored features), then s1..sK one
        step each, every step reading the previous step's output. Returns the logits rows j = 0..K_b of each
        sequence in order, and per sequence the outputs [K_b + 1, F] at those positions (a branch forking at
        j reads row j as its first input feature)."""
        B, dev = len(seqs), self.device
        self._map(seqs, [st + len(r) + len(sp) for st, r, sp in zip(starts, rows, specs)])
        fb = ForwardBatch.ragged(rows, starts, [s.slot for s in seqs], dev)
        fb.features = self._input_features(seqs, rows, starts)
        hidden, pre = self.forward(fb, self.cache, features=True)
        pick = torch.arange(B, device=dev), torch.tensor([len(r) - 1 for r in rows], device=dev)
        hs, outs = [[h] for h in hidden[pick]], [[o] for o in pre[pick]]
        for s, st in zip(seqs, starts):
            self._caught_up(s, st)
        for i in range(1, max((len(sp) for sp in specs), default=0) + 1):
            active = [b for b in range(B) if len(specs[b]) >= i]
            fb = ForwardBatch.ragged([[specs[b][i - 1]] for b in active],
                                     [len(seqs[b].tokens) - 1 + i for b in active], [seqs[b].slot for b in active], dev)
            fb.features = torch.stack([outs[b][-1] for b in active])[:, None]
            hidden, pre = self.forward(fb, self.cache, features=True)
            for r, b in enumerate(active):
                hs[b].append(hidden[r, 0])
                outs[b].append(pre[r, 0])
        logits = self.model.logits(torch.stack([h for row in hs for h in row]))
        return logits, [torch.stack(o) for o in outs]

    def _grow_branches(self, seqs, specs, forks_per_seq, glue_feats=None) -> list[list[CacheEntry]]:
        """K batched steps; row b holds all branches of sequence b as its queries. A feature draft's branch
        reads the glue output where it forks, then its own previous output."""
        B, K = len(seqs), self.k
        nb = [len(f) for f in forks_per_seq]
        width = max(nb, default=0)
        if width == 0:
            return [[] for _ in seqs]
        L = [len(s.tokens) for s in seqs]
        base = [L[b] + len(specs[b]) + 1 for b in range(B)]        # first scratch column
        kv_len = max(base[b] + nb[b] * K for b in range(B))
        pad = [[0] * (width - n) for n in nb]
        prefix = torch.tensor([[L[b] + j for j, _ in f] + pad[b] for b, f in enumerate(forks_per_seq)],
                              dtype=torch.long)                     # columns [0, L + j) are visible
        ids = torch.tensor([[t for _, t in f] + pad[b] for b, f in enumerate(forks_per_seq)], dtype=torch.long)
        valid = torch.tensor([[True] * n + [False] * (width - n) for n in nb])
        cols0 = torch.tensor(base)[:, None] + torch.arange(width)[None, :] * K   # chain start column per branch
        col = torch.arange(kv_len)[None, None, :]
        # what every step sees: the prefix, and padding queries one column (no empty softmax)
        seen = (col < prefix[:, :, None]) | (~valid[:, :, None] & (col == 0))
        after_start = col >= cols0[:, :, None]
        dev = self.device
        slots, valid_d, ids = torch.tensor([s.slot for s in seqs], device=dev), valid.to(dev), ids.to(dev)
        chains = [[[] for _ in range(nb[b])] for b in range(B)]
        props = [[[] for _ in range(nb[b])] for b in range(B)]
        branch_seqs = [s for b, s in enumerate(seqs) for _ in range(nb[b])]
        feats = None
        if glue_feats is not None:
            feats = torch.zeros(B, width, self.feature_size, dtype=self.model.embed.dtype, device=dev)
            for b, f in enumerate(forks_per_seq):
                if f:
                    feats[b, :len(f)] = glue_feats[b][torch.tensor([j for j, _ in f], device=dev)]
        for d in range(K):
            cols = cols0 + d
            mask = seen | (after_start & (col <= cols[:, :, None]))
            fb = ForwardBatch(ids, (prefix + d).to(dev), slots, kv_len, valid_d, cols.to(dev), mask.to(dev))
            if feats is not None:
                fb.features = feats
                hidden, feats = self.forward(fb, self.cache, features=True)
                hidden = hidden[valid_d]
            else:
                hidden = self.forward(fb, self.cache)[valid_d]  # branches in (b, i) order
            tokens, support = self._propose(self.model.logits(hidden), branch_seqs)
            r = 0
            for b in range(B):
                for i in range(nb[b]):
                    chains[b][i].append(tokens[r])
                    if support is not None:
                        props[b][i].append(support[r])
                    r += 1
            if d + 1 < K:
                ids = ids.masked_scatter(valid_d, torch.tensor(tokens, dtype=torch.long, device=dev))
        out = []
        for b, forks in enumerate(forks_per_seq):
            sampled = seqs[b].params.temperature != 0
            out.append([CacheEntry(j, t, chains[b][i], props[b][i] if sampled else None)
                        for i, (j, t) in enumerate(forks)])
        return out


def select_forks_batch(logits: torch.Tensor, specs: list[list[int]],
                       fanouts: list[list[int]]) -> list[list[tuple[int, int]]]:
    """`select_forks` for every sequence at once (logits: the K_b + 1 rows of each sequence, in order; fanouts:
    each sequence's F_0..F_K), with one top-k over all rows. A row whose top-n boundary is tied goes to
    `select_forks`, whose tie rule decides."""
    V = logits.shape[1]
    counts, excluded, owner = [], [], []
    for b, sp in enumerate(specs):
        fanout = fanouts[b]
        fan = fanout[:len(sp)] + [fanout[-1]]
        for j, f in enumerate(fan):
            counts.append(min(f, V - (1 if j < len(sp) else 0)))
            excluded.append(sp[j] if j < len(sp) else -1)
            owner.append((b, j))
    scores = logits.float()
    if not counts or max(counts) == 0:
        return [[] for _ in specs]
    rows = [r for r, t in enumerate(excluded) if t >= 0]
    masked = scores.clone()
    masked[rows, [excluded[r] for r in rows]] = float("-inf")
    width = min(max(counts) + 1, V)
    values, indices = masked.topk(width, dim=1)
    n_t = torch.tensor(counts, device=logits.device)
    at = (n_t - 1).clamp(min=0)[:, None]
    last = values.gather(1, at)[:, 0]
    nxt = values.gather(1, n_t.clamp(max=width - 1)[:, None])[:, 0]
    tied = ((n_t < width) & (last == nxt)) | torch.isinf(last) | torch.isnan(last)
    out: list[list[tuple[int, int]]] = [[] for _ in specs]
    slow: set[int] = {owner[r][0] for r in tied.nonzero()[:, 0].tolist() if counts[r] > 0}
    for r, n in enumerate(counts):
        b, j = owner[r]
        if n == 0 or b in slow:
            continue
        chosen = indices[r, :n].sort().values
        order = scores[r, chosen].sort(descending=True, stable=True).indices
        out[b].extend((j, t) for t in chosen[order].tolist())
    start = 0
    for b, sp in enumerate(specs):
        if b in slow:
            fan = fanouts[b][:len(sp)] + [fanouts[b][-1]]
            out[b] = select_forks(logits[start:start + len(sp) + 1], torch.tensor(sp, dtype=torch.long), fan)
        start += len(sp) + 1
    return out


def draft_params_for(params: SamplingParams, top_k: int = 0, saguaro_c: float = 1.0,
                     saguaro_f: int = 0) -> DraftParams:
    """The draft samples at the request's temperature; greedy requests get a greedy draft."""
    if params.greedy:
        return DraftParams(seed=params.seed)
    return DraftParams(params.temperature, top_k, saguaro_c, saguaro_f, params.seed)
