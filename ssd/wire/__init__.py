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
  ``feature_rows(data, dim)`` checks ``len(data)`` against it (the torch side: ``ssd/engine/features.py``).
  Senders keep a message's feature bytes within
  ``MAX_FEATURE_BYTES``, dropping the oldest rows first (a feature-reading draft reads missing rows as zeros;
  exactness never depends on features).
* Flags are msgpack booleans; decode refuses ints in their place.
* Fields added after version 1 (``Ready.feature_size``, the ``features`` fields; ``DraftRound.fanout`` in
  version 3; in version 4 the penalties, biases, ``min_tokens`` and ``logprobs`` of ``SamplingSpec``,
  ``PrefillItem.prompt_len`` and the ``logprobs`` of ``Prefilled`` and ``Outcomes``; in version 5
  ``SamplingSpec.seed_stream`` and the ``coupled``, ``top_p`` and ``min_p`` of ``DraftParamsSpec``; in version 6
  ``SamplingSpec.constraint_kind`` and ``constraint``, a structured-output grammar; in version 7
  ``SamplingSpec.prompt_logprobs``, ``Prefilled.prompt_logprobs``, ``DraftParamsSpec.constraint_kind`` and
  ``constraint``, and ``DraftAddItem.prompt_len``; in version 8 ``DraftRoundItem.depth``) come last and have
  defaults (0, False, empty, None, no penalty), so a message built without them means "no features" ("the
  draft's own fan-out", "no penalty", "no logprobs"); on the wire every field is always present.
* The codec checks each field, not relations between fields (rows vs tokens): those are the receivers'.

Type bytes::

    0x01 Hello     0x02 Ready      0x03 Ping          0x04 Pong
    0x10 Prefill   0x11 Prefilled  0x20 Verify        0x21 Outcomes
    0x30 DraftAdd  0x31 DraftRound 0x32 CacheEntries  0x40 Jit
    0x41 JitResult 0x50 Free       0x7F Error

Layout
------
``kinds`` (the limits, ``WireError`` and the field kinds), ``features`` (the feature block's layout and kinds),
``codec`` (version, registry, ``encode`` / ``decode``), and the messages: ``control`` (handshake, liveness,
``Free``, ``Error``), ``target`` (prefill, restore, verify) and ``draft`` (adds, rounds, cache entries, JIT).
Everything public is here: ``from ssd import wire; wire.Verify(...)``.
"""
from __future__ import annotations

from ssd.wire.codec import MAX_ARRAYS, MESSAGE_TYPES, PROTOCOL_VERSION, decode, encode
from ssd.wire.control import Error, Free, Hello, Ping, Pong, Ready
from ssd.wire.draft import (CacheEntries, CacheEntry, DraftAdd, DraftAddItem, DraftParamsSpec, DraftRound,
                            DraftRoundItem, Jit, JitItem, JitResult)
from ssd.wire.features import FEATURE_DTYPE, MAX_FEATURE_BYTES, Features, feature_row_bytes, feature_rows
from ssd.wire.kinds import (MAX_ENTRIES, MAX_FRAME_BYTES, MAX_ITEMS, MAX_ROW_ENTRIES, MAX_ROWS, MAX_STR, MAX_TOKENS,
                            Row, WireError)
from ssd.wire.target import (Outcome, Outcomes, Prefill, PrefillItem, Prefilled, PromptLogprobs, Restore, Restored,
                             SamplingSpec, SeqLogprobs, Verify, VerifyItem)

__all__ = ["FEATURE_DTYPE", "MAX_ARRAYS", "MAX_ENTRIES", "MAX_FEATURE_BYTES", "MAX_FRAME_BYTES", "MAX_ITEMS",
           "MAX_ROWS", "MAX_ROW_ENTRIES", "MAX_STR", "MAX_TOKENS", "MESSAGE_TYPES", "PROTOCOL_VERSION",
           "CacheEntries", "CacheEntry", "DraftAdd", "DraftAddItem", "DraftParamsSpec", "DraftRound",
           "DraftRoundItem", "Error", "Features", "Free", "Hello", "Jit", "JitItem", "JitResult", "Message",
           "Outcome", "Outcomes", "Ping", "Pong", "Prefill", "PrefillItem", "Prefilled", "PromptLogprobs", "Ready",
           "Restore", "Restored", "Row", "SamplingSpec", "SeqLogprobs", "Verify", "VerifyItem", "WireError", "decode",
           "encode", "feature_row_bytes", "feature_rows"]

Message = (Hello | Ready | Ping | Pong | Prefill | Prefilled | Restore | Restored | Verify | Outcomes | DraftAdd
           | DraftRound | CacheEntries | Jit | JitResult | Free | Error)
