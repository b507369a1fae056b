"""ssd: an outcome that finds the draft late waits for the draft's entries instead of asking for a JIT
(`RoundCore.next`, `RoundCore.resolve_wait`), with no workers: replies are handed to the core and what it sends is
recorded (tests/round/fakes.py)."""
import pytest

from ssd import wire
from ssd.params import SamplingParams
from ssd.round import CoreConfig, Phase
from tests.round.fakes import Rig


def make_rig(drafts=1, **cfg) -> Rig:
    cfg.setdefault("adaptive", False)
    return Rig(CoreConfig(mode="ssd", **cfg), drafts=[None] * drafts)


@pytest.fixture
def rig():
    rig = make_rig()
    yield rig
    rig.core.shutdown("the test is over")


def late_outcome(rig, j=1, token=4):
    """A request through its forced first round (a JIT, or an n-gram backup) to a verify whose DraftRound the draft
    has not answered; the target then answers outcome (j, token). Returns the request."""
    core = rig.core
    req = core.submit(f"late{len(core.active)}", [5, 6, 7], SamplingParams(max_tokens=40), mode="ssd")
    core.take_new()
    rig.take(wire.Prefill)
    core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.01, []))
    core.dispatch()
    for jit in rig.take(wire.Jit):   # none with n-gram backups
        core.on_message(req.draft, wire.JitResult(jit.batch_id, [(req.seq, [11, 12, 13], None)], 0.005))
    core.dispatch()
    (verify,), (draft_round,) = rig.take(wire.Verify), rig.take(wire.DraftRound)
    assert draft_round.items[0].round == req.round.number + 1
    core.on_message(rig.target, wire.Outcomes(verify.batch_id, [wire.Outcome(req.seq, j, token)], 0.05, []))
    return req


def entries(req, *outcomes, round_=None):
    """The draft's CacheEntries for `req`'s current round: one entry [20 + j, 21, 22] per outcome (j, token)."""
    return wire.CacheEntries(req.seq, req.round.number if round_ is None else round_,
                             [wire.CacheEntry(j, t, [20 + j, 21, 22], None) for j, t in outcomes], 0.01)


def test_a_late_outcome_waits_and_runs_from_the_entry_the_draft_publishes_then(rig):
    core = rig.core
    req = late_outcome(rig, j=1, token=4)
    assert req.phase is Phase.AWAIT and req.round.awaiting == (1, 4)
    rig.clock.advance(0.012)
    core.dispatch()
    assert not rig.take(wire.Jit) and not rig.take(wire.Verify)   # neither a JIT nor a verify without its tokens
    assert req.stats.cache == {"forced": 1, "late": 1} and req.stats.waits == {}
    core.on_message(req.draft, entries(req, (0, 4), (1, 4), (1, 8)))
    assert req.phase is Phase.READY and req.round.source == "cache" and req.round.tokens == [21, 21, 22]
    assert req.round.awaiting is None
    assert req.stats.waits == {"hit": 1} and req.stats.cache == {"forced": 1, "late": 1}
    assert req.stats.served_rate == 1.0 and req.stats.hit_rate == 0.0
    assert req.stats.backups == {"jit": 1}   # only the forced first round's
    assert core.times.wait_s == pytest.approx(0.012)
    core.dispatch()
    (verify,) = rig.take(wire.Verify)
    assert verify.items[0].tokens == [21, 21, 22] and not rig.take(wire.Jit)
    policy = core.planner._fanout[req.draft]
    assert policy._late == 1 and policy._seen == 1   # the draft was late all the same: its fan-out policy hears it


def test_entries_without_the_outcome_end_the_wait_with_a_jit(rig):
    core = rig.core
    req = late_outcome(rig, j=0, token=4)
    core.on_message(req.draft, entries(req, (0, 5), (1, 4)))
    assert req.phase is Phase.JIT and req.stats.waits == {"no_entry": 1}
    core.dispatch()
    (jit,) = rig.take(wire.Jit)
    assert jit.items[0].seq == req.seq and req.stats.backups == {"jit": 2}


def test_an_older_rounds_entries_do_not_end_the_wait(rig):
    core = rig.core
    req = late_outcome(rig)
    core.on_message(req.draft, entries(req, (1, 4), round_=req.round.number - 1))
    assert req.phase is Phase.AWAIT and req.stats.waits == {}
    core.on_message(req.draft, entries(req, (1, 4)))
    assert req.phase is Phase.READY and req.stats.waits == {"hit": 1}


def test_entries_the_router_refuses_end_the_wait_with_a_jit(rig):
    core = rig.core
    req = late_outcome(rig, j=1, token=4)
    bad = wire.CacheEntries(req.seq, req.round.number, [wire.CacheEntry(1, 4, [10 ** 6], None)], 0.01)
    core.on_message(req.draft, bad)   # a token outside the vocabulary: never verified
    assert req.phase is Phase.JIT and req.stats.waits == {"no_entry": 1}


def test_a_draft_error_for_the_sequence_ends_the_wait_with_a_jit(rig):
    core = rig.core
    req = late_outcome(rig)
    core.on_message(req.draft, wire.Error("invalid_argument", "token ids must be in range", req.seq))
    assert req.phase is Phase.JIT and req.stats.waits == {"failed": 1}
    core.dispatch()
    assert len(rig.take(wire.Jit)) == 1


def test_a_draft_that_lost_the_sequence_rebuilds_it_and_the_wait_ends_with_an_ngram_backup(rig):
    core = rig.core
    req = late_outcome(rig)
    rig.take(wire.DraftAdd)
    core.on_message(req.draft, wire.Error("unknown_sequence", "not on this draft", req.seq))
    assert rig.take(wire.DraftAdd) and req.phase is Phase.READY and req.round.source in ("ngram", "none")
    assert req.stats.waits == {"failed": 1}


