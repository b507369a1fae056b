"""How the round core hands verify batches to a target (ssd/round/batches.py: the verify hold and the JIT linger)
and the fan-out its DraftRounds carry (ssd/round/planner.py), with no workers: replies are handed to the core and
what it sends is recorded (tests/round/fakes.py). Also the target's side of the bargain: every Verify is answered,
even when none of its items could run.
"""
import pytest

from ssd import wire
from ssd.engine.target_handler import TargetHandler
from ssd.engine.target_tp import build_target
from ssd.models.loader import load_model
from ssd.params import FinishReason, SamplingParams
from ssd.round import CoreConfig, Phase
from ssd.round.planner import HOLD_ROUNDS
from ssd.round.state import MAX_TARGET_FAILURES
from ssd.spec.backup import LinearEma
from ssd.spec.fanout import FIRST_WINDOW
from tests.round.fakes import Clock, Rig, events


def make_rig(clock=None, **cfg) -> Rig:
    """ar over one target."""
    return Rig(CoreConfig(mode="ar", adaptive=False, **cfg), clock=clock)


@pytest.fixture
def rig():
    rig = make_rig()
    yield rig
    rig.core.shutdown("the test is over")


def admit(rig, n=1, max_tokens=40) -> list:
    reqs = [rig.core.submit(f"r{len(rig.core.active)}-{i}", [5, 6, 7], SamplingParams(max_tokens=max_tokens),
                            mode="ar") for i in range(n)]
    rig.core.take_new()
    return reqs


def prefilled(rig, reqs, token=9):
    rig.take(wire.Prefill)
    rig.core.on_message(rig.target, wire.Prefilled([(r.seq, token) for r in reqs], 0.01, []))


def answer(rig, verify, token=4):
    rig.core.on_message(rig.target, wire.Outcomes(verify.batch_id, [wire.Outcome(it.seq, len(it.tokens), token)
                                                                    for it in verify.items], 0.05, []))


def test_sequences_out_of_step_join_the_next_batch_instead_of_forming_their_own(rig):
    core = rig.core
    a, = admit(rig)
    prefilled(rig, [a])
    core.dispatch()
    (first,), = [rig.take(wire.Verify)]
    b, = admit(rig)              # arrives while a's verify is out
    prefilled(rig, [b])
    core.dispatch()
    assert not rig.take(wire.Verify) and b.phase is Phase.READY   # held: the target is busy
    answer(rig, first)
    core.dispatch()
    (both,), = [rig.take(wire.Verify)]
    assert sorted(it.seq for it in both.items) == sorted([a.seq, b.seq])
    # from now on they stay in one cohort: each answer brings both back together
    answer(rig, both)
    core.dispatch()
    (again,), = [rig.take(wire.Verify)]
    assert len(again.items) == 2


def test_no_limit_sends_each_ready_sequence_at_once():
    rig = make_rig(verify_inflight=0)
    try:
        a, = admit(rig)
        prefilled(rig, [a])
        rig.core.dispatch()
        b, = admit(rig)
        prefilled(rig, [b])
        rig.core.dispatch()
        assert [len(v.items) for v in rig.take(wire.Verify)] == [1, 1]
    finally:
        rig.core.shutdown("the test is over")


def test_an_unanswered_batch_stops_holding_after_verify_hold():
    clock = Clock()
    rig = make_rig(clock, verify_hold=0.05)
    try:
        a, b = admit(rig, 2)
        prefilled(rig, [a])
        rig.core.dispatch()
        rig.take(wire.Verify)
        prefilled(rig, [b])
        clock.advance(0.049)
        rig.core.dispatch()
        assert not rig.take(wire.Verify)   # still within the hold
        clock.advance(0.002)
        rig.core.dispatch()
        (v,), = [rig.take(wire.Verify)]
        assert [it.seq for it in v.items] == [b.seq]
    finally:
        rig.core.shutdown("the test is over")


def test_held_events_reach_the_streams_after_the_pass_sends_and_in_their_order(rig):
    """The router holds a pass's events until its sends are out: an outcome's tokens (and a finished request's
    done) reach the streams only at `release_events`, after the next verify left, in the order they were made."""
    core = rig.core
    a, b = admit(rig, 2, max_tokens=3)
    prefilled(rig, [a, b])
    assert [kind for kind, _ in events(a)] == ["tokens"]   # not held: the prefill's first token went at once
    events(b)
    core.dispatch()
    (v,) = rig.take(wire.Verify)
    core.hold_events()
    answer(rig, v, token=4)
    core.dispatch()
    (nxt,) = rig.take(wire.Verify)   # the next verify is out while the outcome's tokens are still held
    assert events(a) == events(b) == []
    core.release_events()
    assert events(a) == events(b) == [("tokens", [4])]
    core.hold_events()
    answer(rig, nxt, token=5)   # the third token ends both
    core.end(b, FinishReason.ABORT)   # already finished: no second done
    assert events(a) == [] and b.finish is FinishReason.LENGTH
    core.release_events()
    for r in (a, b):
        assert events(r) == [("tokens", [5]), ("done", FinishReason.LENGTH)]
    core.hold_events()
    core.release_events()   # nothing held: nothing sent
    assert events(a) == []


