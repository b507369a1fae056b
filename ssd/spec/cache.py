"""The speculation cache: the draft's next speculations, keyed by the outcome they anticipate.

Contract
--------
* Rounds count verifications per sequence from ``first_round`` (default 0). While the target verifies
  round ``r`` the draft publishes, for each outcome ``(j, t*)`` it anticipates, the speculation for round
  ``r+1``: ``publish(seq_id, r, entries)``, each a ``wire.CacheEntry`` (the type the draft makes and the wire
  carries) naming its outcome ``(accepted, token)``, its tokens and their proposal rows. When the outcome of
  round ``r`` arrives the router calls ``lookup(seq_id, r, j, t*)`` and then ``advance(seq_id, r+1)``.
* Entries are keyed by ``(accepted, token)``; of two for one outcome in a publish the later wins. ``publish``
  raises ``ValueError`` (storing none of them) for an entry whose proposal does not fit its tokens
  (``spec.check.proposal_problem``: one row per token, each token in its row's support).
* A sequence holds the entries of one round only. A publish for a newer round replaces them, one for the
  held round merges into them, one for a round older than the held or current round is dropped (counted
  in ``stale_publishes``). ``advance`` drops entries older than the new current round.
* ``lookup`` returns ``(entry, HIT)`` or ``(None, reason)``:
  FORCED   the first round after prefill (``first_round``): the draft cannot have speculated on it;
  STALE    the round asked for is older than the current round, or the entries held are another round's
           (the draft or the router skipped an ``advance``);
  LATE     nothing is held for the sequence: the draft has not delivered for this round yet;
  NO_ENTRY this round's entries are held but the outcome was not anticipated.
* Every lookup increments exactly one counter in ``stats``. Lookups are O(1) dict accesses. Looking up,
  publishing to or advancing an unknown sequence raises ``KeyError``, except that publishes for an ended
  sequence are dropped silently (a draft may still be in flight when a request finishes).

Plain Python: the router imports this module and must not import torch.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from ssd.spec.check import proposal_problem
from ssd.wire import CacheEntry

__all__ = ["CacheStats", "LookupReason", "SpeculationCache"]


class LookupReason(str, Enum):
    HIT = "hit"
    NO_ENTRY = "no_entry"
    LATE = "late"
    STALE = "stale"
    FORCED = "forced"


@dataclass(slots=True)
class CacheStats:
    hit: int = 0
    no_entry: int = 0
    late: int = 0
    stale: int = 0
    forced: int = 0
    published_entries: int = 0
    stale_publishes: int = 0

    @property
    def lookups(self) -> int:
        return self.hit + self.no_entry + self.late + self.stale + self.forced

    @property
    def hit_rate(self) -> float:
        return self.hit / self.lookups if self.lookups else 0.0

    def count(self, reason: LookupReason) -> None:
        name = reason.value
        setattr(self, name, getattr(self, name) + 1)


@dataclass(slots=True)
class _SeqState:
    first_round: int
    current: int
    held_round: int | None = None
    entries: dict[tuple[int, int], CacheEntry] = field(default_factory=dict)


class SpeculationCache:
    """Per-sequence speculation entries for one round; see the module docstring for the contract."""

    def __init__(self) -> None:
        self._seqs: dict[int, _SeqState] = {}
        self.stats = CacheStats()

    def __len__(self) -> int:
        return sum(len(s.entries) for s in self._seqs.values())

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    def start_sequence(self, seq_id: int, first_round: int = 0) -> None:
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} is already in the speculation cache")
        self._seqs[seq_id] = _SeqState(first_round=first_round, current=first_round)

    def end_sequence(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def current_round(self, seq_id: int) -> int:
        return self._seqs[seq_id].current

    def advance(self, seq_id: int, round: int) -> None:
        state = self._seqs[seq_id]
        if round < state.current:
            raise ValueError(f"sequence {seq_id}: cannot go back from round {state.current} to {round}")
        state.current = round
        if state.held_round is not None and state.held_round < round:
            state.held_round = None
            state.entries.clear()

    def publish(self, seq_id: int, round: int, entries: Iterable[CacheEntry]) -> bool:
        """Store the speculations for the outcomes of ``round``; False when dropped as stale or ended."""
        fresh = {}
        for e in entries:
            problem = proposal_problem(e.tokens, e.proposal)
            if problem:
                raise ValueError(f"sequence {seq_id}: the entry for outcome ({e.accepted}, {e.token}): {problem}")
            fresh[(e.accepted, e.token)] = e
        state = self._seqs.get(seq_id)
        if state is None:
            return False
        if round < state.current or (state.held_round is not None and round < state.held_round):
            self.stats.stale_publishes += 1
            return False
        if state.held_round != round:
            state.entries.clear()
            state.held_round = round
        state.entries.update(fresh)
        self.stats.published_entries += len(fresh)
        return True

    def lookup(self, seq_id: int, round: int, j: int, t_star: int) -> tuple[CacheEntry | None, LookupReason]:
        state = self._seqs[seq_id]
        entry = None
        if round == state.first_round:
            reason = LookupReason.FORCED
        elif round < state.current:
            reason = LookupReason.STALE
        elif state.held_round is None:
            reason = LookupReason.LATE
        elif state.held_round != round:
            reason = LookupReason.STALE
        else:
            entry = state.entries.get((j, t_star))
            reason = LookupReason.HIT if entry is not None else LookupReason.NO_ENTRY
        self.stats.count(reason)
        return entry, reason