def test_a_draft_that_dies_during_the_wait_hands_the_sequence_on_with_an_ngram_backup():
    rig = make_rig(drafts=2)
    core = rig.core
    try:
        req = late_outcome(rig)
        dead = req.draft
        dead.alive = False
        core.members.draft_died(dead)
        assert req.phase is Phase.READY and req.round.source in ("ngram", "none")
        assert req.stats.waits == {"failed": 1} and req.draft is not None and req.draft is not dead
        core.on_message(dead, entries(req, (1, 4)))   # the dead draft's late entries change nothing
        assert req.phase is Phase.READY and req.stats.waits == {"failed": 1}
    finally:
        core.shutdown("the test is over")


def test_a_target_that_dies_during_the_wait_ends_it_and_the_restored_sequence_takes_a_backup():
    """The outcome came; then its target died. The sequence moves to another target (Restore), which ends the wait
    as failed: the Restore's answer starts the next round with a backup, and the old round's entries, when they
    come, no longer concern it."""
    rig = Rig(CoreConfig(mode="ssd", adaptive=False), targets=(None, None), drafts=[None])
    core = rig.core
    try:
        req = late_outcome(rig)
        assert req.phase is Phase.AWAIT and req.target is rig.targets[0]
        rig.clock.advance(0.004)
        rig.targets[0].alive = False
        core.members.target_died(rig.targets[0])
        assert req.phase is Phase.RESTORE and req.target is rig.targets[1] and req.round.awaiting is None
        assert req.stats.waits == {"failed": 1} and core.times.wait_s == pytest.approx(0.004)
        assert rig.metrics.waits == [("failed", pytest.approx(0.004))]
        core.on_message(req.draft, entries(req, (1, 4)))   # the old round's entries come after all
        assert req.phase is Phase.RESTORE and req.stats.waits == {"failed": 1}
        core.on_message(rig.targets[1], wire.Restored([req.seq], 0.01))
        assert req.phase is Phase.JIT
        core.dispatch()
        assert len(rig.take(wire.Jit)) == 1
    finally:
        core.shutdown("the test is over")


@pytest.mark.parametrize("cfg", [{"await_late": False}, {"backup": "ngram"}])
def test_without_the_wait_or_a_jit_backup_a_late_outcome_takes_its_backup_at_once(cfg):
    rig = make_rig(**cfg)
    core = rig.core
    try:
        req = late_outcome(rig, j=0)   # (n-gram backups may have proposed nothing)
        assert req.phase is not Phase.AWAIT and req.stats.waits == {}
        assert req.stats.cache == {"forced": 1, "late": 1}
        assert req.phase is (Phase.JIT if cfg.get("backup", "jit") == "jit" else Phase.READY)
    finally:
        core.shutdown("the test is over")


def test_a_free_target_waits_for_a_sequence_awaiting_entries_as_for_a_jit():
    """Two sequences on one target: one waits for the draft's entries while the other is ready. The target lingers
    (as for a JIT), so the two verify together once the entries come."""
    rig = make_rig()
    core = rig.core
    try:
        a = late_outcome(rig)
        b = core.submit("b", [5, 6, 7], SamplingParams(max_tokens=40), mode="ssd")
        core.take_new()
        rig.take(wire.Prefill)
        core.on_message(rig.target, wire.Prefilled([(b.seq, 9)], 0.01, []))
        core.dispatch()
        (jit,) = rig.take(wire.Jit)
        core.on_message(b.draft, wire.JitResult(jit.batch_id, [(b.seq, [11, 12, 13], None)], 0.005))
        assert a.phase is Phase.AWAIT and b.phase is Phase.READY
        core.dispatch()
        assert not rig.take(wire.Verify)   # b lingers for a
        core.on_message(a.draft, entries(a, (1, 4)))
        core.dispatch()
        (verify,) = rig.take(wire.Verify)
        assert sorted(it.seq for it in verify.items) == sorted([a.seq, b.seq])
    finally:
        core.shutdown("the test is over")


def test_a_waiting_request_can_be_aborted_and_its_late_entries_are_ignored(rig):
    core = rig.core
    req = late_outcome(rig)
    assert req.phase is Phase.AWAIT
    core.abort(req)
    core.step()
    assert req.seq not in core.active
    core.on_message(rig.drafts[0], entries(req, (1, 4)))
    assert req.stats.waits == {}


def test_a_requests_reported_cache_hits_count_the_waits_that_hit(rig):
    """The per-request statistics (gRPC `SpeculationStats`, the OpenAI reply's `ssd` field) say how many rounds ran
    from the cache and how many took a backup: a wait that found its entry is the first, one that found none the
    second."""
    from services.router.openai_replies import _stats
    from services.router.servicer import stats_pb

    core = rig.core
    req = late_outcome(rig, j=1, token=4)
    core.on_message(req.draft, entries(req, (1, 4)))   # a wait that hit
    core.dispatch()
    (verify,) = rig.take(wire.Verify)
    core.on_message(rig.target, wire.Outcomes(verify.batch_id, [wire.Outcome(req.seq, 0, 5)], 0.05, []))
    core.on_message(req.draft, entries(req, (1, 4)))   # late again, and the entries lack (0, 5)
    st = req.stats
    assert st.cache == {"forced": 1, "late": 2} and st.waits == {"hit": 1, "no_entry": 1}
    assert (st.served, st.backed_up) == (1, 2)
    pb = stats_pb(st, "ssd")
    assert (pb.cache_hits, pb.cache_misses) == (1, 2)
    assert {k: v for k, v in _stats("ssd", st, 0.1, 1.0).items() if k.startswith("cache")} == \
        {"cache_hits": 1, "cache_misses": 2}
