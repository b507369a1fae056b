"""Worker replies that decode (valid msgpack, the right type) but cannot be right for the sequences they name:
the router core rejects and logs them, no client sees a lost or altered token (the sequence is rebuilt, backed
up, or failed with a clear error), the other sequences go on untouched and the core keeps running.

The core is driven in-process (services/router/core.py, as in test_router_dispatch.py): messages are handed
to it as its peers would after decoding, and what it sends is recorded. The last test runs the core's own loop
against fake workers over ZeroMQ.
"""
import logging
import threading

import pytest
import zmq

from ssd import wire
from ssd.params import FinishReason, SamplingParams
from services.router.core import MAX_TARGET_FAILURES, CoreConfig, Phase, RouterCore

VOCAB, K = 100, 3


def ready(role: str) -> wire.Ready:
    return wire.Ready(role, "m", "h", VOCAB, 256, K, [2, 1, 1, 1] if role == "draft" else [], 0)


@pytest.fixture
def core(caplog):
    """ssd mode over one target and two drafts whose sends are recorded as (peer, message)."""
    caplog.set_level(logging.DEBUG, logger="ssd.router")
    core = RouterCore(CoreConfig(mode="ssd", adaptive=False, adaptive_fanout=False), ["tcp://127.0.0.1:9"],
                      ["tcp://127.0.0.1:10", "tcp://127.0.0.1:11"], "h", [2])
    core.sent = []
    for peer in (*core.targets, *core.drafts):
        peer.ready, peer.alive = ready(peer.role), True
        peer.send = lambda msg, peer=peer: core.sent.append((peer, msg)) or True
    core.handshake()
    yield core
    core._shutdown()


def take(core, cls) -> list:
    out = [m for _, m in core.sent if isinstance(m, cls)]
    core.sent = [(p, m) for p, m in core.sent if not isinstance(m, cls)]
    return out


def tokens_seen(req) -> list[int]:
    """Every token the client was sent, in order (what a stream would show)."""
    out = []
    while not req.events.empty():
        kind, value = req.events.get_nowait()
        if kind == "tokens":
            out += value
    return out


def events(req) -> list:
    out = []
    while not req.events.empty():
        out.append(req.events.get_nowait())
    return out


def verifying(core, n=2, temperature=0.0) -> tuple[list, wire.Verify]:
    """n sequences prefilled (first token 9), their JITs answered [11, 12, 13], one Verify out for all."""
    params = SamplingParams(max_tokens=40, temperature=temperature)
    reqs = [core.submit(f"r{i}", [5, 6, 7], params, mode="ssd") for i in range(n)]
    core._take_new()
    take(core, wire.Prefill)
    core._on_target(core.targets[0], wire.Prefilled([(r.seq, 9) for r in reqs], 0.01, []))
    take(core, wire.DraftAdd)
    core._dispatch()
    verify = answer_jits(core, None if temperature == 0 else [([11 + i, 50], [0.5, 0.5]) for i in range(K)])
    assert [r.phase for r in reqs] == [Phase.VERIFY] * n
    return reqs, verify


def answer_jits(core, rows=None) -> wire.Verify:
    """Every JIT out answered [11, 12, 13] by the draft it went to; returns the Verify that then goes out."""
    jits = [(p, m) for p, m in core.sent if isinstance(m, wire.Jit)]
    take(core, wire.Jit)
    for peer, jit in jits:
        core._on_draft(peer, wire.JitResult(jit.batch_id, [(it.seq, [11, 12, 13], rows) for it in jit.items], 0.01))
    core._dispatch()
    (verify,) = take(core, wire.Verify)
    take(core, wire.DraftRound)
    return verify


def outcome(req, accepted=1, token=4) -> wire.Outcome:
    return wire.Outcome(req.seq, accepted, token)


# ---- the target's outcomes and first tokens ----------------------------------------------------------------

BAD_OUTCOMES = {
    "j larger than the speculation": lambda req: [outcome(req, accepted=K + 1)],
    "token outside the vocabulary": lambda req: [outcome(req, token=VOCAB)],
    "the sequence twice": lambda req: [outcome(req, accepted=0, token=4), outcome(req, accepted=2, token=5)],
}


