import random
import time

import numpy as np

from ssd.spec.ngram import ngram_propose


def test_finds_the_continuation_of_a_repeated_ngram():
    assert ngram_propose([1, 2, 3, 4, 5, 9, 1, 2, 3], k=2) == [4, 5]


def test_prefers_the_longest_ngram_over_a_more_recent_shorter_one():
    history = [7, 8, 9, 10, 11, 0, 9, 20, 21, 0, 7, 8, 9]
    assert ngram_propose(history, k=2, max_ngram=3) == [10, 11]
    assert ngram_propose(history, k=2, max_ngram=1) == [20, 21]


def test_prefers_the_most_recent_occurrence_of_equal_length():
    assert ngram_propose([1, 2, 5, 1, 2, 6, 1, 2], k=1, max_ngram=2) == [6]


def test_returns_fewer_than_k_tokens_at_the_end_and_allows_overlap():
    assert ngram_propose([4, 4, 4], k=5, max_ngram=2) == [4]
    assert ngram_propose([1, 2, 3, 1, 2], k=5, max_ngram=2) == [3, 1, 2]


def test_empty_when_no_earlier_occurrence_or_too_short():
    assert ngram_propose([1, 2, 3, 4], k=3) == []
    assert ngram_propose([5], k=3) == []
    assert ngram_propose([], k=3) == []
    assert ngram_propose([1, 2, 1], k=0) == []
    assert ngram_propose([1, 2, 9, 2], k=2, min_ngram=2) == []


def test_matches_a_naive_scan_on_random_histories():
    rng = random.Random(0)
    for _ in range(300):
        h = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        expected = []
        for n in range(min(3, len(h) - 1), 0, -1):
            starts = [s for s in range(len(h) - n) if h[s:s + n] == h[len(h) - n:]]
            if starts:
                expected = h[starts[-1] + n: starts[-1] + n + 4]
                break
        assert ngram_propose(h, k=4) == expected, h


def test_fast_on_a_history_of_thousands_of_tokens():
    history = np.random.default_rng(0).integers(0, 50_000, 4096)
    start = time.perf_counter()
    for _ in range(100):
        ngram_propose(history, k=5, max_ngram=4)
    assert (time.perf_counter() - start) / 100 < 5e-3
