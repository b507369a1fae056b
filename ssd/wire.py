"""The data plane's messages: every ZeroMQ message between the router, targets and draft replicas.

Contract
--------
* A message is two frames, ``[type, payload]``: ``type`` is exactly one byte (table below); ``payload`` is
  a msgpack array ``[PROTOCOL_VERSION, field_1, ..., field_n]``, fields in declaration order. Nested items
  and tuples are arrays too. No maps, no ext types, never pickle. No torch here; needs a little-endian host.
* ``encode(msg)`` returns the frames, ``decode(frames)`` the message. Both check every field against its
  kind and raise ``WireError`` naming the message, the field path and the rule, e.g.
  ``"Verify.items[3].proposal[0]: ..."``. ``decode`` raises nothing but ``WireError``, whatever the input:
  frame count, type byte and payload size (``max_frame_bytes``, checked before unpacking) come first,
  unpacking is bounded (array, string and bin lengths, nesting depth, and at most ``MAX_ARRAYS`` arrays, so a
  payload's Python objects stay within a small multiple of its bytes), and a version other than
  ``PROTOCOL_VERSION`` is refused naming both versions.
* Kinds: ids, counts and rounds are ints in [0, 2**63); token ids ints in [0, 2**31); floats finite (and
  >= 0 or in [0, 1] where the meaning says so); strings and lists bounded by the named limits (``MAX_*``).
  Encode is lenient about containers (tuples, numpy arrays and scalars); decode is strict and returns lists
  (tuples for tuple-typed items), so ``decode(encode(m)) == m`` for messages built of lists.
* A proposal row is the sparse support of one drafted token's distribution, ``(ids, probs)``: in Python a
  tuple ``(list[int], list[float])`` (encode takes any sequences of numbers; lists are fastest). On the wire, two
  msgpack bin values: little-endian int32 ids and float32 probabilities, of equal length >= 1, ids in
  [0, 2**31), probabilities finite in [0, 1]. Probabilities travel as float32: decoded floats are the
  float32 roundings of those sent. ``proposal=None`` means greedy (one-hot).
* A feature block is ``(start, data)``: ``start`` the position of its first row, an int in [0, 2**63);
  ``data`` its rows, row-major, each value a little-endian float16 (``FEATURE_DTYPE``; the target's final
  pre-norm hidden states, one row per position), a msgpack bin of even length, at most ``MAX_FRAME_BYTES``.
  The row size (hidden size) is not on the wire: ``feature_row_bytes(dim)`` is a row's bytes and
  ``feature_rows(data, dim)`` checks ``len(data)`` against it (the torch side: ``ssd/engine/features.py``). Senders keep a message's feature bytes within
  ``MAX_FEATURE_BYTES``, dropping the oldest rows first (a feature-reading draft reads missing rows as zeros;
  exactness never depends on features).
* Flags are msgpack booleans; decode refuses ints in their place.
* Fields added after version 1 (``Ready.feature_size``, the ``features`` fields; ``DraftRound.fanout`` in
  version 3) come last and have defaults (0, False, empty, None), so a message built without them means "no
  features" ("the draft's own fan-out"); on the wire every field is always present.
* The codec checks each field, not relations between fields (rows vs tokens): those are the receivers'.

Type bytes::

    0x01 Hello     0x02 Ready      0x03 Ping          0x04 Pong
    0x10 Prefill   0x11 Prefilled  0x20 Verify        0x21 Outcomes
    0x30 DraftAdd  0x31 DraftRound 0x32 CacheEntries  0x40 Jit
    0x41 JitResult 0x50 Free       0x7F Error
"""
from __future__ import annotations

import math
import sys
from array import array
from dataclasses import dataclass, field, fields
from itertools import repeat
from operator import attrgetter

import msgpack
import numpy as np