@pytest.mark.parametrize("bad", BAD_OUTCOMES)
def test_an_invalid_outcome_rebuilds_its_sequence_and_the_others_commit(core, caplog, bad):
    (a, b), verify = verifying(core)
    tokens_seen(a), tokens_seen(b)
    items = BAD_OUTCOMES[bad](a) + [outcome(b, accepted=2, token=4)]
    core._on_target(core.targets[0], wire.Outcomes(verify.batch_id, items, 0.05, []))
    assert tokens_seen(a) == [] and a.output == [9]            # nothing of the bad reply reached the client
    (restore,) = take(core, wire.Restore)
    assert a.phase is Phase.RESTORE and restore.items[0].seq == a.seq and restore.items[0].tokens == [5, 6, 7, 9]
    assert f"reply for seq {a.seq} rejected" in caplog.text
    assert tokens_seen(b) == [11, 12, 4] and b.output == [9, 11, 12, 4]   # its neighbour is untouched
    core._on_target(core.targets[0], wire.Restored([a.seq], 0.01))   # rebuilt: it goes on from its committed tokens
    core._dispatch()
    assert a.phase in (Phase.JIT, Phase.VERIFY) and a.finish is None


def test_an_invalid_first_token_prefills_again(core, caplog):
    req = core.submit("p", [5, 6, 7], SamplingParams(max_tokens=40), mode="ssd")
    core._take_new()
    take(core, wire.Prefill)
    core._on_target(core.targets[0], wire.Prefilled([(req.seq, VOCAB + 7)], 0.01, []))
    assert tokens_seen(req) == [] and req.phase is Phase.PREFILL and "rejected" in caplog.text
    (again,) = take(core, wire.Prefill)
    assert again.items[0].tokens == [5, 6, 7]
    core._on_target(core.targets[0], wire.Prefilled([(req.seq, 9)], 0.01, []))
    assert tokens_seen(req) == [9]


def test_a_target_that_keeps_answering_nonsense_fails_the_request_with_a_clear_error(core):
    (a, b), verify = verifying(core)
    events(a)
    for attempt in range(MAX_TARGET_FAILURES):
        core._on_target(core.targets[0], wire.Outcomes(verify.batch_id, [outcome(a, accepted=9)], 0.05, []))
        if attempt < MAX_TARGET_FAILURES - 1:
            take(core, wire.Restore)
            core._on_target(core.targets[0], wire.Restored([a.seq], 0.01))
            core._dispatch()
            verify = answer_jits(core)   # its next round, after the rebuild
    assert a.finish is FinishReason.ERROR and a.seq not in core.active
    (error,) = [e for e in events(a) if e[0] == "error"]
    assert error[1].startswith("target: invalid reply: j=9 accepted") and a.output == [9]
    assert b.finish is None and b.seq in core.active


def test_outcomes_for_unknown_sequences_or_batches_change_nothing(core, caplog):
    (a, b), verify = verifying(core)
    tokens_seen(a), tokens_seen(b)
    before = core.times.verify_batches
    core._on_target(core.targets[0], wire.Outcomes(verify.batch_id + 1000, [outcome(a), outcome(b)], 0.05, []))
    core._on_target(core.targets[0], wire.Outcomes(verify.batch_id, [wire.Outcome(4242, 1, 4)], 0.05, []))
    assert "answered verify batch" in caplog.text and "seq 4242 not awaited" in caplog.text
    assert core.times.verify_batches == before + 1    # only the known batch counts toward the timings
    assert tokens_seen(a) == tokens_seen(b) == [] and a.phase is b.phase is Phase.VERIFY
    assert not take(core, wire.Restore)


def test_a_first_token_for_a_sequence_never_submitted_is_ignored(core, caplog):
    core._on_target(core.targets[0], wire.Prefilled([(777, 9)], 0.01, []))
    assert "seq 777, which is not waiting" in caplog.text and not core.active and not core.sent


# ---- the draft's cache entries -------------------------------------------------------------------------------

def entry(tokens=(1, 2, 3), accepted=1, token=4, proposal=None) -> wire.CacheEntry:
    return wire.CacheEntry(accepted, token, list(tokens), proposal)


BAD_ENTRIES = {
    "more tokens than K": dict(tokens=[1, 2, 3, 4, 5]),
    "a token outside the vocabulary": dict(tokens=[1, VOCAB, 3]),
    "an outcome j larger than K": dict(accepted=K + 1),
    "an outcome token outside the vocabulary": dict(token=VOCAB + 1),
}


