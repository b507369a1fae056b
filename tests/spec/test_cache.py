import pytest

from ssd.spec.cache import LookupReason, SpeculationCache
from ssd.spec.check import proposal_problem
from ssd.wire import CacheEntry

R = LookupReason


def entry(j, t, tokens, proposal=None) -> CacheEntry:
    return CacheEntry(j, t, list(tokens), proposal)


def started(seq_id=1):
    cache = SpeculationCache()
    cache.start_sequence(seq_id)
    return cache


def test_hit_returns_the_entry_for_the_matching_outcome():
    cache = started()
    cache.advance(1, 1)
    a, b = entry(0, 42, (5, 6, 7)), entry(2, 17, (8, 9, 10))
    assert cache.publish(1, 1, [a, b])
    assert cache.lookup(1, 1, 2, 17) == (b, R.HIT)
    assert cache.lookup(1, 1, 0, 42) == (a, R.HIT)


def test_first_round_after_prefill_is_a_forced_miss_even_if_published():
    cache = started()
    cache.publish(1, 0, [entry(0, 3, (1,))])
    assert cache.lookup(1, 0, 0, 3) == (None, R.FORCED)


def test_unanticipated_outcome_is_no_entry_and_undelivered_round_is_late():
    cache = started()
    cache.advance(1, 1)
    assert cache.lookup(1, 1, 0, 3) == (None, R.LATE)
    cache.publish(1, 1, [entry(0, 3, (1,))])
    assert cache.lookup(1, 1, 0, 4) == (None, R.NO_ENTRY)
    assert cache.lookup(1, 1, 1, 3) == (None, R.NO_ENTRY)


def test_stale_round_never_hits():
    cache = started()
    cache.advance(1, 1)
    cache.publish(1, 1, [entry(0, 3, (1,))])
    assert cache.lookup(1, 2, 0, 3) == (None, R.STALE)
    cache.advance(1, 2)
    assert len(cache) == 0
    assert cache.lookup(1, 1, 0, 3) == (None, R.STALE)
    assert not cache.publish(1, 1, [entry(0, 3, (1,))])
    assert cache.lookup(1, 2, 0, 3) == (None, R.LATE)
    assert cache.stats.stale_publishes == 1


def test_newer_round_replaces_and_same_round_merges():
    cache = started()
    cache.advance(1, 1)
    cache.publish(1, 1, [entry(0, 3, (1,))])
    cache.publish(1, 1, [entry(1, 4, (2,))])
    assert len(cache) == 2
    cache.publish(1, 2, [entry(0, 5, (7, 8))])
    assert len(cache) == 1
    assert not cache.publish(1, 1, [entry(0, 3, (1,))])
    cache.advance(1, 2)
    found, reason = cache.lookup(1, 2, 0, 5)
    assert reason is R.HIT and found.tokens == [7, 8]


def test_end_sequence_frees_everything_and_ignores_late_publishes():
    cache = started()
    cache.start_sequence(2)
    cache.advance(1, 1)
    cache.publish(1, 1, [entry(j, t, (t,)) for j in range(3) for t in range(4)])
    assert len(cache) == 12
    cache.end_sequence(1)
    assert len(cache) == 0 and 1 not in cache and cache.num_sequences == 1
    assert not cache.publish(1, 1, [entry(0, 0, (0,))])
    with pytest.raises(KeyError):
        cache.lookup(1, 1, 0, 0)


def test_counters_count_each_lookup_once_by_reason():
    cache = started()
    cache.lookup(1, 0, 0, 1)
    cache.advance(1, 1)
    cache.lookup(1, 1, 0, 1)
    cache.publish(1, 1, [entry(0, 1, (2,)), entry(0, 2, (3,))])
    cache.lookup(1, 1, 0, 1)
    cache.lookup(1, 1, 0, 9)
    cache.advance(1, 2)
    cache.lookup(1, 1, 0, 1)
    s = cache.stats
    assert (s.forced, s.late, s.hit, s.no_entry, s.stale) == (1, 1, 1, 1, 1)
    assert s.lookups == 5 and s.hit_rate == pytest.approx(0.2) and s.published_entries == 2


