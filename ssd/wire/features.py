"""The feature block's layout on the data plane: the target's final pre-norm hidden states as float16 rows.

A block is ``(start, data)``: ``start`` the position of its first row, ``data`` its rows, row-major, each value
a little-endian float16 (``FEATURE_DTYPE``), one row per position. The row size (hidden size) is not on the
wire: ``feature_row_bytes(dim)`` is a row's bytes and ``feature_rows(data, dim)`` checks ``len(data)`` against
it (the torch side: ``ssd/engine/features.py``). Senders keep a message's feature bytes within
``MAX_FEATURE_BYTES``. Also the kinds of feature fields: ``FEATURES`` (a block or None) and ``SEQ_FEATURES``
(``(seq, start, data)`` per sequence).
"""
from __future__ import annotations

from ssd.wire.kinds import ID, MAX_FRAME_BYTES, WireError, _Bad, _List, _Optional, _tuple, _what

MAX_FEATURE_BYTES = 4 << 20  # feature bytes senders put in one message (a quarter frame: room for the rest)
FEATURE_DTYPE = "<f2"        # a feature value: little-endian float16 (numpy's name)
FEATURE_VALUE_BYTES = 2
Features = tuple[int, bytes]   # (start, float16 rows): a feature block


def feature_row_bytes(dim: int) -> int:
    """The bytes of one feature row of `dim` values."""
    return FEATURE_VALUE_BYTES * dim


def feature_rows(data: bytes, dim: int) -> int:
    """How many rows of `dim` values a feature block's `data` holds; WireError unless a whole number."""
    if dim <= 0 or len(data) % feature_row_bytes(dim):
        raise WireError(f"feature data of {len(data)} bytes is not a whole number of float16 rows of {dim}")
    return len(data) // feature_row_bytes(dim)


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


FEATURES = _Optional(_tuple(ID, _Halves()))   # a block or None
SEQ_FEATURES = _List(_tuple(ID, ID, _Halves()), "MAX_ITEMS")
