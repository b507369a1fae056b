"""What every in-process engine shares: request intake with validation, abort, and run-to-completion."""
from __future__ import annotations

from collections import deque

from ssd.engine.sequence import FinishReason, Sequence
from ssd.sampling import SamplingParams


class Engine:
    """Subclasses set `max_len` and `vocab_size`, implement `step()` and `_finish(seq)`."""

    max_len: int
    vocab_size: int

    def __init__(self):
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add_request(self, prompt: list[int], params: SamplingParams | None = None) -> Sequence:
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        if len(prompt) >= self.max_len:
            raise ValueError(f"prompt has {len(prompt)} tokens; the maximum sequence length is {self.max_len}")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"prompt token ids must lie in [0, {self.vocab_size})")
        params = params or SamplingParams()
        if params.logit_bias and params.logit_bias[-1][0] >= self.vocab_size:
            raise ValueError(f"logit_bias token ids must lie in [0, {self.vocab_size})")
        seq = Sequence(list(prompt), params)
        self.waiting.append(seq)
        return seq

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, seq: Sequence) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self._finish(seq)
        seq.finish_reason = seq.finish_reason or FinishReason.ABORT

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None,
                 ) -> list[Sequence]:
        plist = params if isinstance(params, list) else [params] * len(prompts)
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        while self.has_unfinished():
            self.step()
        return seqs

    def step(self) -> list[Sequence]:
        raise NotImplementedError

    def _finish(self, seq: Sequence) -> None:
        raise NotImplementedError