__all__ = ["MAX_ARRAYS", "MAX_ENTRIES", "MAX_FEATURE_BYTES", "MAX_FRAME_BYTES", "MAX_ITEMS", "MAX_ROW_ENTRIES",
           "MAX_ROWS", "MAX_STR", "MAX_TOKENS", "MESSAGE_TYPES", "PROTOCOL_VERSION", "Restore", "Restored",
           "CacheEntries", "CacheEntry", "FEATURE_DTYPE", "DraftAdd", "DraftAddItem", "DraftParamsSpec", "DraftRound", "DraftRoundItem",
           "Error", "Features", "Free", "Hello", "Jit", "JitItem", "JitResult", "Message", "Outcome", "Outcomes",
           "Ping", "Pong", "Prefill", "PrefillItem", "Prefilled", "Ready", "Row", "SamplingSpec", "Verify",
           "VerifyItem", "WireError", "decode", "encode", "feature_row_bytes", "feature_rows"]

PROTOCOL_VERSION = 3
MAX_FRAME_BYTES = 16 << 20   # bytes per payload frame (decode/encode argument overrides it)
MAX_FEATURE_BYTES = 4 << 20  # feature bytes senders put in one message (a quarter frame: room for the rest)
MAX_ITEMS = 4096             # items per batch message, seqs per Free
MAX_TOKENS = 1 << 20         # ints per token list
MAX_ENTRIES = 4096           # entries per CacheEntries
MAX_ROWS = 1024              # rows per proposal, ints per fanout
MAX_ROW_ENTRIES = 1 << 18    # support size of one proposal row
MAX_STR = 1 << 16            # characters per string
MAX_ARRAYS = 1 << 18         # msgpack arrays per payload (an empty array is 1 byte on the wire, 56 in memory)
FEATURE_DTYPE = "<f2"        # a feature value: little-endian float16 (numpy's name)
FEATURE_VALUE_BYTES = 2
assert sys.byteorder == "little" and array("i").itemsize == array("f").itemsize == 4, "needs a little-endian host"


class WireError(ValueError):
    """A message that cannot be encoded or decoded; the text names the message type and the field."""


def feature_row_bytes(dim: int) -> int:
    """The bytes of one feature row of `dim` values."""
    return FEATURE_VALUE_BYTES * dim


def feature_rows(data: bytes, dim: int) -> int:
    """How many rows of `dim` values a feature block's `data` holds; WireError unless a whole number."""
    if dim <= 0 or len(data) % feature_row_bytes(dim):
        raise WireError(f"feature data of {len(data)} bytes is not a whole number of float16 rows of {dim}")
    return len(data) // feature_row_bytes(dim)


class _Bad(Exception):
    """A field breaks its kind; ``path`` gathers field names, innermost first, as the error unwinds."""

    def __init__(self, rule: str):
        super().__init__(rule)
        self.rule, self.path = rule, []

    def where(self, name: str) -> str:
        return name + "".join(p if p[0] == "[" else "." + p for p in reversed(self.path))


def _what(v) -> str:
    return repr(v) if type(v) in (int, float) else f"str {v[:40]!r}" if type(v) is str else type(v).__name__


def _as_list(v) -> list:
    if type(v) is list:
        return v
    if isinstance(v, (tuple, np.ndarray)):
        return list(v) if type(v) is tuple else v.tolist()
    raise _Bad(f"expected a list, got {type(v).__name__}")


def _map(fns, values, names: tuple[str, ...] = ()) -> list:
    """``[f(x) for f, x in zip(fns, values)]``, naming (or indexing) the value that breaks its kind."""
    out = []
    for f, x in zip(fns, values):
        try:
            out.append(f(x))
        except _Bad as e:
            e.path.append(names[len(out)] if names else f"[{len(out)}]")
            raise
    return out


class _Int:
    def __init__(self, bits: int = 63):
        self.end, self.rule = 1 << bits, f"an int in [0, 2**{bits})"

    def dec(self, v):
        if type(v) is not int or not 0 <= v < self.end:
            raise _Bad(f"expected {self.rule}, got {_what(v)}")
        return v

    def enc(self, v):
        return self.dec(int(v) if isinstance(v, np.integer) else v)


