"""The data plane's messages between the router and a draft: add a sequence (``DraftAdd``), the per-round work
(``DraftRound`` -> ``CacheEntries``: the next speculation for each outcome the draft anticipates), and the JIT
backup on a miss (``Jit`` -> ``JitResult``).

Type bytes: 0x30 DraftAdd, 0x31 DraftRound, 0x32 CacheEntries, 0x40 Jit, 0x41 JitResult.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ssd.wire.codec import _SPECS, _items, _wire
from ssd.wire.features import FEATURES, Features
from ssd.wire.kinds import FLAG, ID, PROPOSAL, SECONDS, SEED, STR, TOKEN, TOKENS, UNIT, Row, _Ints, _List, _tuple


@_wire(temperature=SECONDS, top_k=ID, saguaro_c=SECONDS, saguaro_f=ID, seed=SEED, coupled=FLAG, top_p=UNIT,
       min_p=UNIT, constraint_kind=STR, constraint=STR)
@dataclass(slots=True)
class DraftParamsSpec:
    temperature: float
    top_k: int
    saguaro_c: float
    saguaro_f: int
    seed: int | None
    # version 5: a coupled sequence (`SamplingParams.coupled`) picks each token with the seed's and the position's
    # noise from q filtered as the target filters (top_k, top_p, min_p), and ships no proposal
    coupled: bool = False
    top_p: float = 1.0
    min_p: float = 0.0
    # version 7: the request's structured-output grammar (as SamplingSpec's), which steers the draft's proposals
    constraint_kind: str = ""
    constraint: str = ""


@_wire(seq=ID, tokens=TOKENS, params=_SPECS[DraftParamsSpec], features=FEATURES, prompt_len=ID)
@dataclass(slots=True)
class DraftAddItem:
    seq: int
    tokens: list[int]
    params: DraftParamsSpec
    features: Features | None = None   # for a feature-reading draft: the target's features it has not seen
    prompt_len: int = 0                # version 7: tokens[:prompt_len] are the prompt (0 = all of them)


@_wire(0x30, items=_items(DraftAddItem))
@dataclass(slots=True)
class DraftAdd:
    items: list[DraftAddItem]


@_wire(seq=ID, round=ID, delta=TOKENS, spec=TOKENS, features=FEATURES, depth=ID)
@dataclass(slots=True)
class DraftRoundItem:
    seq: int
    round: int
    delta: list[int]   # tokens committed since the last message about seq
    spec: list[int]    # the speculation now being verified
    features: Features | None = None   # the target's features received since the last message about seq
    depth: int = 0     # version 8: tokens per cache entry, the K the sequence's next round is to run (1..K; 0: the
                       # draft's K), so the draft grows no step the router would cut


@_wire(0x31, items=_items(DraftRoundItem), fanout=_Ints("MAX_ROWS", 63))
@dataclass(slots=True)
class DraftRound:
    items: list[DraftRoundItem]
    fanout: list[int] = field(default_factory=list)   # forks per position F_0..F_K for these rounds (empty: the
                                                      # draft's own); the router's online fan-out (version 3); a
                                                      # round of k < K tokens reads F_0..F_{k-1} and F_K


@_wire(accepted=ID, token=TOKEN, tokens=TOKENS, proposal=PROPOSAL)
@dataclass(slots=True)
class CacheEntry:
    accepted: int   # the outcome (j, t*) this speculation anticipates
    token: int
    tokens: list[int]
    proposal: list[Row] | None


@_wire(0x32, seq=ID, round=ID, entries=_items(CacheEntry, "MAX_ENTRIES"), elapsed_s=SECONDS)
@dataclass(slots=True)
class CacheEntries:
    seq: int
    round: int
    entries: list[CacheEntry]
    elapsed_s: float


@_wire(seq=ID, delta=TOKENS, room=ID, features=FEATURES)
@dataclass(slots=True)
class JitItem:
    seq: int
    delta: list[int]
    room: int   # the most tokens the answer may hold (the room of the speculation: K, less near the end)
    features: Features | None = None   # as DraftRoundItem.features


@_wire(0x40, batch_id=ID, items=_items(JitItem))
@dataclass(slots=True)
class Jit:
    batch_id: int
    items: list[JitItem]


@_wire(0x41, batch_id=ID, items=_List(_tuple(ID, TOKENS, PROPOSAL), "MAX_ITEMS"), elapsed_s=SECONDS)
@dataclass(slots=True)
class JitResult:
    batch_id: int
    items: list[tuple[int, list[int], list[Row] | None]]   # (seq, tokens, proposal)
    elapsed_s: float
