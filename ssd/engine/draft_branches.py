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
features) plus one single-token step per speculated token, each reading the previous step's output; a branch
reads the glue output where it forks, then its own previous output.
"""
from __future__ import annotations

import torch

from ssd.engine.forks import select_forks_batch
from ssd.models.decoder import ForwardBatch
from ssd.wire import CacheEntry


class BranchDecoding:
    """The speculation of one group of sequences; a base of `DraftWorker`, whose KV mapping (`_map`), catch-up
    (`_catch_up_rows`, `_caught_up`), proposals (`_propose`), feature inputs (`feature_inputs`) and model it
    uses."""

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
        fb.features = self.feature_inputs.inputs(seqs, rows, starts)
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