def test_an_empty_answer_releases_the_target(rig):
    core = rig.core
    a, b = admit(rig, 2)
    prefilled(rig, [a])
    core.dispatch()
    (first,), = [rig.take(wire.Verify)]
    prefilled(rig, [b])
    core.on_message(rig.target, wire.Error("invalid_argument", "bad", a.seq))
    core.on_message(rig.target, wire.Outcomes(first.batch_id, [], 0.01, []))
    core.dispatch()
    (v,), = [rig.take(wire.Verify)]
    assert [it.seq for it in v.items] == [b.seq]


def test_a_failed_target_batch_rebuilds_its_sequences_then_fails_them_if_it_repeats(rig):
    core = rig.core
    a, = admit(rig)
    prefilled(rig, [a])
    core.dispatch()
    rig.take(wire.Verify)
    for attempt in range(1, MAX_TARGET_FAILURES):
        core.on_message(rig.target, wire.Error("internal", "RuntimeError: boom", None))
        (restore,), = [rig.take(wire.Restore)]
        assert a.phase is Phase.RESTORE and restore.items[0].tokens == [5, 6, 7, 9]
        core.on_message(rig.target, wire.Restored([a.seq], 0.01))
        core.dispatch()
        assert rig.take(wire.Verify)   # the failed batch no longer holds the target
    core.on_message(rig.target, wire.Error("internal", "RuntimeError: boom", None))
    assert a.finish is FinishReason.ERROR and a.seq not in core.active
    assert ("error", "target: RuntimeError: boom") in events(a)


class FakeEndpoint:
    def __init__(self):
        self.sent = []

    def send(self, peer, msg) -> None:
        self.sent.append(wire.decode(wire.encode(msg)))


def test_target_answers_a_verify_none_of_whose_items_could_run(default_models):
    worker = build_target(load_model(default_models["target"]),
                          {"max_seqs": 2, "max_len": 64, "kv_tokens": 0, "block_size": 16})
    ep = FakeEndpoint()
    handler = TargetHandler(worker, ep)
    handler.handle([(b"r", wire.Verify(3, [wire.VerifyItem(99, [1], None)]))])   # an unknown sequence
    error, outcomes = ep.sent
    assert isinstance(error, wire.Error) and error.seq == 99
    assert isinstance(outcomes, wire.Outcomes) and outcomes.batch_id == 3 and outcomes.items == []


def make_sd_rig(mode="sd", clock=None, **cfg) -> Rig:
    """One target and one draft (adaptive K off unless asked)."""
    cfg.setdefault("adaptive", False)
    return Rig(CoreConfig(mode=mode, **cfg), drafts=[None], clock=clock)


def sd_admit(rig) -> object:
    req = rig.core.submit(f"s{len(rig.core.active)}", [5, 6, 7], SamplingParams(max_tokens=40), mode="sd")
    rig.core.take_new()
    rig.take(wire.Prefill)
    rig.core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.01, []))
    rig.take(wire.DraftAdd)
    return req


def jit_answer(rig, jit):
    rig.core.on_message(rig.drafts[0], wire.JitResult(jit.batch_id, [(it.seq, [11, 12, 13], None)
                                                                     for it in jit.items], 0.005))


def test_a_free_target_waits_for_the_jits_of_its_other_sequences_so_both_groups_verify_together():
    """SD: the sequences a verify answers need a JIT before they are ready again, while those that waited are
    ready at once. Sending those at once would keep the two groups apart for good."""
    rig = make_sd_rig()
    core = rig.core
    try:
        a = sd_admit(rig)
        core.dispatch()
        jit_answer(rig, rig.take(wire.Jit)[0])
        core.dispatch()
        (va,), = [rig.take(wire.Verify)]
        b = sd_admit(rig)                    # out of step: joins while a's verify is out
        core.dispatch()
        jit_answer(rig, rig.take(wire.Jit)[0])
        core.dispatch()
        assert not rig.take(wire.Verify)     # held: the target is busy
        answer(rig, va)                      # a is answered and needs a JIT; b is ready and the target is free
        core.dispatch()
        (jit,), = [rig.take(wire.Jit)]
        assert b.phase is Phase.READY and not rig.take(wire.Verify)   # the target waits for a's JIT
        jit_answer(rig, jit)
        core.dispatch()
        (both,), = [rig.take(wire.Verify)]
        assert sorted(it.seq for it in both.items) == sorted([a.seq, b.seq])
    finally:
        core.shutdown("the test is over")


