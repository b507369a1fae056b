"""SSD's per-round work on the draft, for a group of sequences whose speculation S = (s1..sK) the target is
verifying (`BranchDecoding`, a part of `ssd.engine.draft.DraftWorker`).

A glue forward over [last committed token, s1..sK] at their real positions (draft KV for the round, and the
draft's distribution for t* after each acceptance length j), forks (the top-F_j candidates for t*:
`ssd.engine.forks.select_forks_batch`), then K batched steps that grow every fork into a chain of K tokens:
the next speculation for outcome (j, t*), a `wire.CacheEntry`.

Branch chains of one sequence are the T queries of one forward row: each attends the committed prefix plus
s1..sj and its own chain, through an explicit mask, and writes its KV to scratch columns past the speculated
region (blocks from the pool reserved for branches, given back after the round), so committed KV is never
overwritten. A feature-reading draft runs the glue as one forward over the committed catch-up (stored input
features) and s1..sK, whose input features are the outputs of the chain that produced the speculation (a JIT's
steps or a branch's, kept as `Chains`); a speculation it did not make takes one single-token step per token
instead, each reading the previous step's output. A branch reads the glue output where it forks, then its own
previous output. A greedy round of a draft with its own vocabulary draws over that vocabulary only. A
constrained sequence forks and grows its chains within its grammar (`ssd.engine.draft_grammar`).
"""
from __future__ import annotations

import torch

from ssd.engine import draft_grammar as grammar
from ssd.engine.draft_features import Chains, chain_inputs
from ssd.engine.forks import select_forks_batch
from ssd.models.decoder import ForwardBatch
from ssd.sampling import position_noise, probs_from_logits
from ssd.wire import CacheEntry


