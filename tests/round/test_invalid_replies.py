"""Worker replies that decode (valid msgpack, the right type) but cannot be right for the sequences they name:
the round core rejects and logs them (ssd/round/replies.py), no client sees a lost or altered token (the sequence
is rebuilt, backed up, or failed with a clear error), the other sequences go on untouched and the core keeps
running.

The core is driven in-process (tests/round/fakes.py, as in test_dispatch.py): replies are handed to it as its
worker handles would after decoding, and what it sends is recorded. The router's ZeroMQ loop against workers
that answer nonsense: tests/services/test_router_loop.py.
"""
import logging

import pytest

from ssd import wire
from ssd.params import FinishReason, SamplingParams, TokenLogprob
from ssd.round import CoreConfig, Phase
from ssd.round.state import MAX_TARGET_FAILURES
from tests.round.fakes import K, VOCAB, Rig, events, tokens_seen


@pytest.fixture
def rig(caplog):
    """ssd over one target and two drafts."""
    caplog.set_level(logging.DEBUG, logger="ssd.round")
    rig = Rig(CoreConfig(mode="ssd", adaptive=False, adaptive_fanout=False), drafts=[None, None])
    yield rig
    rig.core.shutdown("the test is over")


def verifying(rig, n=2, temperature=0.0) -> tuple[list, wire.Verify]:
    """n sequences prefilled (first token 9), their JITs answered [11, 12, 13], one Verify out for all."""
    core = rig.core
    params = SamplingParams(max_tokens=40, temperature=temperature)
    reqs = [core.submit(f"r{i}", [5, 6, 7], params, mode="ssd") for i in range(n)]
    core.take_new()
    rig.take(wire.Prefill)
    core.on_message(rig.target, wire.Prefilled([(r.seq, 9) for r in reqs], 0.01, []))
    rig.take(wire.DraftAdd)
    core.dispatch()
    verify = answer_jits(rig, None if temperature == 0 else [([11 + i, 50], [0.5, 0.5]) for i in range(K)])
    assert [r.phase for r in reqs] == [Phase.VERIFY] * n
    return reqs, verify


def answer_jits(rig, rows=None) -> wire.Verify:
    """Every JIT out answered [11, 12, 13] by the draft it went to; returns the Verify that then goes out."""
    for worker, jit in rig.take_sent(wire.Jit):
        rig.core.on_message(worker, wire.JitResult(jit.batch_id, [(it.seq, [11, 12, 13], rows) for it in jit.items],
                                                   0.01))
    rig.core.dispatch()
    (verify,) = rig.take(wire.Verify)
    rig.take(wire.DraftRound)
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
def test_an_invalid_outcome_rebuilds_its_sequence_and_the_others_commit(rig, caplog, bad):
    core = rig.core
    (a, b), verify = verifying(rig)
    tokens_seen(a), tokens_seen(b)
    items = BAD_OUTCOMES[bad](a) + [outcome(b, accepted=2, token=4)]
    core.on_message(rig.target, wire.Outcomes(verify.batch_id, items, 0.05, []))
    assert tokens_seen(a) == [] and a.output == [9]            # nothing of the bad reply reached the client
    (restore,) = rig.take(wire.Restore)
    assert a.phase is Phase.RESTORE and restore.items[0].seq == a.seq and restore.items[0].tokens == [5, 6, 7, 9]
    assert f"reply for seq {a.seq} rejected" in caplog.text
    assert tokens_seen(b) == [11, 12, 4] and b.output == [9, 11, 12, 4]   # its neighbour is untouched
    core.on_message(rig.target, wire.Restored([a.seq], 0.01))   # rebuilt: it goes on from its committed tokens
    core.dispatch()
    assert a.phase in (Phase.JIT, Phase.VERIFY) and a.finish is None