def test_the_wait_for_jits_is_bounded():
    clock = Clock()
    rig = make_sd_rig(clock=clock, jit_linger=0.03)   # the wait: min(jit_linger, 1.5 x the 20 ms JIT prior)
    core = rig.core
    try:
        a = sd_admit(rig)
        core.dispatch()
        rig.take(wire.Jit)                   # a's JIT never comes back
        b = sd_admit(rig)
        core.dispatch()
        clock.advance(0.02)                  # b's JIT takes 20 ms: the measured round trip stays at the prior
        jit_answer(rig, rig.take(wire.Jit)[0])
        core.dispatch()
        assert not rig.take(wire.Verify)
        clock.advance(0.029)
        core.dispatch()
        assert not rig.take(wire.Verify)     # still waiting
        clock.advance(0.002)
        core.dispatch()
        (v,), = [rig.take(wire.Verify)]
        assert [it.seq for it in v.items] == [b.seq] and a.phase is Phase.JIT
    finally:
        core.shutdown("the test is over")


@pytest.mark.parametrize("setting", [{"verify_inflight": -1}, {"jit_linger": -0.1}, {"max_batch": 0}])
def test_out_of_range_dispatch_settings_are_refused_with_their_name(setting):
    with pytest.raises(ValueError, match=next(iter(setting))):
        CoreConfig(mode="ar", **setting)


def ssd_admit(rig, rid: str, n: int = 1) -> list:
    """`n` ssd requests submitted and admitted (their Prefill sent and taken, not answered yet)."""
    reqs = [rig.core.submit(f"{rid}{i}", [5, 6, 7], SamplingParams(max_tokens=40), mode="ssd") for i in range(n)]
    rig.core.take_new()
    rig.take(wire.Prefill)
    return reqs


@pytest.mark.parametrize("adaptive_fanout", [True, False])
def test_each_draft_round_carries_the_online_fanout_and_lookups_feed_it(adaptive_fanout):
    """ssd: the DraftRound sent with a verify carries a fan-out of K+1 counts within the draft's budget (empty
    with adaptive_fanout off); the next outcome's lookup, the draft's round time and the verify's count toward that
    draft's policy."""
    rig = make_sd_rig("ssd", adaptive=True, adaptive_fanout=adaptive_fanout)
    core, draft = rig.core, rig.drafts[0]
    try:
        req, = ssd_admit(rig, "f")
        core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.01, []))
        core.dispatch()
        for jit in rig.take(wire.Jit):       # the first round after prefill is a forced miss
            jit_answer(rig, jit)
        core.dispatch()
        (verify,), (draft_round,) = rig.take(wire.Verify), rig.take(wire.DraftRound)
        if not adaptive_fanout:
            assert draft_round.fanout == [] and req.round.fanout is None and not core.planner._fanout
            return
        fan = draft_round.fanout
        assert len(fan) == core.k + 1 and sum(fan) <= 5 and req.round.fanout == fan
        # the draft publishes for outcome (j = 0, t* = 4): the target then answers exactly that outcome
        core.on_message(draft, wire.CacheEntries(req.seq, req.round.number + 1,
                                                 [wire.CacheEntry(0, 4, [1, 2, 3], None)], 0.01))
        core.on_message(rig.target, wire.Outcomes(verify.batch_id, [wire.Outcome(req.seq, 0, 4)], 0.05, []))
        assert req.round.source == "cache"
        policy = core.planner._fanout[draft]
        assert policy.first_window == FIRST_WINDOW < policy.window   # a new draft's first window is short
        assert policy._seen == 1 and policy._late == 0        # looked up, in time
        assert policy._lookups == {fan[0]: 1.0} and policy._misses == {fan[0]: 0.0}   # a hit with F_0 forks
        assert policy._pos_lookups == [{fan[0]: 1.0}, {}, {}, {}]                 # ... at outcome position 0
        assert policy._offered[0] == 1.0 and policy._accepted[0] == 0.0   # the outcome: token 1 rejected
        # the draft's compute for the round and the target's for the verify size the next budget
        assert (policy._draft_n, policy._draft_s, policy._verify_n, policy._verify_s) == (1, 0.01, 1, 0.05)
    finally:
        core.shutdown("the test is over")


def test_sequences_drafted_together_share_the_drafts_budget():
    """Two ssd sequences in one DraftRound: each gets half of the policy's forks a round (at least one a position),
    where one alone gets all of them."""
    rig = make_sd_rig("ssd", adaptive=True, adaptive_fanout=True)
    core = rig.core
    try:
        reqs = ssd_admit(rig, "b", 2)
        core.on_message(rig.target, wire.Prefilled([(r.seq, 9) for r in reqs], 0.01, []))
        core.dispatch()
        for jit in rig.take(wire.Jit):
            jit_answer(rig, jit)
        core.dispatch()
        (draft_round,) = rig.take(wire.DraftRound)
        policy = core.planner._fanout[rig.drafts[0]]
        assert len(draft_round.items) == 2 and policy.budget == 5   # the fakes' draft: [2, 1, 1, 1], K = 3
        assert sum(draft_round.fanout) == 4                         # max(5 // 2, one fork per position)
        assert sum(policy.fanout(1)) == 5
    finally:
        core.shutdown("the test is over")