class _Float:
    def __init__(self, lo: float, hi: float = math.inf):
        self.lo, self.hi, self.rule = lo, hi, f"a finite float in [{lo}, {hi}]"

    def dec(self, v):
        if type(v) is not float or not (self.lo <= v <= self.hi and math.isfinite(v)):
            raise _Bad(f"expected {self.rule}, got {_what(v)}")
        return v

    def enc(self, v):
        lenient = isinstance(v, (int, np.integer, np.floating)) and not isinstance(v, bool)
        return self.dec(float(v) if lenient else v)


class _Str:
    def __init__(self, *choices: str):
        self.choices = choices

    def dec(self, v):
        if type(v) is not str or len(v) > MAX_STR or (self.choices and v not in self.choices):
            rule = f"one of {self.choices}" if self.choices else f"a str of at most MAX_STR={MAX_STR} characters"
            raise _Bad(f"expected {rule}, got {_what(v)}")
        return v

    enc = dec


class _Bool:
    """A msgpack boolean; decode refuses ints (0 and 1 are not flags)."""

    def dec(self, v):
        if type(v) is not bool:
            raise _Bad(f"expected a bool, got {_what(v)}")
        return v

    def enc(self, v):
        return self.dec(bool(v) if isinstance(v, np.bool_) else v)


class _Halves:
    """Float16 rows as a bin: even length, at most MAX_FRAME_BYTES; encode takes any bytes-like object."""

    def dec(self, v):
        if type(v) is not bytes or len(v) % FEATURE_VALUE_BYTES or len(v) > MAX_FRAME_BYTES:
            what = f"{len(v)} bytes" if type(v) is bytes else _what(v)
            raise _Bad(f"expected a bin of float16 values (an even number of bytes, at most "
                       f"MAX_FRAME_BYTES={MAX_FRAME_BYTES}), got {what}")
        return v

    def enc(self, v):
        return self.dec(bytes(v) if isinstance(v, (bytearray, memoryview)) else v)


class _Optional:
    def __init__(self, kind):
        self.kind = kind

    def dec(self, v):
        return None if v is None else self.kind.dec(v)

    def enc(self, v):
        return None if v is None else self.kind.enc(v)


class _List:
    def __init__(self, kind, limit: str, value: int | None = None):   # limit: its name (a MAX_* here, or value)
        self.kind, self.limit, self.max = kind, limit, globals()[limit] if value is None else value

    def _check(self, v) -> list:
        if type(v) is not list:
            raise _Bad(f"expected a list, got {_what(v)}")
        if len(v) > self.max:
            raise _Bad(f"{len(v)} elements exceeds {self.limit}={self.max}")
        return v

    def dec(self, v):
        return _map(repeat(self.kind.dec), self._check(v))

    def enc(self, v):
        return _map(repeat(self.kind.enc), self._check(_as_list(v)))


class _Ints(_List):
    """A list of ints in [0, 2**bits), checked in bulk (token lists, fanouts, seq lists)."""

    def __init__(self, limit: str, bits: int = 31, value: int | None = None):
        super().__init__(_Int(bits), limit, value)
        self.end = 1 << bits

    def dec(self, v):
        self._check(v)
        if not all(type(t) is int for t in v) or (v and (min(v) < 0 or max(v) >= self.end)):
            super().dec(v)  # raises, naming the first offending index
        return v

    def enc(self, v):
        return self.dec(_as_list(v))


class _Array:
    """A fixed-length array of kinds: a dataclass's fields (``cls``) or a tuple."""

    def __init__(self, kinds: dict, cls=None):
        self.names, self.kinds, self.cls = tuple(kinds), tuple(kinds.values()), cls
        self.decs, self.encs = tuple(k.dec for k in self.kinds), tuple(k.enc for k in self.kinds)
        self.values = attrgetter(*self.names) if len(self.names) > 1 else lambda v: tuple(
            getattr(v, name) for name in self.names)
        if cls is not None and self.names != tuple(f.name for f in fields(cls)):
            raise TypeError(f"{cls.__name__}: wire kinds {self.names} do not match its fields")

    def dec(self, v):
        if type(v) is not list or len(v) != len(self.kinds):
            what = f"the {len(self.kinds)} fields {self.names}" if self.cls else f"an array of {len(self.kinds)}"
            raise _Bad(f"expected {what}, got {f'{len(v)} values' if type(v) is list else _what(v)}")
        values = _map(self.decs, v, self.names)
        return tuple(values) if self.cls is None else self.cls(*values)

    def enc(self, v):
        if self.cls is None:
            v = _as_list(v)
            if len(v) != len(self.kinds):
                raise _Bad(f"expected a tuple of {len(self.kinds)}, got {len(v)} elements")
        elif type(v) is self.cls:
            v = self.values(v)
        else:
            raise _Bad(f"expected {self.cls.__name__}, got {type(v).__name__}")
        return _map(self.encs, v, self.names)


