"""The data plane's framing: the protocol version, the message registry and ``encode`` / ``decode``.

A message is two frames ``[type, payload]``: one type byte (``MESSAGE_TYPES``), and a msgpack array
``[PROTOCOL_VERSION, field_1, ..., field_n]``. ``_wire(type_byte, **kinds)`` registers a dataclass with the kinds
of its fields (``ssd.wire.kinds``), in order; with a type byte it is a message. ``decode`` checks frame count,
type byte and payload size before unpacking, bounds the unpacking (lengths, depth, ``MAX_ARRAYS`` arrays) and
refuses any version but ``PROTOCOL_VERSION``, raising nothing but ``WireError``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import msgpack

from ssd.wire.kinds import MAX_FRAME_BYTES, MAX_TOKENS, WireError, _Array, _Bad, _List, _what

if TYPE_CHECKING:
    from ssd.wire import Message

PROTOCOL_VERSION = 8
MAX_ARRAYS = 1 << 18         # msgpack arrays per payload (an empty array is 1 byte on the wire, 56 in memory)


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