def test_a_draft_round_of_speculations_of_two_lengths_gets_a_fanout_for_each():
    """Two ssd sequences verified together, one at the pool's K = 3 and one pinned at K = 1: each DraftRound
    carries the split over the outcomes its speculations can have (K = 1: the rejection of token 1 and the bonus
    token after it; nothing for positions 2 and 3), both from the one budget of the draft's round."""
    rig = make_sd_rig("ssd", adaptive=True, adaptive_fanout=True)
    core = rig.core
    try:
        reqs = [core.submit(f"p{k}", [5, 6, 7], SamplingParams(max_tokens=40), mode="ssd", k=k) for k in (0, 1)]
        core.take_new()
        rig.take(wire.Prefill)
        core.on_message(rig.target, wire.Prefilled([(r.seq, 9) for r in reqs], 0.01, []))
        core.dispatch()
        for jit in rig.take(wire.Jit):
            core.on_message(rig.drafts[0], wire.JitResult(jit.batch_id, [(it.seq, [11, 12, 13][:it.room], None)
                                                                         for it in jit.items], 0.005))
        core.dispatch()
        (verify,) = rig.take(wire.Verify)
        assert sorted(len(it.tokens) for it in verify.items) == [1, 3]
        rounds = {len(dr.items[0].spec): dr for dr in rig.take(wire.DraftRound)}
        assert set(rounds) == {1, 3} and all(len(dr.items) == 1 for dr in rounds.values())
        policy = core.planner._fanout[rig.drafts[0]]
        assert policy._rounds == 1   # one draft round for the budget's window, though two messages
        one, three = rounds[1].fanout, rounds[3].fanout
        assert len(one) == len(three) == 4 and sum(one) == sum(three) == 4   # max(5 // 2, one fork a position)
        assert one[1:3] == [0, 0] and one[0] > 0 and one[3] > 0
        assert three == policy.fanout(2) and one == policy.fanout(2, k=1)
        for r in reqs:
            assert r.round.fanout == rounds[len(r.round.tokens)].fanout
    finally:
        core.shutdown("the test is over")


def test_a_requests_time_splits_into_queue_prefill_and_decode_as_the_metrics_report():
    """Arrival -> admission (queue) -> first token (prefill) -> end (decode), on the core's clock; a request that
    never got in reports no queue time."""
    clock = Clock()
    rig = Rig(CoreConfig(mode="ar", adaptive=False, max_batch=1), clock=clock)
    try:
        first = rig.core.submit("a", [5, 6, 7], SamplingParams(max_tokens=2), mode="ar")
        second = rig.core.submit("b", [5, 6], SamplingParams(max_tokens=2), mode="ar")
        clock.advance(0.25)
        rig.core.take_new()              # a is admitted, b waits (max_batch 1)
        clock.advance(0.5)
        prefilled(rig, [first])
        clock.advance(1.0)
        rig.core.dispatch()
        (verify,) = rig.take(wire.Verify)
        answer(rig, verify)              # its second token: max_tokens reached
        rig.core.abort(second)
        rig.core.take_new()
        done_a, done_b = rig.metrics.finished[:2]
        assert done_a["queue_s"] == 0.25 and done_a["ttft_s"] == 0.75 and done_a["e2e_s"] == 1.75
        assert done_a["outcome"] == "length" and done_a["completion_tokens"] == 2
        assert done_b["queue_s"] is None and done_b["ttft_s"] is None and done_b["outcome"] == "abort"
    finally:
        rig.core.shutdown("the test is over")


def test_ssd_by_jit_only_sends_no_draft_round_and_each_round_takes_a_jit_while_a_pinned_k_still_speculates():
    """ssd with the adaptive choice K = 2 by JIT only (`cached` off): every round of an unpinned request drafts by
    JIT before its verify and the draft gets no DraftRound to speculate with; its rounds are marked not cached and
    timed as such, and their acceptance is a plain round's, for ssd's policy and (shared) sd's. A request that pins
    K keeps the speculation cache, and the JIT of its miss counts as a miss's."""
    rig = make_sd_rig("ssd", adaptive=True, adaptive_fanout=True)
    core = rig.core
    try:
        policy = core.planner.adaptive["ssd"]
        core.planner.choice["ssd"], policy.cached, policy.explore_every = 2, False, 0
        core.planner.adapt = lambda batch: None
        timed = []
        policy.observe_round_time = lambda batch, k, seconds, cached=None: timed.append((k, cached))
        req, = ssd_admit(rig, "jit")
        core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.01, []))
        for _ in range(3):
            core.dispatch()
            (jit,) = rig.take(wire.Jit)
            assert jit.items[0].room == 2
            core.on_message(rig.drafts[0], wire.JitResult(jit.batch_id, [(req.seq, [11, 12], None)], 0.005))
            core.dispatch()
            (verify,) = rig.take(wire.Verify)
            assert len(verify.items[0].tokens) == 2 and not rig.take(wire.DraftRound)
            assert not req.round.cached and req.round.source == "jit"
            answer(rig, verify)
        assert timed == [(2, False)] * 3
        sd = core.planner.adaptive["sd"]
        assert policy.seen == {"cache": 0, "jit": 0, "plain": 3} and policy.rounds == 3
        assert sd.seen == {"cache": 0, "jit": 0, "plain": 3} and sd.rounds == 0   # shared: sd's own count stays
        pinned = core.submit("pinned", [5, 6, 7], SamplingParams(max_tokens=40), mode="ssd", k=3)
        core.take_new()
        rig.take(wire.Prefill)
        core.on_message(rig.target, wire.Prefilled([(pinned.seq, 9)], 0.01, []))
        rig.take(wire.DraftAdd)
        core.dispatch()
        for jit in rig.take(wire.Jit):       # the forced miss after prefill
            jit_answer(rig, jit)
        core.dispatch()
        rounds = rig.take(wire.DraftRound)
        assert [it.seq for r in rounds for it in r.items] == [pinned.seq] and pinned.round.cached
        (verify,) = rig.take(wire.Verify)
        answer(rig, verify)
        assert policy.seen["jit"] == 1 and policy.seen["plain"] == 3 and sd.seen["plain"] == 3
    finally:
        core.shutdown("the test is over")