class BranchDecoding:
    """The speculation of one group of sequences; a base of `DraftWorker`, whose KV mapping (`_map`), catch-up
    (`_catch_up_rows`, `_caught_up`), proposals (`_propose`), feature inputs (`feature_inputs`) and model it
    uses."""

    @torch.inference_mode()
    def _speculate(self, items: list[tuple[int, list[int]]], fanouts: list[list[int]],
                   depths: list[int] | None = None) -> dict[int, list[CacheEntry]]:
        """`depths`: each sequence's chain length (1..K; None: K for all)."""
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
            s.kv_len, s.written, s.chains = len(s.tokens), list(sp), None
        if any(s.params.coupled for s in seqs):
            logits = self._coupled_fork_scores(logits, seqs, specs)
        allowed = grammar.fork_rows([s.matcher for s in seqs], specs, self.model.cfg.vocab_size)
        if allowed is not None:   # constrained sequences fork only where their grammar lets t* go
            logits = logits.float().masked_fill(~allowed.to(logits.device), float("-inf"))
        forks_per_seq = select_forks_batch(logits, specs, fanouts)
        if allowed is not None:
            forks_per_seq = grammar.keep_allowed(forks_per_seq, specs, allowed)
        for s, sp, forks in zip(seqs, specs, forks_per_seq):
            self.cache.ensure(s.slot, len(s.tokens) + len(sp) + 1 + len(forks) * self.k, scratch=True)
        entries = self._grow_branches(seqs, specs, forks_per_seq, glue_feats, depths)
        for s, sp in zip(seqs, specs):
            self.cache.trim(s.slot, len(s.tokens) + len(sp))
        return {seq_id: e for (seq_id, _), e in zip(items, entries)}

    def _coupled_fork_scores(self, logits: torch.Tensor, seqs, specs) -> torch.Tensor:
        """A coupled sequence's t* after j accepted tokens is the target's Gumbel-max pick at position L + j, so its
        forks are ranked by the draft's guess of it: log q(x) - log E(x) with that position's noise (row j of its
        K_b + 1 rows). Other rows keep their logits."""
        logits = logits.float().clone()
        start, V = 0, logits.shape[1]
        for s, sp in zip(seqs, specs):
            n = len(sp) + 1
            if s.params.coupled:
                q = probs_from_logits(logits[start:start + n], s.params.sampling).double()
                e = torch.stack([position_noise(s.params.seed, len(s.tokens) + j, V) for j in range(n)])
                logits[start:start + n] = (q.log() - e.to(q.device).log()).float()
            start += n
        return logits

    def _glue_with_features(self, seqs, specs, rows, starts) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A feature draft's glue. Returns the logits rows j = 0..K_b of each sequence in order, and per sequence
        the outputs [K_b + 1, F] at those positions (a branch forking at j reads row j as its first input feature).

        A speculation this draft produced itself (a JIT, or the branch of the outcome that came) takes the inputs
        of s1..sK from the outputs that chain computed (`chain_inputs`), so the committed catch-up (stored
        features) and s1..sK are one forward. Any other (an n-gram backup, a rebuilt sequence) runs s1..sK one
        step each after the catch-up, every step reading the previous step's output."""
        B, dev = len(seqs), self.device
        known = [chain_inputs(s, sp) for s, sp in zip(seqs, specs)]   # [len(sp), F] or None
        fed = [r + sp if k is not None else r for r, sp, k in zip(rows, specs, known)]
        self._map(seqs, [st + len(r) + len(sp) for st, r, sp in zip(starts, rows, specs)])
        fb = ForwardBatch.ragged(fed, starts, [s.slot for s in seqs], dev)
        feats = self.feature_inputs.inputs(seqs, rows, starts)
        width = max(len(f) for f in fed)
        if width > feats.shape[1]:
            feats = torch.cat([feats, feats.new_zeros(B, width - feats.shape[1], feats.shape[2])], dim=1)
        for b, k in enumerate(known):
            if k is not None and len(k):
                feats[b, len(rows[b]):len(rows[b]) + len(k)] = k.to(feats.dtype)
        fb.features = feats
        hidden, pre = self.forward(fb, self.cache, features=True)
        hs, outs = [], []
        for b, k in enumerate(known):
            c0 = len(rows[b]) - 1                       # the last committed token; then s1..sK when known
            n = 1 + (len(specs[b]) if k is not None else 0)
            hs.append(list(hidden[b, c0:c0 + n]))
            outs.append(list(pre[b, c0:c0 + n]))
        for s, st in zip(seqs, starts):
            self._caught_up(s, st)
        stepwise = [b for b in range(B) if known[b] is None]
        self.stepwise_glues += sum(1 for b in stepwise if specs[b])
        for i in range(1, max((len(specs[b]) for b in stepwise), default=0) + 1):
            active = [b for b in stepwise if len(specs[b]) >= i]
            fb = ForwardBatch.ragged([[specs[b][i - 1]] for b in active],
                                     [len(seqs[b].tokens) - 1 + i for b in active], [seqs[b].slot for b in active], dev)
            fb.features = torch.stack([outs[b][-1] for b in active])[:, None]
            hidden, pre = self.forward(fb, self.cache, features=True)
            for r, b in enumerate(active):
                hs[b].append(hidden[r, 0])
                outs[b].append(pre[r, 0])
        logits = self.model.logits(torch.stack([h for row in hs for h in row]))
        return logits, [torch.stack(o) for o in outs]

    def _grow_branches(self, seqs, specs, forks_per_seq, glue_feats=None,
                       depths: list[int] | None = None) -> list[list[CacheEntry]]:
        """Batched steps, as many as the longest of `depths` (each sequence's chain length, at most K; None: K);
        row b holds all branches of sequence b as its queries. A feature draft's branch reads the glue output where
        it forks, then its own previous output. Chains are laid out K columns apart whatever their length. With
        `min_confidence`, a chain stops before its first token past the first at which the product of q(token) along
        it falls below that (`last_confidence`); the steps end early once every chain has stopped."""
        B, K = len(seqs), self.k
        depths = [K] * B if depths is None else depths
        steps = max(depths, default=K)
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
        growing = [[True] * nb[b] for b in range(B)]   # False: stopped by min_confidence
        sure = [[1.0] * nb[b] for b in range(B)]       # the product of q(token) along each chain so far
        props = [[[] for _ in range(nb[b])] for b in range(B)]
        branch_seqs = [s for b, s in enumerate(seqs) for _ in range(nb[b])]
        positions = [L[b] + j + 1 for b, f in enumerate(forks_per_seq) for j, _ in f]   # each chain's first token
        feats, outputs = None, []
        if glue_feats is not None:
            feats = torch.zeros(B, width, self.feature_size, dtype=self.model.embed.dtype, device=dev)
            for b, f in enumerate(forks_per_seq):
                if f:
                    feats[b, :len(f)] = glue_feats[b][torch.tensor([j for j, _ in f], device=dev)]
        for d in range(steps):
            cols = cols0 + d
            mask = seen | (after_start & (col <= cols[:, :, None]))
            fb = ForwardBatch(ids, (prefix + d).to(dev), slots, kv_len, valid_d, cols.to(dev), mask.to(dev))
            if feats is not None:
                fb.features = feats
                hidden, feats = self.forward(fb, self.cache, features=True)
                outputs.append(feats)   # each branch's output at its step-d input: the next round's glue input
                hidden = hidden[valid_d]
            else:
                hidden = self.forward(fb, self.cache)[valid_d]  # branches in (b, i) order
            paths = None
            if any(s.matcher is not None for s in seqs):   # each chain after its fork, for its grammar
                paths = [specs[b][:j] + [t] + chains[b][i] for b, f in enumerate(forks_per_seq)
                         for i, (j, t) in enumerate(f)]
            tokens, support = self._propose(hidden, branch_seqs, [positions[r] + d for r in range(len(positions))],
                                            paths)
            conf = self.last_confidence
            r = 0
            for b in range(B):
                for i in range(nb[b]):
                    if growing[b][i] and conf is not None:
                        sure[b][i] *= conf[r]
                        if d > 0 and sure[b][i] < self.min_confidence:   # the chain stops before this token
                            growing[b][i] = False
                            self.confidence_stops += 1
                    if growing[b][i]:
                        chains[b][i].append(tokens[r])
                        if support is not None:
                            props[b][i].append(support[r])
                    r += 1
            # only a step that measured confidence can have stopped chains: with the stop off, no scan per step
            if conf is not None and not any(g and len(chains[b][i]) < depths[b]
                                            for b in range(B) for i, g in enumerate(growing[b])):
                break   # every chain has its depth or stopped for want of confidence
            if d + 1 < steps:
                ids = ids.masked_scatter(valid_d, torch.tensor(tokens, dtype=torch.long, device=dev))
        if min(depths) < steps:   # a sequence of a shorter depth than the group's keeps its own
            for b in range(B):
                chains[b] = [c[:depths[b]] for c in chains[b]]
                props[b] = [p[:depths[b]] for p in props[b]]
        if outputs:
            along = torch.stack(outputs, dim=2)   # [B, width, steps, F]
            for b, forks in enumerate(forks_per_seq):
                table = {(*specs[b][:j], t): (chains[b][i], along[b, i, :len(chains[b][i])])
                         for i, (j, t) in enumerate(forks)}
                seqs[b].chains = Chains(L[b], len(specs[b]) + 1, table)
        out = []
        for b, forks in enumerate(forks_per_seq):
            sampled = seqs[b].params.temperature != 0 and not seqs[b].params.coupled
            out.append([CacheEntry(j, t, chains[b][i], props[b][i] if sampled else None)
                        for i, (j, t) in enumerate(forks)])
        return out
