"""How the router hands verify batches to a target (services/router/core.py `_target_busy`), with no workers:
messages are handed to the core and what it sends is recorded. Also the target's side of the bargain: every
Verify is answered, even when none of its items could run.
"""
import pytest

from ssd import wire
from ssd.models.loader import load_model
from ssd.params import FinishReason, SamplingParams
from ssd.engine.target_tp import build_target
from services.router.core import MAX_TARGET_FAILURES, CoreConfig, Phase, RouterCore
from ssd.engine.target_handler import TargetHandler


def ready(role: str) -> wire.Ready:
    return wire.Ready(role, "m", "h", 100, 256, 3, [2, 1, 1, 1] if role == "draft" else [], 0)


class Clock:
    """The core's clock, moved by the test: a hold or a wait ends when the test says, never by real time."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_core(clock=None, **cfg) -> RouterCore:
    core = RouterCore(CoreConfig(mode="ar", adaptive=False, **cfg), ["tcp://127.0.0.1:9"], [], "h", [2],
                      clock=clock or Clock())
    core.sent = []
    t = core.targets[0]
    t.ready, t.alive = ready("target"), True
    t.send = lambda msg: core.sent.append(msg) or True
    core.handshake()
    return core


@pytest.fixture
def core():
    core = make_core()
    yield core
    core._shutdown()


def admit(core, n=1, max_tokens=40) -> list:
    reqs = [core.submit(f"r{len(core.active)}-{i}", [5, 6, 7], SamplingParams(max_tokens=max_tokens), mode="ar")
            for i in range(n)]
    core._take_new()
    return reqs


def take(core, cls) -> list:
    out = [m for m in core.sent if isinstance(m, cls)]
    core.sent = [m for m in core.sent if not isinstance(m, cls)]
    return out


def prefilled(core, reqs, token=9):
    take(core, wire.Prefill)
    core._on_target(core.targets[0], wire.Prefilled([(r.seq, token) for r in reqs], 0.01, []))


def answer(core, verify, token=4):
    core._on_target(core.targets[0], wire.Outcomes(verify.batch_id, [wire.Outcome(it.seq, len(it.tokens), token)
                                                                     for it in verify.items], 0.05, []))


def test_sequences_out_of_step_join_the_next_batch_instead_of_forming_their_own(core):
    a, = admit(core)
    prefilled(core, [a])
    core._dispatch()
    (first,), = [take(core, wire.Verify)]
    b, = admit(core)             # arrives while a's verify is out
    prefilled(core, [b])
    core._dispatch()
    assert not take(core, wire.Verify) and b.phase is Phase.READY   # held: the target is busy
    answer(core, first)
    core._dispatch()
    (both,), = [take(core, wire.Verify)]
    assert sorted(it.seq for it in both.items) == sorted([a.seq, b.seq])
    # from now on they stay in one cohort: each answer brings both back together
    answer(core, both)
    core._dispatch()
    (again,), = [take(core, wire.Verify)]
    assert len(again.items) == 2


def test_no_limit_sends_each_ready_sequence_at_once():
    core = make_core(verify_inflight=0)
    try:
        a, = admit(core)
        prefilled(core, [a])
        core._dispatch()
        b, = admit(core)
        prefilled(core, [b])
        core._dispatch()
        assert [len(v.items) for v in take(core, wire.Verify)] == [1, 1]
    finally:
        core._shutdown()


def test_an_unanswered_batch_stops_holding_after_verify_hold():
    clock = Clock()
    core = make_core(clock, verify_hold=0.05)
    try:
        a, b = admit(core, 2)
        prefilled(core, [a])
        core._dispatch()
        take(core, wire.Verify)
        prefilled(core, [b])
        clock.advance(0.049)
        core._dispatch()
        assert not take(core, wire.Verify)   # still within the hold
        clock.advance(0.002)
        core._dispatch()
        (v,), = [take(core, wire.Verify)]
        assert [it.seq for it in v.items] == [b.seq]
    finally:
        core._shutdown()


def test_an_empty_answer_releases_the_target(core):
    a, b = admit(core, 2)
    prefilled(core, [a])
    core._dispatch()
    (first,), = [take(core, wire.Verify)]
    prefilled(core, [b])
    core._on_target(core.targets[0], wire.Error("invalid_argument", "bad", a.seq))
    core._on_target(core.targets[0], wire.Outcomes(first.batch_id, [], 0.01, []))
    core._dispatch()
    (v,), = [take(core, wire.Verify)]
    assert [it.seq for it in v.items] == [b.seq]


def test_a_failed_target_batch_rebuilds_its_sequences_then_fails_them_if_it_repeats(core):
    a, = admit(core)
    prefilled(core, [a])
    core._dispatch()
    take(core, wire.Verify)
    for attempt in range(1, MAX_TARGET_FAILURES):
        core._on_target(core.targets[0], wire.Error("internal", "RuntimeError: boom", None))
        (restore,), = [take(core, wire.Restore)]
        assert a.phase is Phase.RESTORE and restore.items[0].tokens == [5, 6, 7, 9]
        core._on_target(core.targets[0], wire.Restored([a.seq], 0.01))
        core._dispatch()
        assert take(core, wire.Verify)   # the failed batch no longer holds the target
    core._on_target(core.targets[0], wire.Error("internal", "RuntimeError: boom", None))
    assert a.finish is FinishReason.ERROR and a.seq not in core.active
    events = []
    while not a.events.empty():
        events.append(a.events.get_nowait())
    assert ("error", "target: RuntimeError: boom") in events


class FakeEndpoint:
    def __init__(self):
        self.sent = []

    def send(self, peer, msg) -> None:
        self.sent.append(wire.decode(wire.encode(msg)))


def test_target_answers_a_verify_none_of_whose_items_could_run(default_models):
    worker = build_target(load_model(default_models["target"]), {"max_seqs": 2, "max_len": 64, "kv_tokens": 0, "block_size": 16})
    ep = FakeEndpoint()
    handler = TargetHandler(worker, ep)
    handler.handle([(b"r", wire.Verify(3, [wire.VerifyItem(99, [1], None)]))])   # an unknown sequence
    error, outcomes = ep.sent
    assert isinstance(error, wire.Error) and error.seq == 99
    assert isinstance(outcomes, wire.Outcomes) and outcomes.batch_id == 3 and outcomes.items == []


def make_sd_core(mode="sd", clock=None, **cfg) -> RouterCore:
    """A router core with one target and one draft that record what they are sent (adaptive K off unless asked)."""
    cfg.setdefault("adaptive", False)
    core = RouterCore(CoreConfig(mode=mode, **cfg), ["tcp://127.0.0.1:9"], ["tcp://127.0.0.1:10"], "h", [2],
                      clock=clock or Clock())
    core.sent = []
    for peer in (*core.targets, *core.drafts):
        peer.ready, peer.alive = ready(peer.role), True
        peer.send = lambda msg: core.sent.append(msg) or True
    core.handshake()
    return core


def sd_admit(core) -> object:
    req = core.submit(f"s{len(core.active)}", [5, 6, 7], SamplingParams(max_tokens=40), mode="sd")
    core._take_new()
    take(core, wire.Prefill)
    core._on_target(core.targets[0], wire.Prefilled([(req.seq, 9)], 0.01, []))
    take(core, wire.DraftAdd)
    return req


def jit_answer(core, jit):
    core._on_draft(core.drafts[0], wire.JitResult(jit.batch_id, [(it.seq, [11, 12, 13], None) for it in jit.items],
                                                  0.005))


def test_a_free_target_waits_for_the_jits_of_its_other_sequences_so_both_groups_verify_together():
    """SD: the sequences a verify answers need a JIT before they are ready again, while those that waited are
    ready at once. Sending those at once would keep the two groups apart for good."""
    core = make_sd_core()
    try:
        a = sd_admit(core)
        core._dispatch()
        jit_answer(core, take(core, wire.Jit)[0])
        core._dispatch()
        (va,), = [take(core, wire.Verify)]
        b = sd_admit(core)                   # out of step: joins while a's verify is out
        core._dispatch()
        jit_answer(core, take(core, wire.Jit)[0])
        core._dispatch()
        assert not take(core, wire.Verify)   # held: the target is busy
        answer(core, va)                     # a is answered and needs a JIT; b is ready and the target is free
        core._dispatch()
        (jit,), = [take(core, wire.Jit)]
        assert b.phase is Phase.READY and not take(core, wire.Verify)   # the target waits for a's JIT
        jit_answer(core, jit)
        core._dispatch()
        (both,), = [take(core, wire.Verify)]
        assert sorted(it.seq for it in both.items) == sorted([a.seq, b.seq])
    finally:
        core._shutdown()


def test_the_wait_for_jits_is_bounded():
    clock = Clock()
    core = make_sd_core(clock=clock, jit_linger=0.03)   # the wait: min(jit_linger, 1.5 x the 20 ms JIT prior)
    try:
        a = sd_admit(core)
        core._dispatch()
        take(core, wire.Jit)                 # a's JIT never comes back
        b = sd_admit(core)
        core._dispatch()
        clock.advance(0.02)                  # b's JIT takes 20 ms: the measured round trip stays at the prior
        jit_answer(core, take(core, wire.Jit)[0])
        core._dispatch()
        assert not take(core, wire.Verify)
        clock.advance(0.029)
        core._dispatch()
        assert not take(core, wire.Verify)   # still waiting
        clock.advance(0.002)
        core._dispatch()
        (v,), = [take(core, wire.Verify)]
        assert [it.seq for it in v.items] == [b.seq] and a.phase is Phase.JIT
    finally:
        core._shutdown()


@pytest.mark.parametrize("setting", [{"verify_inflight": -1}, {"jit_linger": -0.1}])
def test_out_of_range_dispatch_settings_are_refused_with_their_name(setting):
    with pytest.raises(ValueError, match=next(iter(setting))):
        RouterCore(CoreConfig(mode="ar", **setting), ["tcp://127.0.0.1:9"], [], "h", [2])


@pytest.mark.parametrize("adaptive_fanout", [True, False])
def test_each_draft_round_carries_the_online_fanout_and_lookups_feed_it(adaptive_fanout):
    """ssd: the DraftRound sent with a verify carries a fan-out of K+1 counts within the draft's budget (empty
    with adaptive_fanout off); the next outcome's lookup counts toward that draft's policy."""
    core = make_sd_core("ssd", adaptive=True, adaptive_fanout=adaptive_fanout)
    try:
        req = core.submit("f0", [5, 6, 7], SamplingParams(max_tokens=40), mode="ssd")
        core._take_new()
        take(core, wire.Prefill)
        core._on_target(core.targets[0], wire.Prefilled([(req.seq, 9)], 0.01, []))
        core._dispatch()
        for jit in take(core, wire.Jit):     # the first round after prefill is a forced miss
            jit_answer(core, jit)
        core._dispatch()
        (verify,), (draft_round,) = take(core, wire.Verify), take(core, wire.DraftRound)
        if not adaptive_fanout:
            assert draft_round.fanout == [] and not core._fanout
            return
        fan = draft_round.fanout
        assert len(fan) == core.k + 1 and sum(fan) <= 5 and req.fanout_sent == fan
        # the draft publishes for outcome (j = 0, t* = 4): the target then answers exactly that outcome
        core._on_draft(core.drafts[0], wire.CacheEntries(req.seq, req.round + 1, [wire.CacheEntry(0, 4, [1, 2, 3],
                                                                                                   None)], 0.01))
        core._on_target(core.targets[0], wire.Outcomes(verify.batch_id, [wire.Outcome(req.seq, 0, 4)], 0.05, []))
        policy = core._fanout[core.drafts[0]]
        assert policy._seen == 1 and policy._late == 0        # looked up, in time
        assert policy._lookups == {fan[0]: 1.0} and policy._misses == {fan[0]: 0.0}   # a hit with F_0 forks
    finally:
        core._shutdown()
