"""The data plane's field kinds: how every field of a message is checked on encode and decode, and the limits
they enforce (``MAX_*``).

A kind has ``enc(v)`` (lenient about containers: tuples, numpy arrays and scalars become lists and Python
numbers) and ``dec(v)`` (strict: exactly the msgpack types, lists returned, tuples for tuple-typed items); both
raise ``_Bad`` naming the rule, and the field path gathers as it unwinds (``WireError`` gets the text). Kinds:
ints in [0, 2**bits), finite floats in a range, bounded strings (or one of a few choices), msgpack booleans,
optional values, bounded lists (``_Ints``: int lists checked in bulk), fixed arrays (a dataclass's fields, or a
tuple) and proposal rows (``_Rows``: int32 ids and float32 probabilities as two bins). The float16 feature
block is ``ssd.wire.features``. ``ssd/tp_wire.py`` builds its own codec from these kinds.
"""
from __future__ import annotations

import math
import sys
from array import array
from dataclasses import fields
from itertools import repeat
from operator import attrgetter

import numpy as np

MAX_FRAME_BYTES = 16 << 20   # bytes per payload frame (decode/encode argument overrides it)
MAX_ITEMS = 4096             # items per batch message, seqs per Free
MAX_TOKENS = 1 << 20         # ints per token list
MAX_ENTRIES = 4096           # entries per CacheEntries
MAX_ROWS = 1024              # rows per proposal, ints per fanout
MAX_ROW_ENTRIES = 1 << 18    # support size of one proposal row
MAX_STR = 1 << 16            # characters per string
assert sys.byteorder == "little" and array("i").itemsize == array("f").itemsize == 4, "needs a little-endian host"


class WireError(ValueError):
    """A message that cannot be encoded or decoded; the text names the message type and the field."""


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


def _rows_ok(ids: bytes, probs: bytes, code: str = "f") -> bool:
    """ids >= 0 and probs in [0, 1] (no NaN). float32 (the data plane) in one pass over the bytes: both
    little-endian, ids >= 0 iff each high byte < 0x80; non-negative float32 sort like their bits as uint32, and a
    sign bit, inf or NaN puts the bits above 1.0's. float64 (the tensor-parallel codec) through numpy."""
    if code == "f":
        return ids[3::4].isascii() and (not probs or int(np.frombuffer(probs, "<u4").max()) <= 0x3F800000)
    p = np.frombuffer(probs, "<f8")
    return ids[3::4].isascii() and bool(((p >= 0.0) & (p <= 1.0)).all())


class _Rows:
    """A proposal: rows ``(ids, probs)`` <-> arrays ``[int32 LE bin, float LE bin]``, checked in one pass; the
    probabilities are float32 (`code` "f", the data plane) or float64 ("d", the tensor-parallel codec, so every
    rank verifies with the leader's numbers)."""

    def __init__(self, code: str = "f"):
        self.code, self.width = code, array(code).itemsize

    def dec(self, v):
        if type(v) is not list or len(v) > MAX_ROWS:
            raise _Bad(f"expected a list of at most MAX_ROWS={MAX_ROWS} rows, got {_what(v)}")
        w = self.width
        for i, row in enumerate(v):
            if type(row) is not list or len(row) != 2 or type(row[0]) is not bytes or type(row[1]) is not bytes:
                self._bad(i, f"a row is an array [ids: bin, probs: bin], got {_what(row)}")
            n = len(row[0])
            if n * w != 4 * len(row[1]) or n % 4 or not 0 < n <= 4 * MAX_ROW_ENTRIES:
                self._bad(i, f"ids and probs must hold the same number (1..MAX_ROW_ENTRIES={MAX_ROW_ENTRIES}) "
                             f"of int32/{8 * w}-bit float values, got {n} and {len(row[1])} bytes")
        ib, pb = b"".join([r[0] for r in v]), b"".join([r[1] for r in v])
        self._check(v, ib, pb)
        ids, probs = array("i"), array(self.code)
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
                out.append([array("i", ids).tobytes(), array(self.code, probs).tobytes()])
            except (TypeError, ValueError, OverflowError, RuntimeError):
                self._bad(i, f"a row is a pair (ids, probs): {_ROW_RULE}")
            n, m = len(out[-1][0]) // 4, len(out[-1][1]) // self.width
            if not 0 < n == m <= MAX_ROW_ENTRIES:
                self._bad(i, f"ids and probs must have the same length in 1..MAX_ROW_ENTRIES={MAX_ROW_ENTRIES}, "
                             f"got {n} and {m}")
        self._check(out, b"".join([r[0] for r in out]), b"".join([r[1] for r in out]))
        return out

    def _check(self, rows: list, ib: bytes, pb: bytes) -> None:
        if not _rows_ok(ib, pb, self.code):
            self._bad(next(i for i, r in enumerate(rows) if not _rows_ok(*r, self.code)), _ROW_RULE)

    @staticmethod
    def _bad(i: int, rule: str):
        e = _Bad(rule)
        e.path.append(f"[{i}]")
        raise e


ID, U64, TOKEN, STR, TOKENS = _Int(), _Int(64), _Int(31), _Str(), _Ints("MAX_TOKENS")
SECONDS, UNIT, SEED = _Float(0.0), _Float(0.0, 1.0), _Optional(_Int(64))
FLAG, PROPOSAL = _Bool(), _Optional(_Rows())
PENALTY, REPETITION = _Float(-2.0, 2.0), _Float(0.01, 100.0)   # ssd.params.PENALTY_RANGE, REPETITION_RANGE
LOGIT_BIAS = _List(_tuple(TOKEN, _Float(-100.0, 100.0)), "MAX_ROW_ENTRIES")   # (token id, bias) pairs
LOGPROBS = _List(_Float(-math.inf, 0.0), "MAX_ROW_ENTRIES")   # finite log-probabilities
Row = tuple[list[int], list[float]]   # a proposal row (ids, probs)