def test_an_invalid_first_token_prefills_again(rig, caplog):
    core = rig.core
    req = core.submit("p", [5, 6, 7], SamplingParams(max_tokens=40), mode="ssd")
    core.take_new()
    rig.take(wire.Prefill)
    core.on_message(rig.target, wire.Prefilled([(req.seq, VOCAB + 7)], 0.01, []))
    assert tokens_seen(req) == [] and req.phase is Phase.PREFILL and "rejected" in caplog.text
    (again,) = rig.take(wire.Prefill)
    assert again.items[0].tokens == [5, 6, 7]
    core.on_message(rig.target, wire.Prefilled([(req.seq, 9)], 0.01, []))
    assert tokens_seen(req) == [9]


def test_logprobs_reach_the_client_before_their_tokens_and_a_reply_that_owes_them_is_rejected(rig, caplog):
    core = rig.core
    asks, owed = (core.submit(rid, [5, 6, 7], SamplingParams(max_tokens=40, logprobs=1), mode="ssd")
                  for rid in ("asks", "owed"))
    core.take_new()
    (prefill,) = rig.take(wire.Prefill)
    assert [it.sampling.logprobs for it in prefill.items] == [1, 1]
    core.on_message(rig.target, wire.Prefilled([(asks.seq, 9), (owed.seq, 9)], 0.01, [],
                                               [wire.SeqLogprobs(asks.seq, [-0.5], [9], [-0.5])]))
    assert events(asks) == [("logprobs", [TokenLogprob(9, -0.5, ((9, -0.5),))]), ("tokens", [9])]
    assert tokens_seen(owed) == [] and owed.phase is Phase.PREFILL and "logprobs for 0 tokens" in caplog.text
    rig.take(wire.DraftAdd)
    core.dispatch()
    verify = answer_jits(rig)
    lps = wire.SeqLogprobs(asks.seq, [-0.1, -0.2], [11, 4], [-0.1, -0.2])   # j = 1: 11, then t* = 4
    core.on_message(rig.target, wire.Outcomes(verify.batch_id, [outcome(asks)], 0.05, [], [lps]))
    assert events(asks) == [("logprobs", [TokenLogprob(11, -0.1, ((11, -0.1),)), TokenLogprob(4, -0.2, ((4, -0.2),))]),
                            ("tokens", [11, 4])]


def test_prompt_logprobs_come_once_before_the_first_token_and_a_prefill_that_owes_them_is_rejected(rig, caplog):
    core = rig.core
    params = SamplingParams(max_tokens=40, prompt_logprobs=1)
    asks, owed, ranks = (core.submit(rid, [5, 6, 7], params, mode="ssd") for rid in ("asks", "owed", "ranks"))
    core.take_new()
    (prefill,) = rig.take(wire.Prefill)
    assert [it.sampling.prompt_logprobs for it in prefill.items] == [1, 1, 1]
    core.on_message(rig.target, wire.Prefilled(
        [(asks.seq, 9), (owed.seq, 9), (ranks.seq, 9)], 0.01, [], [],
        [wire.PromptLogprobs(asks.seq, [-1.5, -0.25], [3, 1], [2, 7], [-0.5, -0.25]),
         wire.PromptLogprobs(owed.seq, [-1.5], [3], [2], [-0.5]),                 # one token short
         wire.PromptLogprobs(ranks.seq, [-1.5, -0.25], [3, VOCAB + 1], [2, 7], [-0.5, -0.25])]))
    assert events(asks) == [("prompt_logprobs", [None, TokenLogprob(6, -1.5, ((2, -0.5),), 3),
                                                 TokenLogprob(7, -0.25, ((7, -0.25),), 1)]), ("tokens", [9])]
    assert "prompt logprobs for 1 tokens" in caplog.text and "a rank outside" in caplog.text
    assert tokens_seen(owed) == tokens_seen(ranks) == [] and owed.phase is ranks.phase is Phase.PREFILL