def _tuple(*kinds) -> _Array:
    return _Array({f"[{i}]": k for i, k in enumerate(kinds)})


_ROW_RULE = "a row's ids must be ints in [0, 2**31) and its probs finite floats in [0, 1]"


def _rows_ok(ids: bytes, probs: bytes) -> bool:
    """Both little-endian: ids >= 0 iff each high byte < 0x80. Non-negative float32 sort like their bits as
    uint32, and a sign bit, inf or NaN puts the bits above 1.0's: probs in [0, 1] iff max(bits) <= 1.0's."""
    return ids[3::4].isascii() and (not probs or int(np.frombuffer(probs, "<u4").max()) <= 0x3F800000)


class _Rows:
    """A proposal: rows ``(ids, probs)`` <-> arrays ``[int32 LE bin, float32 LE bin]``, checked in one pass."""

    def dec(self, v):
        if type(v) is not list or len(v) > MAX_ROWS:
            raise _Bad(f"expected a list of at most MAX_ROWS={MAX_ROWS} rows, got {_what(v)}")
        for i, row in enumerate(v):
            if type(row) is not list or len(row) != 2 or type(row[0]) is not bytes or type(row[1]) is not bytes:
                self._bad(i, f"a row is an array [ids: bin, probs: bin], got {_what(row)}")
            n = len(row[0])
            if n != len(row[1]) or n % 4 or not 0 < n <= 4 * MAX_ROW_ENTRIES:
                self._bad(i, f"ids and probs must hold the same number (1..MAX_ROW_ENTRIES={MAX_ROW_ENTRIES}) "
                             f"of int32/float32 values, got {n} and {len(row[1])} bytes")
        ib, pb = b"".join([r[0] for r in v]), b"".join([r[1] for r in v])
        self._check(v, ib, pb)
        ids, probs = array("i"), array("f")
        ids.frombytes(ib)
        probs.frombytes(pb)
        ids, probs, out, start = ids.tolist(), probs.tolist(), [], 0
        for r in v:
            end = start + (len(r[0]) >> 2)
            out.append((ids[start:end], probs[start:end]))
            start = end
        return out

    def enc(self, v):
        v, out = _as_list(v), []
        if len(v) > MAX_ROWS:
            raise _Bad(f"{len(v)} rows exceeds MAX_ROWS={MAX_ROWS}")
        for i, row in enumerate(v):
            try:
                ids, probs = row
                out.append([array("i", ids).tobytes(), array("f", probs).tobytes()])
            except (TypeError, ValueError, OverflowError, RuntimeError):
                self._bad(i, f"a row is a pair (ids, probs): {_ROW_RULE}")
            if not 0 < len(out[-1][0]) == len(out[-1][1]) <= 4 * MAX_ROW_ENTRIES:
                self._bad(i, f"ids and probs must have the same length in 1..MAX_ROW_ENTRIES={MAX_ROW_ENTRIES}, "
                             f"got {len(out[-1][0]) // 4} and {len(out[-1][1]) // 4}")
        self._check(out, b"".join([r[0] for r in out]), b"".join([r[1] for r in out]))
        return out

    def _check(self, rows: list, ib: bytes, pb: bytes) -> None:
        if not _rows_ok(ib, pb):
            self._bad(next(i for i, r in enumerate(rows) if not _rows_ok(*r)), _ROW_RULE)

    @staticmethod
    def _bad(i: int, rule: str):
        e = _Bad(rule)
        e.path.append(f"[{i}]")
        raise e


