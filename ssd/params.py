"""Request parameters that every process understands, the router included: no torch here.

`SamplingParams` validates every field and names the field in its error. `finish_reason` decides, after a
token is committed, whether a sequence is done, and why.
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

_SEED_LIMIT = 2**64


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"SamplingParams.{name} must be {rule}, got {getattr(self, name)!r}")

        if not _is_real(self.temperature) or self.temperature < 0:
            raise bad("temperature", "a finite number >= 0")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise bad("top_k", "an int >= 0 (0 disables it)")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise bad("top_p", "a number in (0, 1]")
        if not _is_real(self.min_p) or not 0 <= self.min_p < 1:
            raise bad("min_p", "a number in [0, 1)")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < _SEED_LIMIT):
            raise bad("seed", "None or an int in [0, 2**64)")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise bad("max_tokens", "an int >= 1")
        if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(self.stop_token_ids, Collection):
            raise bad("stop_token_ids", "a sequence of ints >= 0")
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a sequence of ints >= 0")
        self.stop_token_ids = tuple(self.stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise bad("ignore_eos", "a bool")
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)
        self.min_p = float(self.min_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class FinishReason(str, Enum):
    STOP = "stop"      # a stop token id
    EOS = "eos"        # the model's end-of-sequence token
    LENGTH = "length"  # max_tokens, or the maximum sequence length
    ABORT = "abort"
    STOP_STRING = "stop_string"  # a stop string (handled where text exists: the router's front end)
    TIME_LIMIT = "time_limit"    # the request's deadline passed
    ERROR = "error"


def finish_reason(token: int, params: SamplingParams, eos_token_ids, num_output: int, num_total: int,
                  max_len: int) -> FinishReason | None:
    """Why a sequence ends after committing `token` (its `num_output`-th generated token), or None."""
    if token in params.stop_token_ids:
        return FinishReason.STOP
    if token in eos_token_ids and not params.ignore_eos:
        return FinishReason.EOS
    if num_output >= params.max_tokens or num_total >= max_len:
        return FinishReason.LENGTH
    return None


def speculation_room(k: int, params: SamplingParams, num_output: int, num_total: int, max_len: int) -> int:
    """The most tokens the next speculation may hold: a round commits up to room + 1 tokens, which must not run
    past max_len nor far past max_tokens."""
    return max(0, min(k, max_len - num_total - 1, params.max_tokens - num_output - 1))