def test_a_slot_empty_between_two_requests_is_not_a_smaller_batch_for_the_choice():
    """Adaptive: a dispatch that sees one sequence fewer (a request finished, the next not yet in) keeps the choice at
    the size it had, unless the smaller size lasts `HOLD_ROUNDS` verify round trips; a larger size counts at once.
    Under a steady load at batch 8 the choice went to batch 7's K and back every few rounds."""
    clock = Clock()
    rig = make_sd_rig("sd", adaptive=True, clock=clock)
    core = rig.core
    try:
        planner = core.planner
        sizes = []
        planner.adaptive["sd"].choose = lambda batch, current=None: sizes.append(batch) or 0
        planner.adaptive["ssd"].choose = lambda batch, current=None: 0
        planner.observe_verify(8, 0.060, 0.010, 8)   # a round trip of 0.07 s: a hold of 0.28 s
        assert planner.round_s == pytest.approx(0.070) and HOLD_ROUNDS == 4
        planner.adapt(8)
        clock.advance(0.050)
        planner.adapt(7)                  # the gap between two requests
        clock.advance(0.010)
        planner.adapt(8)
        clock.advance(0.270)
        planner.adapt(7)                  # 0.27 s since 8 was last seen: still held
        clock.advance(0.020)
        planner.adapt(7)                  # 0.29 s: the batch is 7 now
        clock.advance(0.001)
        planner.adapt(5)                  # 5 since 7 was seen 0.001 s ago: held at 7
        planner.adapt(9)                  # larger: at once
        assert sizes == [8, 8, 8, 8, 7, 7, 9]
    finally:
        core.shutdown("the test is over")


def test_with_speculation_off_no_draft_round_is_sent_and_no_lookup_is_counted_as_a_miss():
    """ssd with the adaptive choice at K = 0: a round verifies with no draft tokens, the draft is asked for
    nothing, and the request's statistics count no cache lookup for it (only the forced one after prefill), so
    its hit rate speaks of the rounds that were drafted."""
    rig = make_sd_rig("ssd", adaptive=True, adaptive_fanout=True)
    core = rig.core
    try:
        req, = ssd_admit(rig, "off")
        core.planner.choice["ssd"] = 0
        core.planner.adaptive["ssd"].probe_interval = 10 ** 6   # no probe round in this test
        core.planner.adapt = lambda batch: None                # the choice stays where the test put it
        core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.01, []))
        for _ in range(3):
            core.dispatch()
            (verify,) = rig.take(wire.Verify)
            assert verify.items[0].tokens == [] and not rig.take(wire.DraftRound) and not rig.take(wire.Jit)
            answer(rig, verify)
        assert req.stats.cache == {"forced": 1} and req.stats.backups == {"none": 4}
    finally:
        core.shutdown("the test is over")


