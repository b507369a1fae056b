"""The data plane's messages between the router and a target: prefill a sequence (``Prefill`` -> ``Prefilled``, its
first token), rebuild one from its committed tokens on another target (``Restore`` -> ``Restored``), and verify
speculations (``Verify`` of ``VerifyItem`` -> ``Outcomes`` of ``Outcome``: j tokens accepted, then t*). A sequence
whose sampling asks for logprobs gets them with its tokens (``SeqLogprobs`` in ``Prefilled`` and ``Outcomes``).

Type bytes: 0x10 Prefill, 0x11 Prefilled, 0x12 Restore, 0x13 Restored, 0x20 Verify, 0x21 Outcomes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ssd.wire.codec import _SPECS, _items, _wire
from ssd.wire.features import SEQ_FEATURES
from ssd.wire.kinds import (FLAG, ID, LOGIT_BIAS, LOGPROBS, PENALTY, PROPOSAL, REPETITION, SECONDS, SEED, STR, TOKEN, TOKENS,
                            UNIT, Row, _Int, _Ints, _List, _Optional, _tuple)


@_wire(temperature=SECONDS, top_k=ID, top_p=UNIT, min_p=UNIT, seed=SEED, presence_penalty=PENALTY,
       frequency_penalty=PENALTY, repetition_penalty=REPETITION, logit_bias=LOGIT_BIAS, min_tokens=ID,
       ending=TOKENS, logprobs=_Optional(_Int(6)), seed_stream=FLAG,
       constraint_kind=STR, constraint=STR, prompt_logprobs=_Optional(_Int(6)))
@dataclass(slots=True)
class SamplingSpec:
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    # version 4: penalties and biases (ssd.params has the rules); `ending`: the tokens that end the sequence
    # (its stop ids and, unless ignore_eos, EOS), which `min_tokens` masks
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    min_tokens: int = 0
    ending: list[int] = field(default_factory=list)
    logprobs: int | None = None   # answer with each token's logprob and this many alternatives (None: no)
    seed_stream: bool = False     # version 5: the seed starts a stream (else each position's draw is keyed)
    constraint_kind: str = ""     # version 6: structured output (ssd.constraints.KINDS; "" = none) and its text
    constraint: str = ""
    prompt_logprobs: int | None = None   # version 7: answer with the prompt's logprobs, this many alternatives each


@_wire(seq=ID, logprobs=LOGPROBS, top_ids=_Ints("MAX_ROW_ENTRIES"), top_logprobs=LOGPROBS)
@dataclass(slots=True)
class SeqLogprobs:
    """The target's log-probabilities of the tokens one reply commits for a sequence (asked by
    SamplingSpec.logprobs = N): one per token, in order, and each token's N most probable alternatives."""
    seq: int
    logprobs: list[float]
    top_ids: list[int]         # len(logprobs) * N ids: token i's are [i * N, (i + 1) * N), most probable first
    top_logprobs: list[float]  # their log-probabilities


@_wire(seq=ID, logprobs=LOGPROBS, ranks=_Ints("MAX_ROW_ENTRIES"), top_ids=_Ints("MAX_ROW_ENTRIES"),
       top_logprobs=LOGPROBS)
@dataclass(slots=True)
class PromptLogprobs:
    """Version 7: the target's log-probabilities of a sequence's prompt tokens after the first, each given the
    tokens before it (asked by SamplingSpec.prompt_logprobs = N), from its prefill: one per token, its rank in the
    distribution (1 = the most probable), and each token's N most probable alternatives, laid out as in
    SeqLogprobs."""
    seq: int
    logprobs: list[float]
    ranks: list[int]
    top_ids: list[int]
    top_logprobs: list[float]


@_wire(seq=ID, tokens=TOKENS, sampling=_SPECS[SamplingSpec], prompt_len=ID)
@dataclass(slots=True)
class PrefillItem:
    seq: int
    tokens: list[int]
    sampling: SamplingSpec
    prompt_len: int = 0   # version 4: how many of `tokens` are the prompt (a Restore's); 0 = all of them


@_wire(0x10, items=_items(PrefillItem), features=FLAG)
@dataclass(slots=True)
class Prefill:
    items: list[PrefillItem]
    features: bool = False   # answer with the prompts' features


@_wire(0x11, items=_List(_tuple(ID, TOKEN), "MAX_ITEMS"), elapsed_s=SECONDS, features=SEQ_FEATURES,
       logprobs=_items(SeqLogprobs), prompt_logprobs=_items(PromptLogprobs))
@dataclass(slots=True)
class Prefilled:
    items: list[tuple[int, int]]   # (seq, first_token)
    elapsed_s: float
    # (seq, start, data): the features each prefill computed (a prefix-cache hit may skip the first); empty unless asked
    features: list[tuple[int, int, bytes]] = field(default_factory=list)
    logprobs: list[SeqLogprobs] = field(default_factory=list)   # of the first tokens, for the sequences that asked
    # version 7: of each prompt token after the first (given those before it), for the sequences that asked
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)


@_wire(0x12, items=_items(PrefillItem))
@dataclass(slots=True)
class Restore:
    items: list[PrefillItem]   # tokens = every committed token: rebuild KV, sample nothing (target failover)


@_wire(0x13, seqs=_Ints("MAX_ITEMS", 63), elapsed_s=SECONDS)
@dataclass(slots=True)
class Restored:
    seqs: list[int]
    elapsed_s: float


@_wire(seq=ID, tokens=TOKENS, proposal=PROPOSAL)
@dataclass(slots=True)
class VerifyItem:
    seq: int
    tokens: list[int]
    proposal: list[Row] | None   # one row per speculated token; None: greedy


@_wire(0x20, batch_id=ID, items=_items(VerifyItem), features=FLAG)
@dataclass(slots=True)
class Verify:
    batch_id: int
    items: list[VerifyItem]
    features: bool = False   # answer with the features this verify computed


@_wire(seq=ID, accepted=ID, token=TOKEN)
@dataclass(slots=True)
class Outcome:
    seq: int
    accepted: int
    token: int


@_wire(0x21, batch_id=ID, items=_items(Outcome), elapsed_s=SECONDS, features=SEQ_FEATURES,
       logprobs=_items(SeqLogprobs))
@dataclass(slots=True)
class Outcomes:
    batch_id: int
    items: list[Outcome]
    elapsed_s: float
    # (seq, start, data): up to and including each sequence's last accepted token; empty unless asked
    features: list[tuple[int, int, bytes]] = field(default_factory=list)
    # of the j accepted tokens and t*, for the sequences that asked
    logprobs: list[SeqLogprobs] = field(default_factory=list)
