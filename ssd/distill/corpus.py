"""Teacher data in memory: `Corpus` (the target's sequences with its feature at every position, from the
shards `ssd.distill.data` writes), the draft vocabulary they suggest (`build_vocab`) and padded batches of them
(`make_batch`), as training (`ssd.distill.train`) and evaluation (`ssd.distill.evaluate`) read them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Corpus:
    seqs: list[tuple[torch.Tensor, torch.Tensor, int, int]]  # (tokens[L] long, features[L-1, H] fp16, prompt_len, kind)

    @classmethod
    def from_shards(cls, shards: list[dict]) -> "Corpus":
        seqs = []
        for sh in shards:
            off, feats, toks = sh["offsets"], sh["features"], sh["tokens"].long()
            row = 0
            for i in range(len(off) - 1):
                a, b = int(off[i]), int(off[i + 1])
                n = b - a
                seqs.append((toks[a:b], feats[row:row + n - 1], int(sh["prompt_lens"][i]), int(sh["kinds"][i])))
                row += n - 1
        return cls(seqs)

    @property
    def tokens(self) -> int:
        return sum(len(t) for t, *_ in self.seqs)

    def to(self, device) -> "Corpus":
        """The same sequences with their tokens and features on `device` (tensors already there are not copied)."""
        return Corpus([(t.to(device), f.to(device), plen, kind) for t, f, plen, kind in self.seqs])


def build_vocab(corpus: Corpus, size: int, always: tuple[int, ...] = ()) -> tuple[torch.Tensor, float]:
    """The `size` most frequent tokens the target generated (answers only), plus `always` (EOS); returns the
    sorted ids and the share of answer tokens they cover."""
    counts = torch.zeros(max(int(t.max()) for t, *_ in corpus.seqs) + 1, dtype=torch.long)
    for toks, _, plen, _ in corpus.seqs:
        counts += torch.bincount(toks[plen:], minlength=counts.numel())[:counts.numel()]
    order = torch.argsort(counts, descending=True, stable=True).tolist()
    chosen = list(dict.fromkeys([*always, *order]))[:size]
    ids = torch.tensor(sorted(chosen), dtype=torch.long)
    cover = float(counts[ids[ids < counts.numel()]].sum()) / max(1, int(counts.sum()))
    return ids, cover


def vocab_cover(corpus: Corpus, ids: torch.Tensor) -> float:
    """The share of the corpus's answer tokens inside the draft vocabulary `ids`."""
    inside = total = 0
    for toks, _, plen, _ in corpus.seqs:
        answer = toks[plen:]
        inside += int(torch.isin(answer, ids).sum())
        total += answer.numel()
    return inside / max(1, total)


def make_batch(seqs, seq_len: int, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens [B, T], features [B, T, H] (row p = the target's feature at p), valid [B, T] (a feature
    exists at p), answer [B, T] (p is at or after the last prompt token); on `device` (default the CPU)."""
    T = min(seq_len, max(len(t) - 1 for t, *_ in seqs))
    H = seqs[0][1].shape[1]
    toks = torch.zeros(len(seqs), T, dtype=torch.long, device=device)
    feats = torch.zeros(len(seqs), T, H, dtype=torch.float32, device=device)
    valid = torch.zeros(len(seqs), T, dtype=torch.bool, device=device)
    answer = torch.zeros(len(seqs), T, dtype=torch.bool, device=device)
    for b, (t, f, plen, _) in enumerate(seqs):
        n = min(T, len(t) - 1)
        toks[b, :n] = t[:n]
        feats[b, :n] = f[:n].float()
        valid[b, :n] = True
        answer[b, max(0, plen - 1):n] = True
    return toks, feats, valid, answer