def test_a_target_that_keeps_answering_nonsense_fails_the_request_with_a_clear_error(rig):
    core = rig.core
    (a, b), verify = verifying(rig)
    events(a)
    for attempt in range(MAX_TARGET_FAILURES):
        core.on_message(rig.target, wire.Outcomes(verify.batch_id, [outcome(a, accepted=9)], 0.05, []))
        if attempt < MAX_TARGET_FAILURES - 1:
            rig.take(wire.Restore)
            core.on_message(rig.target, wire.Restored([a.seq], 0.01))
            core.dispatch()
            verify = answer_jits(rig)   # its next round, after the rebuild
    assert a.finish is FinishReason.ERROR and a.seq not in core.active
    (error,) = [e for e in events(a) if e[0] == "error"]
    assert error[1].startswith("target: invalid reply: j=9 accepted") and a.output == [9]
    assert b.finish is None and b.seq in core.active


def test_outcomes_for_unknown_sequences_or_batches_change_nothing(rig, caplog):
    core = rig.core
    (a, b), verify = verifying(rig)
    tokens_seen(a), tokens_seen(b)
    before = core.times.verify_batches
    core.on_message(rig.target, wire.Outcomes(verify.batch_id + 1000, [outcome(a), outcome(b)], 0.05, []))
    core.on_message(rig.target, wire.Outcomes(verify.batch_id, [wire.Outcome(4242, 1, 4)], 0.05, []))
    assert "answered verify batch" in caplog.text and "seq 4242 not awaited" in caplog.text
    assert core.times.verify_batches == before + 1    # only the known batch counts toward the timings
    assert tokens_seen(a) == tokens_seen(b) == [] and a.phase is b.phase is Phase.VERIFY
    assert not rig.take(wire.Restore)


def test_a_first_token_for_a_sequence_never_submitted_is_ignored(rig, caplog):
    rig.core.on_message(rig.target, wire.Prefilled([(777, 9)], 0.01, []))
    assert "seq 777, which is not waiting" in caplog.text and not rig.core.active and not rig.sent


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
def test_invalid_cache_entries_are_not_published(rig, caplog, bad):
    """None: a valid entry, which the next lookup hits (so the test would see an invalid one published)."""
    core = rig.core
    (a, b), verify = verifying(rig)
    fields = {**dict(accepted=1, token=4), **BAD_ENTRIES.get(bad, {})}
    core.on_message(a.draft, wire.CacheEntries(a.seq, a.round.number + 1,
                                               [entry(**{**dict(tokens=[1, 2, 3]), **fields})], 0.01))
    core.on_message(rig.target, wire.Outcomes(verify.batch_id, [outcome(a, 1, 4), outcome(b, 1, 4)], 0.05, []))
    if bad is None:
        assert a.round.source == "cache" and a.round.tokens == [1, 2, 3]
        return
    assert f"cache entries for seq {a.seq} round {a.round.number} rejected" in caplog.text
    assert a.round.source != "cache" and all(t < VOCAB for t in a.round.tokens) and a.output == [9, 11, 4]


def test_cache_entries_for_a_sequence_of_another_draft_are_ignored(rig, caplog):
    core = rig.core
    (a, b), verify = verifying(rig)
    other = next(d for d in rig.drafts if d is not a.draft)
    core.on_message(other, wire.CacheEntries(a.seq, a.round.number + 1, [entry()], 0.01))
    core.on_message(other, wire.CacheEntries(31337, 1, [entry()], 0.01))
    core.on_message(rig.target, wire.Outcomes(verify.batch_id, [outcome(a, 1, 4), outcome(b, 1, 4)], 0.05, []))
    assert a.round.source != "cache" and f"cache entries for seq {a.seq}, which is not its sequence" in caplog.text


