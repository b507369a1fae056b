"""Request parameters that every process understands, the router included: no torch here.

`SamplingParams` validates every field and names the field in its error. `finish_reason` decides, after a
token is committed, whether a sequence is done, and why; `ending_tokens` is what ends it (what `min_tokens`
holds back).

Penalties and biases (OpenAI's and vLLM's, applied by `ssd.sampling.penalize` to the logits of every position the
target computes, in this order): `logit_bias` adds to the logits of its token ids; `min_tokens` masks the
ending tokens while fewer tokens have been generated; `repetition_penalty` (Hugging Face's rule) divides a
positive logit and multiplies a negative one by it for every token of the prompt or the output so far;
`frequency_penalty` subtracts itself times a token's count in the output so far, `presence_penalty` itself once
for every token in the output so far.

Seeds (`seed`, `seed_stream`): a seeded sampled request by default draws every position's token from the seed and
the position alone (`coupled`: the Gumbel-max rule of `ssd.sampling.coupled_tokens`, which draft and target share),
so it returns the same tokens in every mode, at any K and load; `seed_stream` instead seeds one random stream per
request (rejection sampling's draws, reproducible only for one mode and K).

`logprobs` (None = off; N in 0..MAX_LOGPROBS) asks for each generated token's log-probability under the target
(the log-softmax of its raw logits, before temperature, penalties or truncation, in float32) and its N most
probable alternatives: a `TokenLogprob` per token. `prompt_logprobs` (the same bounds) asks the same of the
prompt: for every prompt token after the first, its log-probability given the tokens before it, computed by the
prefill itself (which then skips the prefix cache, so every prompt position has logits).
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

from ssd.constraints import Constraint

_SEED_LIMIT = 2**64
PENALTY_RANGE = (-2.0, 2.0)             # presence_penalty, frequency_penalty (OpenAI's)
REPETITION_RANGE = (0.01, 100.0)        # repetition_penalty (1 = off); the bounds keep logits finite
LOGIT_BIAS_RANGE = (-100.0, 100.0)      # each logit_bias value (OpenAI's)
MAX_LOGPROBS = 20                        # alternatives per token (OpenAI's top_logprobs bound)


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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias), sorted by id, each id once
    min_tokens: int = 0
    logprobs: int | None = None   # None: no logprobs; N: each token's and its N most probable alternatives'
    seed_stream: bool = False     # a seed starts one random stream per request instead of keying each position
    constraint: Constraint | None = None   # structured output: a grammar masks every position (ssd.constraints)
    prompt_logprobs: int | None = None     # None: none; N: each prompt token's (after the first) and N alternatives

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
        lo, hi = PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            if not _is_real(getattr(self, name)) or not lo <= getattr(self, name) <= hi:
                raise bad(name, f"a number in [{lo:g}, {hi:g}]")
        lo, hi = REPETITION_RANGE
        if not _is_real(self.repetition_penalty) or not lo <= self.repetition_penalty <= hi:
            raise bad("repetition_penalty", f"a number in [{lo:g}, {hi:g}] (1 = off)")
        bias = _logit_bias(self.logit_bias)
        if bias is None:
            lo, hi = LOGIT_BIAS_RANGE
            raise bad("logit_bias", f"(token id >= 0, bias in [{lo:g}, {hi:g}]) pairs, each id once")
        self.logit_bias = bias
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise bad("min_tokens", "an int >= 0")
        if not isinstance(self.seed_stream, bool):
            raise bad("seed_stream", "a bool")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise bad("constraint", "None or an ssd.constraints.Constraint")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise bad("logprobs", f"None or an int in 0..{MAX_LOGPROBS}")
        if self.prompt_logprobs is not None and (not _is_int(self.prompt_logprobs)
                                                 or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            raise bad("prompt_logprobs", f"None or an int in 0..{MAX_LOGPROBS}")
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)
        self.min_p = float(self.min_p)
        self.presence_penalty = float(self.presence_penalty)
        self.frequency_penalty = float(self.frequency_penalty)
        self.repetition_penalty = float(self.repetition_penalty)

    @property
    def penalized(self) -> bool:
        """Whether any penalty, bias or min_tokens changes the logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def coupled(self) -> bool:
        """Whether each position's token is the seed's and the position's Gumbel-max choice: a seeded sampled
        request unless `seed_stream`. Its verification compares tokens, as greedy does (no proposal q)."""
        return self.seed is not None and self.temperature != 0.0 and not self.seed_stream

    @property
    def needs_proposal(self) -> bool:
        """Whether a speculation must carry the proposal q its tokens were drawn from (rejection sampling)."""
        return self.temperature != 0.0 and not self.coupled


def _logit_bias(value) -> tuple[tuple[int, float], ...] | None:
    """(id, bias) pairs sorted by id (a dict {id: bias} is taken too); None if malformed."""
    if isinstance(value, dict):
        value = value.items()
    if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
        return None
    lo, hi = LOGIT_BIAS_RANGE
    pairs = []
    for pair in value:
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Collection) or len(pair) != 2:
            return None
        token, bias = pair
        if not _is_int(token) or token < 0 or not _is_real(bias) or not lo <= bias <= hi:
            return None
        pairs.append((token, float(bias)))
    pairs.sort()
    if len({t for t, _ in pairs}) != len(pairs):
        return None
    return tuple(pairs)


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the target and its most probable alternatives (most probable
    first, each (token id, logprob))."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None   # its rank in the distribution (1 = the most probable), where computed (prompt tokens)


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


def ending_tokens(params: SamplingParams, eos_token_ids) -> tuple[int, ...]:
    """The token ids that end the sequence (`finish_reason`'s STOP and EOS), sorted: what `min_tokens` masks."""
    eos = () if params.ignore_eos else eos_token_ids
    return tuple(sorted({*params.stop_token_ids, *eos}))


def speculation_room(k: int, params: SamplingParams, num_output: int, num_total: int, max_len: int) -> int:
    """The most tokens the next speculation may hold: a round commits up to room + 1 tokens, which must not run
    past max_len nor far past max_tokens."""
    return max(0, min(k, max_len - num_total - 1, params.max_tokens - num_output - 1))