_SPECS: dict[type, _Array] = {}
_TYPE_FRAMES: dict[type, bytes] = {}
MESSAGE_TYPES: dict[int, type] = {}   # type byte -> message class


def _wire(type_byte: int | None = None, **kinds):
    """Register a dataclass with the kinds of its fields, in order; with a type byte it is a message."""
    def register(cls):
        _SPECS[cls] = _Array(kinds, cls)
        if type_byte is not None:
            assert type_byte not in MESSAGE_TYPES, f"type byte {type_byte:#04x} used twice"
            MESSAGE_TYPES[type_byte], _TYPE_FRAMES[cls] = cls, bytes([type_byte])
        return cls
    return register


def _items(cls, limit: str = "MAX_ITEMS") -> _List:
    return _List(_SPECS[cls], limit)


ID, U64, TOKEN, STR, TOKENS = _Int(), _Int(64), _Int(31), _Str(), _Ints("MAX_TOKENS")
SECONDS, UNIT, SEED = _Float(0.0), _Float(0.0, 1.0), _Optional(_Int(64))
PROPOSAL = _Optional(_Rows())
FLAG, FEATURES = _Bool(), _Optional(_tuple(ID, _Halves()))   # FEATURES: a block or None
SEQ_FEATURES = _List(_tuple(ID, ID, _Halves()), "MAX_ITEMS")
Row = tuple[list[int], list[float]]
Features = tuple[int, bytes]   # (start, float16 rows): a feature block


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


@_wire(temperature=SECONDS, top_k=ID, top_p=UNIT, min_p=UNIT, seed=SEED)
@dataclass(slots=True)
class SamplingSpec:
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None


@_wire(seq=ID, tokens=TOKENS, sampling=_SPECS[SamplingSpec])
@dataclass(slots=True)
class PrefillItem:
    seq: int
    tokens: list[int]
    sampling: SamplingSpec


@_wire(0x10, items=_items(PrefillItem), features=FLAG)
@dataclass(slots=True)
class Prefill:
    items: list[PrefillItem]
    features: bool = False   # answer with the prompts' features


@_wire(0x11, items=_List(_tuple(ID, TOKEN), "MAX_ITEMS"), elapsed_s=SECONDS, features=SEQ_FEATURES)
@dataclass(slots=True)
class Prefilled:
    items: list[tuple[int, int]]   # (seq, first_token)
    elapsed_s: float
    # (seq, start, data): the features each prefill computed (a prefix-cache hit may skip the first); empty unless asked
    features: list[tuple[int, int, bytes]] = field(default_factory=list)


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


@_wire(0x21, batch_id=ID, items=_items(Outcome), elapsed_s=SECONDS, features=SEQ_FEATURES)
@dataclass(slots=True)
class Outcomes:
    batch_id: int
    items: list[Outcome]
    elapsed_s: float
    # (seq, start, data): up to and including each sequence's last accepted token; empty unless asked
    features: list[tuple[int, int, bytes]] = field(default_factory=list)


@_wire(temperature=SECONDS, top_k=ID, saguaro_c=SECONDS, saguaro_f=ID, seed=SEED)
@dataclass(slots=True)
class DraftParamsSpec:
    temperature: float
    top_k: int
    saguaro_c: float
    saguaro_f: int
    seed: int | None


@_wire(seq=ID, tokens=TOKENS, params=_SPECS[DraftParamsSpec], features=FEATURES)
@dataclass(slots=True)
class DraftAddItem:
    seq: int
    tokens: list[int]
    params: DraftParamsSpec
    features: Features | None = None   # for a feature-reading draft: the target's features it has not seen


@_wire(0x30, items=_items(DraftAddItem))
@dataclass(slots=True)
class DraftAdd:
    items: list[DraftAddItem]


@_wire(seq=ID, round=ID, delta=TOKENS, spec=TOKENS, features=FEATURES)
@dataclass(slots=True)
class DraftRoundItem:
    seq: int
    round: int
    delta: list[int]   # tokens committed since the last message about seq
    spec: list[int]    # the speculation now being verified
    features: Features | None = None   # the target's features received since the last message about seq


