"""The data plane's control messages: the handshake (``Hello``, ``Ready``), liveness (``Ping``, ``Pong``), the end of
sequences (``Free``, to targets and drafts alike) and ``Error`` (either way; ``seq`` names the sequence, if one).

Type bytes: 0x01 Hello, 0x02 Ready, 0x03 Ping, 0x04 Pong, 0x50 Free, 0x7F Error.
"""
from __future__ import annotations

from dataclasses import dataclass

from ssd.wire.codec import _wire
from ssd.wire.kinds import ID, STR, U64, _Ints, _Optional, _Str


@_wire(0x01, role=STR, peer_id=STR)
@dataclass(slots=True)
class Hello:
    role: str
    peer_id: str


@_wire(0x02, role=_Str("target", "draft"), model_id=STR, tokenizer_hash=STR, vocab_size=ID, max_len=ID, k=ID,
       fanout=_Ints("MAX_ROWS", 63), feature_size=ID)
@dataclass(slots=True)
class Ready:
    role: str
    model_id: str
    tokenizer_hash: str
    vocab_size: int
    max_len: int
    k: int
    fanout: list[int]
    # a target: its hidden size (the row size of its features); a draft: the row size it reads (0: none)
    feature_size: int = 0


@_wire(0x03, nonce=U64)
@dataclass(slots=True)
class Ping:
    nonce: int


@_wire(0x04, nonce=U64)
@dataclass(slots=True)
class Pong:
    nonce: int


@_wire(0x50, seqs=_Ints("MAX_ITEMS", 63))
@dataclass(slots=True)
class Free:
    seqs: list[int]


@_wire(0x7F, code=STR, message=STR, seq=_Optional(ID))
@dataclass(slots=True)
class Error:
    code: str
    message: str
    seq: int | None