def test_a_drafts_first_answer_for_a_sequence_is_not_timed_as_draft_steps():
    """The draft computes a sequence's KV lazily: its first JIT after a DraftAdd (a new request, or a rebuild after
    the draft lost the sequence) also feeds the whole prompt. Timed as K steps, one such JIT became the draft-step
    line (no other JIT had been timed) and SD ran a whole request at K = 0. Only the later JITs are timed."""
    rig = make_sd_rig("sd")
    core = rig.core
    seen = []

    class Recording(LinearEma):
        def observe(self, batch_size, seconds):
            seen.append((batch_size, seconds))

    core.timings.draft_step = Recording(4e-3, 4e-4)

    def jit_round(elapsed):
        core.dispatch()
        (jit,) = rig.take(wire.Jit)
        rig.core.on_message(rig.drafts[0], wire.JitResult(jit.batch_id, [(it.seq, [11, 12, 13], None)
                                                                         for it in jit.items], elapsed))
        core.dispatch()
        answer(rig, rig.take(wire.Verify)[0], token=13)

    try:
        req = sd_admit(rig)
        jit_round(0.05)    # its first: catch-up of the prompt, not timed
        jit_round(0.012)
        jit_round(0.015)
        assert seen == [(1, pytest.approx(0.004)), (1, pytest.approx(0.005))]
        assert not req.draft_fresh
        rig.core.on_message(rig.drafts[0], wire.Error("unknown_sequence", "no such sequence", req.seq))
        (add,) = rig.take(wire.DraftAdd)   # rebuilt from its committed tokens: the next JIT catches up again
        assert [it.seq for it in add.items] == [req.seq] and req.draft_fresh
        core.dispatch()   # the round waiting for a JIT took an n-gram backup instead
        answer(rig, rig.take(wire.Verify)[0], token=13)
        jit_round(0.08)
        jit_round(0.009)
        assert seen[2:] == [(1, pytest.approx(0.003))]
    finally:
        core.shutdown("the test is over")


def test_each_round_is_timed_from_the_sequences_previous_outcome_for_its_modes_policy():
    """sd: the prefill's first token starts the clock; each outcome gives the policy one round's time (JIT wait and
    verify as the sequence lived them), at the K it planned and the batch size then; a restore starts over."""
    clock = Clock()
    rig = make_sd_rig("sd", clock=clock, adaptive=True)
    core = rig.core
    seen = []
    core.planner.adaptive["sd"].observe_round_time = lambda batch, k, seconds, cached=None: seen.append((batch, k, seconds))
    try:
        req = sd_admit(rig)
        for wait in (0.3, 0.2):
            core.dispatch()
            (jit,) = rig.take(wire.Jit)
            jit_answer(rig, jit)
            clock.advance(wait / 2)    # after the JIT's answer: a JIT round trip this slow would be the policy's hop
            core.dispatch()
            (verify,) = rig.take(wire.Verify)
            clock.advance(wait / 2)
            answer(rig, verify)
        assert seen == [(1, core.k, pytest.approx(0.3)), (1, core.k, pytest.approx(0.2))]
        core.send_prefill([req], wire.Restore)
        assert req.last_outcome_at is None
    finally:
        core.shutdown("the test is over")


def test_a_round_its_target_spent_partly_on_a_prefill_is_not_timed_for_the_policy():
    """sd: a's round is out when b's prefill reaches the target, which computes it (0.25 s) before a's verify; a's
    round waited for another request's prompt, whatever its K, and gives the policy no time. a's next round (and
    b's first, which starts as its prefill ends) are timed."""
    clock = Clock()
    rig = make_sd_rig("sd", clock=clock, adaptive=True)
    core = rig.core
    seen = []
    core.planner.adaptive["sd"].observe_round_time = lambda batch, k, seconds, cached=None: seen.append((batch, k, seconds))

    def jit_and_verify(reqs):
        core.dispatch()
        (jit,) = rig.take(wire.Jit)
        jit_answer(rig, jit)
        core.dispatch()
        (verify,) = rig.take(wire.Verify)
        assert sorted(it.seq for it in verify.items) == sorted(r.seq for r in reqs)
        return verify

    try:
        a = sd_admit(rig)
        verify = jit_and_verify([a])
        clock.advance(0.1)
        answer(rig, verify)                       # a round with no prefill beside it: timed
        assert seen == [(1, core.k, pytest.approx(0.1))]
        verify = jit_and_verify([a])
        b = core.submit("b", [5, 6, 7], SamplingParams(max_tokens=40), mode="sd")
        core.take_new()
        rig.take(wire.Prefill)
        clock.advance(0.3)
        core.on_message(rig.target, wire.Prefilled([(b.seq, 9)], 0.25, []))
        rig.take(wire.DraftAdd)
        clock.advance(0.05)
        answer(rig, verify)                       # its target spent 0.25 s of it on b's prompt: not timed
        assert len(seen) == 1
        verify = jit_and_verify([a, b])
        clock.advance(0.1)
        answer(rig, verify)                       # both timed: a from its last outcome, b from its first token
        assert sorted(seen[1:]) == [(2, core.k, pytest.approx(0.1)), (2, core.k, pytest.approx(0.15))]
    finally:
        core.shutdown("the test is over")


def sd_admit_together(rig, n: int) -> list:
    """`n` sd requests prefilled in one answer (so one verify batch holds them all from their first round)."""
    reqs = [rig.core.submit(f"t{i}", [5, 6, 7], SamplingParams(max_tokens=200), mode="sd") for i in range(n)]
    rig.core.take_new()
    rig.take(wire.Prefill)
    rig.core.on_message(rig.target, wire.Prefilled([(r.seq, 9) for r in reqs], 0.01, []))
    rig.take(wire.DraftAdd)
    return reqs


