"""A request's state inside an engine: prompt, generated tokens, sampling parameters, KV slot."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
import torch

from ssd.params import FinishReason, SamplingParams, finish_reason
from ssd.sampling import make_generator

_ids = itertools.count()


@dataclass(slots=True, eq=False)
class Sequence:
    prompt: list[int]
    params: SamplingParams
    seq_id: int = field(default_factory=lambda: next(_ids))
    output: list[int] = field(default_factory=list)
    slot: int = -1
    generator: torch.Generator | None = None
    finish_reason: FinishReason | None = None
    stats: object = None  # SpecStats for speculative engines
    logprobs: list = field(default_factory=list)   # a TokenLogprob per output token, when params.logprobs is set
    # when params.prompt_logprobs is set: None for the first prompt token, then a TokenLogprob (with rank) per token
    prompt_logprobs: list | None = None

    def __post_init__(self):
        if self.generator is None:
            self.generator = make_generator(self.params.seed)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token: int, eos_token_ids, max_len: int) -> None:
        """Commit one generated token and decide whether the sequence is done."""
        self.output.append(token)
        self.finish_reason = finish_reason(token, self.params, eos_token_ids, len(self.output), self.num_tokens,
                                           max_len)
