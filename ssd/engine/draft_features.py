"""A feature-reading draft's inputs (`ssd.models.eagle`): the target's features, kept per sequence as the input
feature of each position (`FeatureInputs`, used by `ssd.engine.draft.DraftWorker`).

Row p of a sequence's `feats` is the input feature of position p: the target's feature at p-1 (zeros where none
arrived). `nfeat` counts the target's features known (0..nfeat-1), and `fresh` how far the sequence's KV was
computed from known inputs: a block that rewrites known features pulls `fresh` back, so the KV computed from the
old ones is recomputed (`DraftWorker._catch_up_rows`). Committed positions are computed from these inputs;
speculated positions read the draft's own output at the previous position instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ssd.engine.features import FeatureBlock


class FeatureInputs:
    """The per-sequence input features of a draft reading `size` values per row (0: it reads none), up to
    position `end` (its maximum length `max_len` plus one speculation), in `dtype` on `device`."""

    def __init__(self, size: int, max_len: int, end: int, dtype: torch.dtype, device: torch.device):
        self.size, self.max_len, self.end, self.dtype, self.device = size, max_len, end, dtype, device

    @torch.inference_mode()   # the buffer may have been made in inference mode (a forward grew it)
    def take(self, s, block: FeatureBlock | None) -> int:
        """Store the target's features block.start.. in sequence `s` as the input features of the positions after
        them; returns the rows taken. ValueError (and nothing changed) for rows of the wrong shape or past `end`."""
        if block is None or not self.size or block.rows.shape[0] == 0:
            return 0
        if block.rows.ndim != 2 or block.rows.shape[1] != self.size:
            raise ValueError(f"feature rows must be [n, {self.size}], got {list(block.rows.shape)}")
        end = block.start + block.rows.shape[0]
        if end > self.end:
            raise ValueError(f"features up to position {end} run past the maximum length {self.max_len}")
        self.grow(s, end + 1)
        s.feats[block.start + 1:end + 1] = block.rows.to(s.feats.dtype)
        if block.start < s.nfeat:          # known features rewritten: KV computed from them is stale
            s.fresh = min(s.fresh, block.start + 1)
        s.nfeat = max(s.nfeat, end)
        return block.rows.shape[0]

    @torch.inference_mode()
    def grow(self, s, rows: int) -> None:
        """Room for at least `rows` input features in `s.feats` (zeros beyond what it held)."""
        have = 0 if s.feats is None else s.feats.shape[0]
        if rows > have:
            new = torch.zeros(max(rows, 2 * have, 64), self.size, dtype=self.dtype, device=self.device)
            if have:
                new[:have] = s.feats
            s.feats = new

    def inputs(self, seqs: list, rows: list[list[int]], starts: list[int]) -> torch.Tensor:
        """[B, T, F]: the stored input features of each row's positions (zeros where unknown or padding)."""
        T = max(len(r) for r in rows)
        out = torch.zeros(len(seqs), T, self.size, dtype=self.dtype, device=self.device)
        for b, (s, r, st) in enumerate(zip(seqs, rows, starts)):
            self.grow(s, st + len(r))
            out[b, :len(r)] = s.feats[st:st + len(r)]
        return out


@dataclass(slots=True)
class Chains:
    """The speculations a feature draft produced for one sequence in its last round or JIT, with its outputs along
    each. A chain is the continuation for the committed tokens [start:] being `after` (s1..sj, t* for a branch of
    outcome (j, t*); the last committed token for a JIT); `table[after]` = (its tokens c1..cn, its outputs [n, F]:
    row 0 at the last token of `after`, row d at c_d), so row d is the input feature of c_(d+1)."""
    start: int
    span: int                                          # the longest `after`
    table: dict[tuple[int, ...], tuple[list[int], torch.Tensor]]


def chain_inputs(s, spec: list[int]) -> torch.Tensor | None:
    """The input features of `spec` in sequence `s` ([len(spec), F]) when `spec` follows a chain this draft made
    for the tokens committed since, else None."""
    c = s.chains
    if c is None or not spec or not 0 < len(s.tokens) - c.start <= c.span:
        return None
    found = c.table.get(tuple(s.tokens[c.start:]))
    if found is None or found[0][:len(spec)] != spec or len(found[1]) < len(spec):
        return None
    return found[1][:len(spec)]
