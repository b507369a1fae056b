"""The tensor-parallel target's messages: what its leader (rank 0) broadcasts to its followers.

Contract
--------
* A message is one buffer: byte 0 is ``TP_VERSION``, byte 1 the message type (table below), the rest a msgpack
  array of its fields in declaration order. No maps, no ext types, never pickle, no torch. The leader sends it
  as a length and a uint8 tensor (``ssd/engine/target_tp.py``).
* ``encode(msg)`` returns the buffer, ``decode(data)`` the message. Both check every field against its kind (the
  data plane's kinds, ``ssd/wire/kinds.py``) and raise ``TPWireError`` naming the message, the field path and the
  rule. ``decode`` raises nothing but ``TPWireError``, whatever the input: size (``MAX_OP_BYTES``, checked before
  unpacking) and version come first, then the type byte; unpacking is bounded (lengths, ``MAX_OP_ARRAYS``); a
  version other than ``TP_VERSION`` is refused naming both versions.
* A sequence id is ``(peer, seq)``: the router's ZeroMQ identity (bytes, at most ``MAX_PEER_BYTES``) and its
  sequence id; decoded as a tuple, as the target keys its sequences.
* Sampling parameters travel field by field and are rebuilt as ``SamplingParams`` (its own checks apply); token
  ids are ints in [0, 2**31). A proposal row ``(ids, probs)`` is two bins: int32 ids and float64 probabilities,
  little-endian, of equal length >= 1; probabilities travel as float64 so that every rank verifies with the
  leader's very numbers (the data plane's float32 would round them).
* Both ends are one installation: the version and the checks guard against a mixed install and a corrupt
  broadcast. A follower that cannot decode what its leader sent cannot mirror it, and exits.

Type bytes::

    0x01 Prefill   0x02 Restore   0x03 Verify   0x04 Free   0x7F Stop
"""
from __future__ import annotations

from dataclasses import dataclass

import msgpack

from ssd.constraints import KINDS, Constraint
from ssd.params import SamplingParams
from ssd.wire.kinds import (WireError, _Array, _Bad, _Bool, _Float, _Int, _Ints, _List, _Optional, _Rows,
                            _Str, _tuple, _what)

__all__ = ["MAX_OP_ARRAYS", "MAX_OP_BYTES", "MAX_OP_ITEMS", "MAX_PEER_BYTES", "MESSAGE_TYPES", "TP_VERSION", "Free",
           "Item", "Prefill", "Request", "Restore", "Stop", "TPWireError", "Verify", "decode", "encode"]

TP_VERSION = 5                # 2: penalties and logprobs in the parameters, Request.prompt_len; 3: seed_stream;
                              # 4: constraint (structured output); 5: prompt_logprobs
MAX_OP_BYTES = 256 << 20     # bytes per message (several data-plane Verify frames merge into one verify)
MAX_OP_ITEMS = 1 << 16       # requests or items per message
MAX_OP_TOKENS = 1 << 20      # ints per token list
MAX_OP_ARRAYS = 1 << 22      # msgpack arrays per message
MAX_PEER_BYTES = 255         # a ZeroMQ routing identity


class TPWireError(WireError):
    """A tensor-parallel message that cannot be encoded or decoded; the text names the message and the field."""


class _Bin:
    """A bin of at most `limit` bytes; encode takes any bytes-like object."""

    def __init__(self, limit: int):
        self.limit = limit

    def dec(self, v):
        if type(v) is not bytes or len(v) > self.limit:
            raise _Bad(f"expected a bin of at most {self.limit} bytes, got {_what(v)}")
        return v

    def enc(self, v):
        return self.dec(bytes(v) if isinstance(v, (bytearray, memoryview)) else v)


class _Params(_Array):
    """`SamplingParams` field by field; decode rebuilds it, its own checks turning into the field's error."""

    def dec(self, v):
        try:
            return super().dec(v)
        except ValueError as e:
            raise _Bad(str(e)) from None


_SPECS: dict[type, _Array] = {}
_TYPE_BYTES: dict[type, int] = {}
MESSAGE_TYPES: dict[int, type] = {}   # type byte -> message class


def _message(type_byte: int | None = None, **kinds):
    """Register a dataclass with the kinds of its fields, in order; with a type byte it is a message."""
    def register(cls):
        _SPECS[cls] = _Array(kinds, cls)
        if type_byte is not None:
            assert type_byte not in MESSAGE_TYPES, f"type byte {type_byte:#04x} used twice"
            MESSAGE_TYPES[type_byte], _TYPE_BYTES[cls] = cls, type_byte
        return cls
    return register