def run_rounds(rig, reqs, rounds: int) -> list[int]:
    """`rounds` rounds of `reqs` (`run_probe_rounds`), all of each at the same K (asserted); returns each round's K."""
    ks = []
    for by_seq in run_probe_rounds(rig, reqs, rounds):
        sizes = set(by_seq.values())
        assert len(sizes) == 1, f"one verify batch ran K = {sorted(sizes)}"
        ks.append(sizes.pop())
    return ks


def test_the_adaptive_k_is_exported_from_the_start_not_only_once_it_changes():
    """The `ssd_speculation_k` gauge per mode is set when the core starts, before any round: a CI run's first
    request kept K = 3 all through, and a stack's /metrics then had no sample for it to read."""
    rig = make_sd_rig("ssd", adaptive=True)
    try:
        assert rig.metrics.speculation_k == {"sd": [rig.core.k], "ssd": [rig.core.k]}
    finally:
        rig.core.shutdown("the test is over")
    pinned = make_sd_rig("ssd", adaptive=False)
    try:
        assert pinned.metrics.speculation_k == {}   # no adaptive policy, no gauge
    finally:
        pinned.core.shutdown("the test is over")


def run_probe_rounds(rig, reqs, rounds: int) -> list[dict[int, int]]:
    """`rounds` rounds of `reqs`, each one Verify holding them all (asserted), sent only once the JIT of the
    sequences that need one is answered; returns each round's K by sequence."""
    out = []
    for _ in range(rounds):
        rig.core.dispatch()
        jits = rig.take(wire.Jit)
        if jits:
            (jit,) = jits
            assert not rig.take(wire.Verify), "the verify went before the batch's JIT was answered"
            rig.core.on_message(rig.drafts[0], wire.JitResult(jit.batch_id, [(it.seq, [11, 12, 13][:it.room], None)
                                                                             for it in jit.items], 0.005))
            rig.core.dispatch()
        (verify,) = rig.take(wire.Verify)
        assert sorted(it.seq for it in verify.items) == sorted(r.seq for r in reqs)
        out.append({it.seq: len(it.tokens) for it in verify.items})
        answer(rig, verify)
    return out


def k0_rig(mode: str = "sd"):
    """A rig whose adaptive choice for `mode` is K = 0 and stays there (no `adapt`), its policy, and the K of each
    round the policy timed for its realized-time correction."""
    rig = make_sd_rig(mode, adaptive=True)
    rig.core.planner.choice[mode] = 0
    rig.core.planner.adapt = lambda batch: None            # the choice stays where the test put it
    policy = rig.core.planner.adaptive[mode]
    timed = []
    policy.observe_round_time = lambda batch, k, seconds, cached=None: timed.append(k)
    return rig, policy, timed


def test_a_probe_is_run_by_one_sequence_of_the_batch_in_turn_and_the_batch_stays_one_verify():
    """Adaptive K = 0 (sd): a probe round is decided once per verify batch and run by one of its sequences, a
    different one at each probe, the others staying at K = 0; the target verifies them all in one forward, after
    the prober's JIT. The interval counts the batch's rounds and doubles after each probe, and the rounds of a
    probe's batch are not timed for the realized-time correction. (The whole batch used to probe: at batch 16 a
    probe cost 16 JITs and a 4x larger verify.)"""
    rig, policy, timed = k0_rig()
    core = rig.core
    try:
        policy.probe_every = policy.probe_interval = 3
        reqs = sd_admit_together(rig, 4)
        rounds = run_probe_rounds(rig, reqs, 12)
        probers = [[s for s, k in r.items() if k] for r in rounds]
        # the prefill's round runs the choice; a probe at the third decision, then the sixth (interval 3, 6, 12)
        assert [len(p) for p in probers] == [0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0]
        assert rounds[3][probers[3][0]] == rounds[9][probers[9][0]] == core.k
        assert probers[3] != probers[9]                    # in turn
        assert policy.probe_interval == 12
        assert len(timed) == 4 * 10 and set(timed) == {0}  # the two probe rounds' batches not timed
    finally:
        core.shutdown("the test is over")


def test_a_probe_of_a_lone_sequence_is_the_whole_batch():
    """One sequence in the batch: it probes at K max, and its round is timed like any (the batch ran one K)."""
    rig, policy, timed = k0_rig()
    core = rig.core
    try:
        policy.probe_every = policy.probe_interval = 2
        reqs = sd_admit_together(rig, 1)
        assert [r[reqs[0].seq] for r in run_probe_rounds(rig, reqs, 4)] == [0, 0, core.k, 0]
        assert timed == [0, 0, core.k, 0]
    finally:
        core.shutdown("the test is over")