def test_publish_validates_each_entrys_proposal_against_its_tokens():
    assert proposal_problem([3, 4], [([3, 5], [0.5, 0.5]), ([4], [1.0])]) is None
    assert proposal_problem([3], None) is None
    assert "outside the support" in proposal_problem([3], [([5], [1.0])])
    assert "1 rows for 2 tokens" in proposal_problem([3, 4], [([3], [1.0])])
    assert "as many probabilities" in proposal_problem([3], [([3, 5], [1.0])])
    cache = started()
    cache.advance(1, 1)
    good = entry(0, 3, (3, 4), [([3, 5], [0.5, 0.5]), ([4], [1.0])])
    assert cache.publish(1, 1, [good])
    for bad in (entry(1, 3, (3,), [([5], [1.0])]), entry(1, 3, (3, 4), [([3], [1.0])])):
        with pytest.raises(ValueError, match="outcome \\(1, 3\\)"):
            cache.publish(1, 1, [entry(2, 2, (2,)), bad])
    assert len(cache) == 1 and cache.lookup(1, 1, 0, 3) == (good, R.HIT)   # a refused publish stores nothing


def test_advance_cannot_go_back_and_start_twice_is_rejected():
    cache = started()
    cache.advance(1, 3)
    with pytest.raises(ValueError):
        cache.advance(1, 2)
    with pytest.raises(ValueError):
        cache.start_sequence(1)


def test_two_sequences_with_the_same_round_and_outcome_get_their_own_entries():
    cache = started(1)
    cache.start_sequence(2)
    for seq in (1, 2):
        cache.advance(seq, 1)
    mine, theirs = entry(2, 17, (5, 6, 7)), entry(2, 17, (8, 9, 10))
    assert cache.publish(1, 1, [mine])
    assert cache.publish(2, 1, [theirs])
    assert cache.lookup(1, 1, 2, 17) == (mine, R.HIT)
    assert cache.lookup(2, 1, 2, 17) == (theirs, R.HIT)
    cache.advance(1, 2)  # one sequence moving on leaves the other's entries alone
    assert cache.lookup(2, 1, 2, 17) == (theirs, R.HIT)
    assert len(cache) == 1


def test_an_entry_published_for_one_sequence_is_never_found_by_another():
    cache = started(1)
    cache.start_sequence(2)
    for seq in (1, 2):
        cache.advance(seq, 1)
    cache.publish(1, 1, [entry(0, 3, (1, 2))])
    assert cache.lookup(2, 1, 0, 3) == (None, R.LATE)
    cache.publish(2, 1, [entry(1, 4, (9,))])
    assert cache.lookup(2, 1, 0, 3) == (None, R.NO_ENTRY)
    assert cache.lookup(1, 1, 1, 4) == (None, R.NO_ENTRY)


def test_another_sequence_on_an_older_round_never_hits_a_newer_rounds_entry():
    cache = started(1)
    cache.start_sequence(2)
    cache.advance(1, 2)
    cache.advance(2, 1)
    cache.publish(1, 2, [entry(0, 3, (1,))])
    cache.publish(2, 1, [entry(0, 3, (2,))])
    cache.advance(2, 2)  # sequence 2's round-1 entries are stale now; sequence 1's round-2 entry is not its own
    assert cache.lookup(2, 2, 0, 3) == (None, R.LATE)
    assert cache.lookup(2, 1, 0, 3) == (None, R.STALE)
    assert cache.lookup(1, 2, 0, 3)[0].tokens == [1]
    assert not cache.publish(2, 1, [entry(0, 3, (2,))])  # a late publish for the stale round
    assert cache.lookup(2, 2, 0, 3) == (None, R.LATE)