ID, FLAG, TOKENS = _Int(), _Bool(), _Ints("MAX_OP_TOKENS", 31, MAX_OP_TOKENS)
SEQ_ID = _tuple(_Bin(MAX_PEER_BYTES), ID)
SeqId = tuple[bytes, int]
PARAMS = _Params({"temperature": _Float(0.0), "top_k": ID, "top_p": _Float(0.0, 1.0), "min_p": _Float(0.0, 1.0),
                  "seed": _Optional(_Int(64)), "max_tokens": ID, "stop_token_ids": _Ints("MAX_OP_TOKENS", 63,
                                                                                         MAX_OP_TOKENS),
                  "ignore_eos": FLAG, "presence_penalty": _Float(-2.0, 2.0), "frequency_penalty": _Float(-2.0, 2.0),
                  "repetition_penalty": _Float(0.0), "logit_bias": _List(_tuple(_Int(31), _Float(-100.0, 100.0)),
                                                                          "MAX_OP_TOKENS", MAX_OP_TOKENS),
                  "min_tokens": ID, "logprobs": _Optional(_Int(6)), "seed_stream": FLAG,
                  "constraint": _Optional(_Array({"kind": _Str(*KINDS), "text": _Str()}, Constraint)),
                  "prompt_logprobs": _Optional(_Int(6))},
                 SamplingParams)


def _many(cls) -> _List:
    return _List(_SPECS[cls], "MAX_OP_ITEMS", MAX_OP_ITEMS)


@_message(seq_id=SEQ_ID, tokens=TOKENS, params=PARAMS, prompt_len=ID)
@dataclass(slots=True)
class Request:
    seq_id: SeqId
    tokens: list[int]
    params: SamplingParams
    prompt_len: int = 0   # how many of `tokens` are the prompt (0 = all of them)


@_message(seq_id=SEQ_ID, tokens=TOKENS, proposal=_Optional(_Rows("d")))
@dataclass(slots=True)
class Item:
    seq_id: SeqId
    tokens: list[int]
    proposal: list[tuple[list[int], list[float]]] | None   # one row per speculated token; None: greedy


@_message(0x01, requests=_many(Request), features=FLAG)
@dataclass(slots=True)
class Prefill:
    requests: list[Request]
    features: bool


@_message(0x02, requests=_many(Request))
@dataclass(slots=True)
class Restore:
    requests: list[Request]


@_message(0x03, items=_many(Item), features=FLAG)
@dataclass(slots=True)
class Verify:
    items: list[Item]
    features: bool


@_message(0x04, seq_id=SEQ_ID)
@dataclass(slots=True)
class Free:
    seq_id: SeqId


@_message(0x7F)
@dataclass(slots=True)
class Stop:
    pass


Message = Prefill | Restore | Verify | Free | Stop


def encode(msg: Message) -> bytes:
    """The buffer of `msg`; TPWireError if a field breaks its kind or the buffer exceeds MAX_OP_BYTES."""
    name, type_byte = type(msg).__name__, _TYPE_BYTES.get(type(msg))
    if type_byte is None:
        raise TPWireError(f"cannot encode {name}: not a tensor-parallel message")
    try:
        body = msgpack.packb(_SPECS[type(msg)].enc(msg), use_bin_type=True)
    except _Bad as e:
        raise TPWireError(f"{e.where(name)}: {e.rule}") from None
    if len(body) + 2 > MAX_OP_BYTES:
        raise TPWireError(f"{name}: {len(body) + 2} bytes exceeds MAX_OP_BYTES={MAX_OP_BYTES}")
    return bytes([TP_VERSION, type_byte]) + body


class _TooManyArrays(Exception):
    pass


def _array_budget():
    count = iter(range(MAX_OP_ARRAYS))

    def hook(v: list) -> list:
        if next(count, None) is None:
            raise _TooManyArrays
        return v
    return hook


def decode(data: bytes) -> Message:
    """The message in `data` (bytes or a buffer); TPWireError, and nothing else, if it is not a valid one."""
    try:
        data = memoryview(data).cast("B")
    except (TypeError, ValueError):
        raise TPWireError(f"a tensor-parallel message is bytes, got {type(data).__name__}") from None
    if len(data) < 2:
        raise TPWireError(f"a tensor-parallel message is at least 2 bytes [version, type], got {len(data)}")
    if len(data) > MAX_OP_BYTES:
        raise TPWireError(f"a tensor-parallel message of {len(data)} bytes exceeds MAX_OP_BYTES={MAX_OP_BYTES}")
    if data[0] != TP_VERSION:
        raise TPWireError(f"tensor-parallel message version {data[0]} is not supported; this rank speaks version "
                          f"{TP_VERSION}")
    cls = MESSAGE_TYPES.get(data[1])
    if cls is None:
        raise TPWireError(f"unknown tensor-parallel message type byte {data[1]:#04x}")
    name = cls.__name__
    try:
        payload = msgpack.unpackb(data[2:], raw=False, strict_map_key=True, max_bin_len=MAX_OP_BYTES,
                                  max_str_len=1 << 16, max_array_len=max(MAX_OP_ITEMS, MAX_OP_TOKENS), max_map_len=0,
                                  max_ext_len=0, list_hook=_array_budget())
    except _TooManyArrays:
        raise TPWireError(f"{name}: more than MAX_OP_ARRAYS={MAX_OP_ARRAYS} arrays in the message") from None
    except Exception as e:  # msgpack signals malformed input with several exception types
        raise TPWireError(f"{name}: malformed msgpack payload ({type(e).__name__}: {str(e)[:80]})") from None
    try:
        return _SPECS[cls].dec(payload)
    except _Bad as e:
        raise TPWireError(f"{e.where(name)}: {e.rule}") from None