def test_a_measuring_round_runs_the_whole_batch_at_the_k_to_measure_and_is_not_timed():
    """Adaptive K = 0 with `measure_k` set (the policy would turn speculation on at a verify size the batch never
    measured): every sequence of the batch runs that K, in one verify of the whole batch's size, and the round is
    not timed for the realized-time correction (its tokens came by JIT whatever the ssd policy's `cached` said)."""
    rig, policy, timed = k0_rig()
    core = rig.core
    try:
        reqs = sd_admit_together(rig, 4)
        policy.measure_k = 2
        rounds = run_probe_rounds(rig, reqs, 3)
        assert [sorted(set(r.values())) for r in rounds] == [[0], [2], [2]]   # the prefill's round ran the choice
        policy.measure_k = 0
        assert run_rounds(rig, reqs, 2) == [2, 0]        # the round decided before it was cleared, then K = 0
        assert timed == [0] * 4 + [0] * 4                 # the first round's and the last's, not the measuring ones
        assert core.planner.since_probe["sd"] == 2        # reset by the last measuring decision, as a probe resets it
    finally:
        core.shutdown("the test is over")


def test_a_batch_explores_a_neighbouring_k_together():
    """Adaptive K = 2 (sd): every explore round (K + 1, then K - 1, every explore_every rounds of the batch) holds
    the whole batch at the same K."""
    rig = make_sd_rig("sd", adaptive=True)
    core = rig.core
    try:
        core.planner.choice["sd"] = 2
        core.planner.adapt = lambda batch: None
        core.planner.adaptive["sd"].explore_every = 2
        reqs = sd_admit_together(rig, 3)
        assert run_rounds(rig, reqs, 8) == [2, 2, 3, 2, 1, 2, 3, 2]
    finally:
        core.shutdown("the test is over")


def test_a_draft_round_asks_for_chains_as_long_as_the_next_rounds_k():
    """ssd, adaptive K = 2 from the cache: each DraftRound item's depth is the K the sequence's next round runs,
    the explore round upward included (the draft then grows no chain steps a round would cut); an explore round
    downward runs from entries of the choice's length, cut by the router. A pinned K asks for that K, and with no
    adaptive policy the draft's own (0)."""
    rig = make_sd_rig("ssd", adaptive=True)
    core = rig.core
    try:
        policy = core.planner.adaptive["ssd"]
        core.planner.choice["ssd"], policy.cached, policy.explore_every = 2, True, 3
        core.planner.adapt = lambda batch: None
        req, = ssd_admit(rig, "d")
        core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.01, []))
        core.dispatch()
        for jit in rig.take(wire.Jit):       # the forced miss after prefill
            jit_answer(rig, jit)
        depths, ks = [], []
        for _ in range(8):
            core.dispatch()
            (verify,), (draft_round,) = rig.take(wire.Verify), rig.take(wire.DraftRound)
            depths.append(draft_round.items[0].depth)
            answer(rig, verify)              # the draft is late: the outcome waits for its entries
            assert req.phase is Phase.AWAIT and not rig.take(wire.Jit)
            # which hold nothing for it: a miss, whose JIT drafts the next round's K
            core.on_message(rig.drafts[0], wire.CacheEntries(req.seq, req.round.number, [], 0.01))
            core.dispatch()
            (jit,) = rig.take(wire.Jit)
            ks.append(jit.items[0].room)
            jit_answer(rig, jit)
        assert 3 in ks and 1 in ks
        assert depths == [max(k, 2) for k in ks], (depths, ks)
        pinned = core.submit("pinned", [5, 6, 7], SamplingParams(max_tokens=40), mode="ssd", k=1)
        assert core.planner.draft_depth(pinned) == 1
    finally:
        core.shutdown("the test is over")
    fixed = make_sd_rig("ssd", adaptive=False)
    try:
        req, = ssd_admit(fixed, "f")
        assert fixed.core.planner.draft_depth(req) == 0
    finally:
        fixed.core.shutdown("the test is over")


def test_each_rounds_acceptance_weighs_one_over_the_drafted_rounds_of_its_verify_batch():
    """sd, adaptive: three sequences drafting in one verify batch give the policy their acceptance with peers 3
    (each weighs a third of a round); a probe's round, the batch's one drafted round among K = 0 ones, with 1."""
    rig = make_sd_rig("sd", adaptive=True)
    core = rig.core
    core.planner.adapt = lambda batch: None          # the choice stays where it starts: K max
    seen = []
    core.planner.adaptive["sd"].observe_round = \
        lambda offered, accepted, source=None, shared=False, peers=1: seen.append((offered, source, shared, peers))
    try:
        reqs = sd_admit_together(rig, 3)
        run_probe_rounds(rig, reqs, 2)
        assert seen == [(core.k, "plain", False, 3)] * 6
    finally:
        core.shutdown("the test is over")
    rig, policy, _ = k0_rig()
    seen = []
    policy.observe_round = lambda offered, accepted, source=None, shared=False, peers=1: seen.append((offered, peers))
    try:
        policy.probe_every = policy.probe_interval = 3
        rounds = run_probe_rounds(rig, sd_admit_together(rig, 4), 6)
        assert [sum(1 for k in r.values() if k) for r in rounds] == [0, 0, 0, 1, 0, 0]
        assert seen == [(rig.core.k, 1)]
    finally:
        rig.core.shutdown("the test is over")