def test_a_sampled_sequence_gets_no_entry_without_proposal_rows(rig, caplog):
    """The speculation of a sampled sequence needs its proposal: an entry without one (or a row that does not hold
    its token) would make the core crash or the target refuse the round, failing the request."""
    core = rig.core
    (a,), verify = verifying(rig, n=1, temperature=0.8)
    rows = [([1, 50], [0.5, 0.5]), ([2], [1.0]), ([60], [1.0])]   # the last row lacks its token 3
    core.on_message(a.draft, wire.CacheEntries(a.seq, a.round.number + 1, [entry(), entry(token=5, proposal=rows)],
                                               0.01))
    core.on_message(rig.target, wire.Outcomes(verify.batch_id, [outcome(a, 1, 4)], 0.05, []))
    assert "no proposal rows for 3 tokens" in caplog.text and a.round.source != "cache" and a.finish is None
    core.on_message(a.draft, wire.CacheEntries(a.seq, a.round.number + 1, [entry(token=5, proposal=rows)], 0.01))
    assert "lies outside its proposal row's support" in caplog.text


# ---- the draft's JIT answers ---------------------------------------------------------------------------------

def jitting(rig, n=2) -> tuple[list, wire.Jit]:
    core = rig.core
    reqs = [core.submit(f"j{i}", [5, 6, 7], SamplingParams(max_tokens=40), mode="sd") for i in range(n)]
    core.take_new()
    rig.take(wire.Prefill)
    core.on_message(rig.target, wire.Prefilled([(r.seq, 9) for r in reqs], 0.01, []))
    rig.take(wire.DraftAdd)
    for r in reqs[1:]:
        core.pool.assign(r, "draft", reqs[0].draft)   # one JIT batch for all
    core.dispatch()
    (jit,) = rig.take(wire.Jit)
    return reqs, jit


BAD_JITS = {
    "more tokens than asked": [11, 12, 13, 14],
    "a token outside the vocabulary": [11, VOCAB + 3, 13],
}


@pytest.mark.parametrize("bad", BAD_JITS)
def test_invalid_jit_tokens_give_way_to_an_ngram_backup(rig, caplog, bad):
    core = rig.core
    (a, b), jit = jitting(rig)
    d = a.draft
    core.on_message(d, wire.JitResult(jit.batch_id, [(a.seq, BAD_JITS[bad], None), (b.seq, [11, 12, 13], None)],
                                      0.01))
    assert f"JIT tokens for seq {a.seq} rejected" in caplog.text
    assert a.phase is Phase.READY and a.round.source in ("ngram", "none") and b.round.tokens == [11, 12, 13]
    core.dispatch()
    (verify,) = rig.take(wire.Verify)
    assert all(t < VOCAB and len(it.tokens) <= K for it in verify.items for t in it.tokens)


def test_jit_tokens_for_a_sequence_that_did_not_ask_are_ignored(caplog):
    caplog.set_level(logging.DEBUG, logger="ssd.round")
    # jit_linger 0: a verifies while b waits for its JIT
    rig = Rig(CoreConfig(mode="ssd", adaptive=False, adaptive_fanout=False, jit_linger=0), drafts=[None, None])
    core = rig.core
    (a, b), jit = jitting(rig)
    d = a.draft
    core.on_message(d, wire.JitResult(jit.batch_id, [(a.seq, [11, 12, 13], None)], 0.01))
    core.dispatch()
    (verify,) = rig.take(wire.Verify)
    # a is verifying now, b still waits for its own answer: neither may take tokens it did not ask this batch for
    core.on_message(d, wire.JitResult(jit.batch_id + 50, [(b.seq, [1, 1, 1], None)], 0.01))
    core.on_message(d, wire.JitResult(jit.batch_id, [(a.seq, [2, 2, 2], None), (4040, [3], None)], 0.01))
    assert a.phase is Phase.VERIFY and a.round.tokens == [11, 12, 13] and b.phase is Phase.JIT
    assert caplog.text.count("did not ask batch") == 3


def test_duplicated_jit_answers_are_rejected(rig, caplog):
    (a, b), jit = jitting(rig)
    rig.core.on_message(a.draft, wire.JitResult(jit.batch_id, [(a.seq, [11, 12, 13], None),
                                                               (a.seq, [20, 21, 22], None),
                                                               (b.seq, [11, 12, 13], None)], 0.01))
    assert "2 answers for one sequence" in caplog.text and a.round.source != "jit" and b.round.tokens == [11, 12, 13]