@_wire(0x31, items=_items(DraftRoundItem), fanout=_Ints("MAX_ROWS", 63))
@dataclass(slots=True)
class DraftRound:
    items: list[DraftRoundItem]
    fanout: list[int] = field(default_factory=list)   # forks per position F_0..F_K for these rounds (empty: the
                                                      # draft's own); the router's online fan-out (version 3)


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


Message = (Hello | Ready | Ping | Pong | Prefill | Prefilled | Restore | Restored | Verify | Outcomes | DraftAdd
           | DraftRound | CacheEntries | Jit | JitResult | Free | Error)


def encode(msg: Message, max_frame_bytes: int = MAX_FRAME_BYTES) -> list[bytes]:
    """The frames ``[type, payload]`` of ``msg``; WireError if a field breaks its kind or the payload is too big."""
    name, head = type(msg).__name__, _TYPE_FRAMES.get(type(msg))
    if head is None:
        raise WireError(f"cannot encode {name}: not a wire message")
    try:
        body = msgpack.packb([PROTOCOL_VERSION, *_SPECS[type(msg)].enc(msg)], use_bin_type=True)
    except _Bad as e:
        raise WireError(f"{e.where(name)}: {e.rule}") from None
    if len(body) > max_frame_bytes:
        raise WireError(f"{name}: payload of {len(body)} bytes exceeds max_frame_bytes={max_frame_bytes}")
    return [head, body]


class _TooManyArrays(Exception):
    pass


def _array_budget():
    """A msgpack list_hook that stops unpacking after MAX_ARRAYS arrays (an array of a million empty arrays is
    1 MB on the wire and 56 MB in Python)."""
    count = iter(range(MAX_ARRAYS))

    def hook(v: list) -> list:
        if next(count, None) is None:
            raise _TooManyArrays
        return v
    return hook


def decode(frames: list[bytes], max_frame_bytes: int = MAX_FRAME_BYTES) -> Message:
    """The message in ``frames`` (bytes or buffers); WireError, and nothing else, if they are not a valid one."""
    if type(frames) not in (list, tuple) or len(frames) != 2:
        got = len(frames) if type(frames) in (list, tuple) else type(frames).__name__
        raise WireError(f"a message is 2 frames [type, payload], got {got}")
    head, body = frames
    try:
        head, body = memoryview(head).cast("B"), (body if type(body) is bytes else memoryview(body).cast("B"))
    except (TypeError, ValueError):
        raise WireError(f"frames must be bytes, got {type(head).__name__} and {type(body).__name__}") from None
    if len(head) != 1:
        raise WireError(f"the type frame must be exactly 1 byte, got {len(head)}")
    cls = MESSAGE_TYPES.get(head[0])
    if cls is None:
        raise WireError(f"unknown message type byte {head[0]:#04x}")
    name = cls.__name__
    if len(body) > max_frame_bytes:
        raise WireError(f"{name}: payload of {len(body)} bytes exceeds max_frame_bytes={max_frame_bytes}")
    try:
        payload = msgpack.unpackb(body, raw=False, strict_map_key=True, max_bin_len=max_frame_bytes,
                                  max_str_len=max_frame_bytes, max_array_len=MAX_TOKENS, max_map_len=0, max_ext_len=0,
                                  list_hook=_array_budget())
    except _TooManyArrays:
        raise WireError(f"{name}: more than MAX_ARRAYS={MAX_ARRAYS} arrays in the payload") from None
    except Exception as e:  # msgpack signals malformed input with several exception types
        raise WireError(f"{name}: malformed msgpack payload ({type(e).__name__}: {str(e)[:80]})") from None
    if type(payload) is not list or not payload:
        raise WireError(f"{name}: the payload must be an array [version, fields...], got {_what(payload)}")
    if type(payload[0]) is not int or payload[0] != PROTOCOL_VERSION:
        raise WireError(f"{name}: protocol version {_what(payload[0])} is not supported; "
                        f"this side speaks version {PROTOCOL_VERSION}")
    try:
        return _SPECS[cls].dec(payload[1:])
    except _Bad as e:
        raise WireError(f"{e.where(name)}: {e.rule}") from None