@pytest.mark.parametrize("bad", [None, *BAD_ENTRIES])
def test_invalid_cache_entries_are_not_published(core, caplog, bad):
    """None: a valid entry, which the next lookup hits (so the test would see an invalid one published)."""
    (a, b), verify = verifying(core)
    fields = {**dict(accepted=1, token=4), **BAD_ENTRIES.get(bad, {})}
    core._on_draft(a.draft, wire.CacheEntries(a.seq, a.round + 1, [entry(**{**dict(tokens=[1, 2, 3]), **fields})],
                                              0.01))
    core._on_target(core.targets[0], wire.Outcomes(verify.batch_id, [outcome(a, 1, 4), outcome(b, 1, 4)], 0.05, []))
    if bad is None:
        assert a.spec_kind == "cache" and a.spec == [1, 2, 3]
        return
    assert f"cache entries for seq {a.seq} round {a.round} rejected" in caplog.text
    assert a.spec_kind != "cache" and all(t < VOCAB for t in a.spec) and a.output == [9, 11, 4]


def test_cache_entries_for_a_sequence_of_another_draft_are_ignored(core, caplog):
    (a, b), verify = verifying(core)
    other = next(d for d in core.drafts if d is not a.draft)
    core._on_draft(other, wire.CacheEntries(a.seq, a.round + 1, [entry()], 0.01))
    core._on_draft(other, wire.CacheEntries(31337, 1, [entry()], 0.01))
    core._on_target(core.targets[0], wire.Outcomes(verify.batch_id, [outcome(a, 1, 4), outcome(b, 1, 4)], 0.05, []))
    assert a.spec_kind != "cache" and f"cache entries for seq {a.seq}, which is not its sequence" in caplog.text


def test_a_sampled_sequence_gets_no_entry_without_proposal_rows(core, caplog):
    """The speculation of a sampled sequence needs its proposal: an entry without one (or a row that does not hold
    its token) would make the router crash or the target refuse the round, failing the request."""
    (a,), verify = verifying(core, n=1, temperature=0.8)
    rows = [([1, 50], [0.5, 0.5]), ([2], [1.0]), ([60], [1.0])]   # the last row lacks its token 3
    core._on_draft(a.draft, wire.CacheEntries(a.seq, a.round + 1, [entry(), entry(token=5, proposal=rows)], 0.01))
    core._on_target(core.targets[0], wire.Outcomes(verify.batch_id, [outcome(a, 1, 4)], 0.05, []))
    assert "no proposal rows for 3 tokens" in caplog.text and a.spec_kind != "cache" and a.finish is None
    core._on_draft(a.draft, wire.CacheEntries(a.seq, a.round + 1, [entry(token=5, proposal=rows)], 0.01))
    assert "lies outside its proposal row's support" in caplog.text


# ---- the draft's JIT answers ---------------------------------------------------------------------------------

def jitting(core, n=2) -> tuple[list, wire.Jit]:
    reqs = [core.submit(f"j{i}", [5, 6, 7], SamplingParams(max_tokens=40), mode="sd") for i in range(n)]
    core._take_new()
    take(core, wire.Prefill)
    core._on_target(core.targets[0], wire.Prefilled([(r.seq, 9) for r in reqs], 0.01, []))
    take(core, wire.DraftAdd)
    for r in reqs[1:]:
        core._assign(r, "draft", reqs[0].draft)   # one JIT batch for all
    core._dispatch()
    (jit,) = take(core, wire.Jit)
    return reqs, jit


BAD_JITS = {
    "more tokens than asked": [11, 12, 13, 14],
    "a token outside the vocabulary": [11, VOCAB + 3, 13],
}


@pytest.mark.parametrize("bad", BAD_JITS)
def test_invalid_jit_tokens_give_way_to_an_ngram_backup(core, caplog, bad):
    (a, b), jit = jitting(core)
    d = a.draft
    core._on_draft(d, wire.JitResult(jit.batch_id, [(a.seq, BAD_JITS[bad], None), (b.seq, [11, 12, 13], None)], 0.01))
    assert f"JIT tokens for seq {a.seq} rejected" in caplog.text
    assert a.phase is Phase.READY and a.spec_kind in ("ngram", "none") and b.spec == [11, 12, 13]
    core._dispatch()
    (verify,) = take(core, wire.Verify)
    assert all(t < VOCAB and len(it.tokens) <= K for it in verify.items for t in it.tokens)


