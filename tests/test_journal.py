"""The request journal against a real redis-server: write-ahead appends, fencing by claim, finish, outages."""
import threading
import time

import pytest

from services.router.journal import (Fenced, JournalError, JournalUnavailable, RequestJournal, pack, unpack,
                                     unpack_logprobs)
from ssd.params import TokenLogprob
from tests.redis_server import RedisServer, needs_redis

pytestmark = needs_redis

PARAMS = {"temperature": 0.0, "max_tokens": 8, "stop": [], "mode": "", "k": 0}


@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path, persist=True).start()
    yield server
    server.stop()


def test_pack_round_trips_and_refuses_a_torn_journal():
    assert unpack(pack([0, 7, 49151, 2**32 - 1])) == [0, 7, 49151, 2**32 - 1]
    with pytest.raises(JournalError, match="corrupt"):
        unpack(b"\x01\x02\x03")


def test_begin_append_finish_and_claim(redis):
    a, b = RequestJournal(redis.url, "router-a"), RequestJournal(redis.url, "router-b")
    assert a.begin("r1", [1, 2, 3], PARAMS, "fp") == 1
    assert a.append("r1", 1, [10, 11]) == 2 and a.append("r1", 1, [12]) == 3
    with pytest.raises(ValueError, match="already running"):
        b.begin("r1", [9], PARAMS, "fp")
    rec = b.claim("r1")
    assert (rec.prompt, rec.tokens, rec.params, rec.fingerprint, rec.state, rec.epoch) == \
        ([1, 2, 3], [10, 11, 12], PARAMS, "fp", "running", 2)
    with pytest.raises(Fenced, match="resumed on another router"):  # the old owner can no longer extend it
        a.append("r1", 1, [99])
    with pytest.raises(Fenced):
        a.finish("r1", 1, "length")
    assert b.append("r1", 2, [13]) == 4
    b.finish("r1", 2, "length")
    rec = a.claim("r1")
    assert rec.tokens == [10, 11, 12, 13] and (rec.state, rec.finish) == ("finished", "length")
    assert b.claim("unknown") is None
    assert a.begin("r1", [5], PARAMS, "fp2") == 1  # a finished id may be reused
    assert a.claim("r1").tokens == []


def test_logprobs_are_journaled_with_their_tokens(redis):
    a, b = RequestJournal(redis.url, "router-a"), RequestJournal(redis.url, "router-b")
    rows = [TokenLogprob(10, -0.25, ((10, -0.25), (3, -1.5))), TokenLogprob(11, -2.0000000000000004, ()),
            TokenLogprob(12, -1e-9, ((12, -1e-9),))]
    a.begin("lp", [1], PARAMS, "fp")
    a.append("lp", 1, [10, 11], rows[:2])
    a.append("lp", 1, [12], rows[2:])
    rec = b.claim("lp")
    assert rec.tokens == [10, 11, 12] and rec.logprobs == rows   # exactly, floats included
    a.begin("plain", [1], PARAMS, "fp")
    a.append("plain", 1, [5])
    assert b.claim("plain").logprobs == []
    with pytest.raises(JournalError, match="corrupt logprob journal"):
        unpack_logprobs(b"[1, 2\n")


def test_records_expire_after_their_ttl(redis):
    j = RequestJournal(redis.url, "r", ttl_s=1)
    j.begin("short", [1], PARAMS, "fp")
    keys = j.keys("short")
    assert all(0 < j._redis.pttl(k) <= 1000 for k in keys)   # written with the 1 s TTL (claim would refresh it)
    deadline = time.monotonic() + 10
    while j._redis.exists(*keys):
        assert time.monotonic() < deadline, f"the record outlived its 1 s TTL: {[j._redis.pttl(k) for k in keys]}"
        time.sleep(0.05)
    assert j.claim("short") is None


def test_an_outage_longer_than_the_retry_window_is_journal_unavailable(tmp_path):
    server = RedisServer(tmp_path).start()
    j = RequestJournal(server.url, "r", retry_s=0.3, timeout_s=0.2)
    j.begin("x", [1], PARAMS, "fp")
    server.kill()
    t0 = time.monotonic()
    with pytest.raises(JournalUnavailable, match="unreachable during append"):
        j.append("x", 1, [2])
    assert time.monotonic() - t0 < 3
    with pytest.raises(JournalError, match="cannot reach the request-state Redis"):
        j.check()


def test_a_restart_within_the_retry_window_loses_nothing_with_persistence(redis):
    j = RequestJournal(redis.url, "r", retry_s=8.0, timeout_s=0.5)
    j.begin("p", [1, 2], PARAMS, "fp")
    j.append("p", 1, [3, 4])
    redis.kill()
    restarter = threading.Timer(1.0, redis.start)
    restarter.start()
    try:
        assert j.append("p", 1, [5]) == 3  # blocks through the outage, then lands after the restart
    finally:
        restarter.join()
    assert j.claim("p").tokens == [3, 4, 5]