def test_jit_tokens_for_a_sequence_that_did_not_ask_are_ignored(core, caplog):
    core.cfg.jit_linger = 0   # a verifies while b waits for its JIT
    (a, b), jit = jitting(core)
    d = a.draft
    core._on_draft(d, wire.JitResult(jit.batch_id, [(a.seq, [11, 12, 13], None)], 0.01))
    core._dispatch()
    (verify,) = take(core, wire.Verify)
    # a is verifying now, b still waits for its own answer: neither may take tokens it did not ask this batch for
    core._on_draft(d, wire.JitResult(jit.batch_id + 50, [(b.seq, [1, 1, 1], None)], 0.01))
    core._on_draft(d, wire.JitResult(jit.batch_id, [(a.seq, [2, 2, 2], None), (4040, [3], None)], 0.01))
    assert a.phase is Phase.VERIFY and a.spec == [11, 12, 13] and b.phase is Phase.JIT
    assert caplog.text.count("did not ask batch") == 3


def test_duplicated_jit_answers_are_rejected(core, caplog):
    (a, b), jit = jitting(core)
    core._on_draft(a.draft, wire.JitResult(jit.batch_id, [(a.seq, [11, 12, 13], None), (a.seq, [20, 21, 22], None),
                                                          (b.seq, [11, 12, 13], None)], 0.01))
    assert "2 answers for one sequence" in caplog.text and a.spec_kind != "jit" and b.spec == [11, 12, 13]


# ---- the core's own loop, fake workers over ZeroMQ -----------------------------------------------------------

class FakeWorker:
    """A worker's data plane in a thread: answers Hello and Ping, and hands every other message to `reply`."""

    def __init__(self, ctx, role: str, reply):
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address, self.role, self.reply = f"tcp://127.0.0.1:{port}", role, reply
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            peer, *frames = self.sock.recv_multipart()
            msg = wire.decode(frames)
            answers = [ready(self.role)] if isinstance(msg, wire.Hello) else \
                [wire.Pong(msg.nonce)] if isinstance(msg, wire.Ping) else self.reply(msg)
            for answer in answers:
                self.sock.send_multipart([peer, *wire.encode(answer)])


def test_the_loop_survives_workers_that_answer_nonsense_and_the_output_stays_the_targets():
    """A target whose first verify answer of each sequence is j > K (then honest: it accepts nothing and
    decodes 4, 5, 6, ...) and a draft that answers every JIT with out-of-vocabulary tokens and publishes entries
    that are too long: each request still streams exactly the target's tokens, and the loop keeps running."""
    ctx = zmq.Context()
    lied: set[int] = set()
    made: dict[int, list[int]] = {}

    def target(msg):
        if isinstance(msg, wire.Prefill):
            return [wire.Prefilled([(it.seq, 3) for it in msg.items], 0.001, [])]
        if isinstance(msg, wire.Restore):
            return [wire.Restored([it.seq for it in msg.items], 0.001)]
        if isinstance(msg, wire.Verify):
            items = []
            for it in msg.items:
                if it.seq not in lied:
                    lied.add(it.seq)
                    items.append(wire.Outcome(it.seq, K + 5, 4))
                else:
                    made.setdefault(it.seq, []).append(4 + len(made.get(it.seq, [])))
                    items.append(wire.Outcome(it.seq, 0, made[it.seq][-1]))
            return [wire.Outcomes(msg.batch_id, items, 0.001, [])]
        return []

    def draft(msg):
        if isinstance(msg, wire.Jit):
            return [wire.JitResult(msg.batch_id, [(it.seq, [VOCAB + 1] * it.k, None) for it in msg.items], 0.001)]
        if isinstance(msg, wire.DraftRound):
            return [wire.CacheEntries(it.seq, it.round, [entry(tokens=[1] * (K + 2), accepted=0, token=t)
                                                         for t in range(VOCAB)], 0.001) for it in msg.items]
        return []

    workers = [FakeWorker(ctx, "target", target), FakeWorker(ctx, "draft", draft)]
    for w in workers:
        w.thread.start()
    core = RouterCore(CoreConfig(mode="ssd", adaptive=False, ready_timeout=20), [workers[0].address],
                      [workers[1].address], "h", [2])
    loop = threading.Thread(target=core.run, daemon=True)
    try:
        core.handshake()
        loop.start()
        reqs = [core.submit(f"l{i}", [5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True), mode="ssd")
                for i in range(3)]
        for req in reqs:
            seen, kind = [], None
            while kind != "done":
                kind, value = req.events.get(timeout=30)
                assert kind != "error", value
                seen += value if kind == "tokens" else []
            assert seen == [3, 4, 5, 6, 7, 8] and value is FinishReason.LENGTH
        assert loop.is_alive() and lied == {r.seq for r in reqs}
    finally:
        core.stop()
        loop.join(timeout=5)
        for w in workers:
            w.stop.set()
            w.thread.join(timeout=5)
            w.sock.close(0)
        ctx.term()
