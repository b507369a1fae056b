"""Checks of what workers answer, against the sequence a reply names. No torch.

The codec (`ssd.wire`) checks each field's kind; these check what a field must mean for its sequence. A reply
that fails is logged and never committed or cached: an outcome or first token (or the logprobs it owes a
sequence that asked for them) rebuilds its sequence on the target, a cache entry is not published (a miss), a JIT answer gives way to an n-gram backup.
"""
from __future__ import annotations

import dataclasses
import logging
from collections import Counter

from ssd import wire
from ssd.params import TokenLogprob
from ssd.round.state import Phase
from ssd.spec.backup import BackupPolicy, choose_backup
from ssd.spec.check import speculation_problem

log = logging.getLogger("ssd.round")


def token_problem(token: int, vocab_size: int) -> str | None:
    return f"token {token} lies outside the vocabulary [0, {vocab_size})" if token >= vocab_size else None


def outcome_problem(req, out: wire.Outcome, copies: int, vocab_size: int) -> str | None:
    if copies > 1:
        return f"{copies} outcomes for one sequence in one batch"
    if out.accepted > len(req.round.tokens):
        return f"j={out.accepted} accepted of a speculation of {len(req.round.tokens)} tokens"
    return token_problem(out.token, vocab_size)


def logprobs_of(req, lp: wire.SeqLogprobs | None, tokens: list[int], vocab_size: int, n: int | None = -1):
    """The TokenLogprobs of `tokens`, which a reply commits for `req` (None if it asked for none), or the problem
    (a str) with what the target sent. `n`: the alternatives asked for (default: the request's `logprobs`)."""
    n = req.params.logprobs if n == -1 else n
    if n is None:
        return None
    if lp is None or len(lp.logprobs) != len(tokens) or not len(lp.top_ids) == len(lp.top_logprobs) == n * len(tokens):
        return f"logprobs for {len(lp.logprobs) if lp else 0} tokens and {len(lp.top_ids) if lp else 0} " \
               f"alternatives; the reply commits {len(tokens)} tokens with {n} alternatives each"
    if lp.top_ids and max(lp.top_ids) >= vocab_size:
        return f"an alternative token lies outside the vocabulary [0, {vocab_size})"
    return [TokenLogprob(t, p, tuple(zip(lp.top_ids[i * n:(i + 1) * n], lp.top_logprobs[i * n:(i + 1) * n])))
            for i, (t, p) in enumerate(zip(tokens, lp.logprobs))]


def prompt_logprobs_of(req, lp: wire.PromptLogprobs | None, vocab_size: int):
    """What a `Prefilled` owes a request that asked for prompt logprobs: None for its first prompt token, then a
    TokenLogprob (with its rank) per prompt token after it (None if it asked for none), or the problem (a str)."""
    n, tokens = req.params.prompt_logprobs, req.prompt[1:]
    if n is None:
        return None
    if lp is not None and (len(lp.ranks) != len(lp.logprobs) or any(not 0 < r <= vocab_size for r in lp.ranks)):
        return f"prompt logprobs with {len(lp.ranks)} ranks for {len(lp.logprobs)} tokens, or a rank outside " \
               f"1..{vocab_size}"
    rows = logprobs_of(req, lp, tokens, vocab_size, n)
    if isinstance(rows, str):
        return f"prompt {rows}"
    return [None] + [dataclasses.replace(row, rank=r) for row, r in zip(rows, lp.ranks)]


def draft_tokens_problem(req, tokens: list[int], proposal, k: int, vocab_size: int) -> str | None:
    """Why draft tokens (a cache entry's or a JIT answer's) cannot be the sequence's next speculation of at most
    `k` tokens: what the target would refuse (failing the request) must not reach it."""
    if len(tokens) > k:
        return f"{len(tokens)} tokens, more than the {k} asked for"
    if req.params.needs_proposal and proposal is None:   # the target would take it as one-hot: a biased q
        return f"no proposal rows for {len(tokens)} tokens"
    return speculation_problem(tokens, proposal if req.params.needs_proposal else None, vocab_size)


def entry_problem(req, e: wire.CacheEntry, k: int, vocab_size: int) -> str | None:
    if e.accepted > k:
        return f"an entry for outcome j={e.accepted}, more than K={k}"
    return token_problem(e.token, vocab_size) or draft_tokens_problem(req, e.tokens, e.proposal, k, vocab_size)


class Replies:
    """Applies what workers answer to the core's sequences: first tokens, outcomes, restores, cache entries, JIT
    tokens and errors. A reply for a sequence that no longer waits for it (finished, restored, or answered by
    another batch since) is ignored."""

    def __init__(self, core):
        self.core = core

    def handle(self, worker, msg) -> None:
        on = {wire.Prefilled: self.prefilled, wire.Outcomes: self.outcomes, wire.Restored: self.restored,
              wire.CacheEntries: self.cache_entries, wire.JitResult: self.jit_result}.get(type(msg))
        if on is not None:
            on(worker, msg)
        elif isinstance(msg, wire.Error):
            (self.target_error if worker.role == "target" else self.draft_error)(worker, msg)

    # ---- from targets -----------------------------------------------------------------------------
    def prefilled(self, worker, msg: wire.Prefilled) -> None:
        core = self.core
        now = core.clock()
        core.planner.observe_target_busy(worker, now - max(0.0, msg.elapsed_s), now)
        blocks = {seq: block for seq, *block in msg.features}
        logprobs = {lp.seq: lp for lp in msg.logprobs}
        prompt_logprobs = {lp.seq: lp for lp in msg.prompt_logprobs}
        counts = Counter(seq for seq, _ in msg.items)
        for seq, token in msg.items:
            req = core.active.get(seq)
            if req is None or req.phase is not Phase.PREFILL or req.target is not worker:
                log.debug("target %s: first token for seq %d, which is not waiting for one: ignored",
                          worker.address, seq)
                continue
            problem = token_problem(token, core.vocab_size) or \
                (f"{counts[seq]} first tokens" if counts[seq] > 1 else None)
            lps = logprobs_of(req, logprobs.get(seq), [token], core.vocab_size)
            prompt_lps = prompt_logprobs_of(req, prompt_logprobs.get(seq), core.vocab_size)
            bad = problem or (lps if isinstance(lps, str) else None) or \
                (prompt_lps if isinstance(prompt_lps, str) else None)
            if bad:
                self._bad_target_reply(worker, req, bad)
                continue
            if prompt_lps is not None:   # before the first token, once: a request leaves PREFILL with it
                self.core.emit(req, ("prompt_logprobs", prompt_lps))
            core.features.keep(req, blocks.get(seq))
            core.cache.start_sequence(seq, first_round=0)
            core.commit(req, [token], lps)
            if req.finish is not None:
                core.finish(req, req.finish)
            else:
                core.add_to_draft(req)
                req.last_outcome_at = core.clock()
                core.next(req, 0, token)

    def outcomes(self, worker, msg: wire.Outcomes) -> None:
        core = self.core
        sent = core.batches.verify_answered(worker, msg.batch_id)
        if sent is None:   # its items match no sequence's verify_batch either: each is ignored below
            log.warning("target %s answered verify batch %d, which is not out (answered before or never sent)",
                        worker.address, msg.batch_id)
        if not msg.items:   # none of its items could run (each got an Error): nothing was verified
            return
        if sent is not None:
            roundtrip = core.clock() - sent[0]
            core.timings.observe_verify(len(msg.items), msg.elapsed_s)
            t = core.times
            t.verify_batches += 1
            t.target_verify_s += msg.elapsed_s
            t.verify_roundtrip_s += roundtrip
            core.metrics.target_verify(msg.elapsed_s, len(msg.items))
            core.metrics.router_hop(max(0.0, roundtrip - msg.elapsed_s))
        blocks = {seq: block for seq, *block in msg.features}
        logprobs = {lp.seq: lp for lp in msg.logprobs}
        counts = Counter(out.seq for out in msg.items)
        # the drafted rounds this batch verified: each one's acceptance weighs 1/peers of a round for the policy
        peers = sum(1 for out in msg.items if (r := core.active.get(out.seq)) is not None and r.round.tokens
                    and r.round.verify_batch == msg.batch_id)
        for out in msg.items:
            req = core.active.get(out.seq)
            if req is None or req.phase is not Phase.VERIFY or req.target is not worker or \
                    req.round.verify_batch != msg.batch_id:
                # stale (the sequence finished or was restored since: this target stalled, then came back)
                log.debug("target %s: outcome for seq %d not awaited from batch %d: ignored", worker.address,
                          out.seq, msg.batch_id)
                continue
            problem = outcome_problem(req, out, counts[out.seq], core.vocab_size)
            lps = None if problem else logprobs_of(req, logprobs.get(out.seq),
                                                   req.round.tokens[:out.accepted] + [out.token], core.vocab_size)
            if problem or isinstance(lps, str):
                self._bad_target_reply(worker, req, problem or lps)
                continue
            self._apply_outcome(req, out, blocks.get(out.seq), lps, peers)
        if sent is not None:
            core.planner.observe_verify(sent[1], msg.elapsed_s, roundtrip - msg.elapsed_s, len(msg.items))

    def _apply_outcome(self, req, out: wire.Outcome, block, logprobs=None, peers: int = 1) -> None:
        core, rnd = self.core, req.round
        core.features.keep(req, block)
        rnd.number += 1
        committed = core.commit(req, rnd.tokens[:out.accepted] + [out.token], logprobs)
        req.stats.record_round(len(rnd.tokens), out.accepted, committed)
        core.metrics.round_finished(req.mode, len(rnd.tokens), out.accepted, committed)
        if rnd.source in ("jit", "ngram") and rnd.tokens:
            core.timings.observe_acceptance(BackupPolicy(rnd.source), out.accepted, len(rnd.tokens))
        core.planner.observe_round(req, len(rnd.tokens), out.accepted, max(1, peers))
        now = core.clock()
        if req.last_outcome_at is not None:
            core.planner.observe_round_time(req, len(core.active), req.last_outcome_at, now)
        req.last_outcome_at = now
        if req.finish is not None:
            core.finish(req, req.finish)
        else:
            core.next(req, out.accepted, out.token)

    def restored(self, worker, msg: wire.Restored) -> None:
        core = self.core
        now = core.clock()
        core.planner.observe_target_busy(worker, now - max(0.0, msg.elapsed_s), now)
        for seq in msg.seqs:
            req = core.active.get(seq)
            if req is not None and req.phase is Phase.RESTORE and req.target is worker:
                core.backup(req, choose_backup(core.policy(req), max(1, len(core.active)), core.timings))

    def target_error(self, worker, msg: wire.Error) -> None:
        core = self.core
        req = core.active.get(msg.seq) if msg.seq is not None else None
        if msg.seq is None and msg.code == "internal":
            core.members.target_batch_failed(worker, msg.message)
        elif req is None or req.target is worker:
            self._worker_error("target", msg)

    def _bad_target_reply(self, worker, req, problem: str) -> None:
        log.warning("target %s: reply for seq %d rejected (%s): rebuilding the sequence from its committed tokens",
                    worker.address, req.seq, problem)
        self.core.rebuild_on_target(req, f"invalid reply: {problem}")

    def _worker_error(self, role: str, msg: wire.Error) -> None:
        req = self.core.active.get(msg.seq) if msg.seq is not None else None
        log.warning("%s error %s: %s (seq %s)", role, msg.code, msg.message, msg.seq)
        if req is not None:
            self.core.fail(req, f"{role}: {msg.message}")

    # ---- from drafts ------------------------------------------------------------------------------
    def cache_entries(self, worker, msg: wire.CacheEntries) -> None:
        core = self.core
        core.times.draft_rounds += 1
        core.times.draft_round_s += msg.elapsed_s
        core.metrics.draft_round(msg.elapsed_s)
        if not self._first_answer(worker, (msg.seq,)):
            core.planner.observe_draft_round(worker, msg.elapsed_s)
        req = core.active.get(msg.seq)
        if req is None or req.draft is not worker:
            log.debug("draft %s: cache entries for seq %d, which is not its sequence (now): ignored",
                      worker.address, msg.seq)
            return
        awaited = req.phase is Phase.AWAIT and msg.round == req.round.number   # its outcome waits for these
        problem = next(filter(None, (entry_problem(req, e, core.k, core.vocab_size) for e in msg.entries)), None)
        if problem:   # the sequence misses this round and takes a backup: the target decides every token anyway
            log.warning("draft %s: cache entries for seq %d round %d rejected: %s", worker.address, msg.seq,
                        msg.round, problem)
            if awaited:
                core.resolve_wait(req, None)
            return
        if awaited:   # the cache moved on to the next round at the lookup: the entry is taken from here
            j, t = req.round.awaiting
            core.resolve_wait(req, next((e for e in reversed(msg.entries) if (e.accepted, e.token) == (j, t)), None))
            return
        core.cache.publish(msg.seq, msg.round, msg.entries)

    def jit_result(self, worker, msg: wire.JitResult) -> None:
        core = self.core
        roundtrip = core.batches.jit_answered(msg.batch_id)
        if roundtrip is not None:
            core.planner.observe_jit(roundtrip, msg.elapsed_s)
        steps = max((len(tokens) for _, tokens, _ in msg.items), default=0)   # K of this JIT, not the draft's
        if steps and not self._first_answer(worker, (seq for seq, _, _ in msg.items)):
            core.timings.observe_draft_step(len(msg.items), msg.elapsed_s / steps)
        core.times.jit_batches += 1
        core.times.jit_s += msg.elapsed_s
        core.metrics.jit(msg.elapsed_s)
        counts = Counter(seq for seq, _, _ in msg.items)
        for seq, tokens, proposal in msg.items:
            req = core.active.get(seq)
            if req is None or req.phase is not Phase.JIT or req.draft is not worker or \
                    req.round.jit_batch != msg.batch_id:
                log.debug("draft %s: JIT tokens for seq %d, which did not ask batch %d for them: ignored",
                          worker.address, seq, msg.batch_id)
                continue
            room = core.room(req)
            problem = draft_tokens_problem(req, tokens, proposal, room, core.vocab_size) or \
                (f"{counts[seq]} answers for one sequence" if counts[seq] > 1 else None)
            if problem:
                log.warning("draft %s: JIT tokens for seq %d rejected (%s): n-gram backup", worker.address, seq,
                            problem)
                core.backup(req, BackupPolicy.NGRAM)
                continue
            req.round.tokens = tokens[:room]
            req.round.proposal = (proposal or [])[:room] if req.params.needs_proposal else None
            req.phase = Phase.READY

    def _first_answer(self, worker, seqs) -> bool:
        """Whether this answer of the draft is its first for any of `seqs` since it was (re)given them (those are
        then marked answered). Such an answer's compute also holds the KV of every token the draft was given: the
        prompt of a new request, the whole context after the draft's restart. Taken as K draft steps, one first JIT
        after a restart (0.05 s for 3 steps of 4 ms) became the whole draft-step line while no other JIT had been
        timed, and SD ran a 16-token request at K = 0 (a CI run of tests/services/test_supervisor.py, 2026-12-05)."""
        fresh = False
        for seq in seqs:
            req = self.core.active.get(seq)
            if req is not None and req.draft is worker and req.draft_fresh:
                req.draft_fresh, fresh = False, True
        return fresh

    def draft_error(self, worker, msg: wire.Error) -> None:
        core = self.core
        req = core.active.get(msg.seq) if msg.seq is not None else None
        if msg.code == "unknown_sequence" and req is not None and req.finish is None and req.draft is worker:
            self._rebuild_on_draft(req)   # the draft lost it (restart): rebuild from committed tokens
        elif msg.code == "internal" and msg.seq is None:
            # a whole batch failed on the draft: its state for our sequences is in doubt and a JIT it owed will
            # never come, so rebuild them there and back up the ones waiting
            log.warning("draft error %s: %s: rebuilding its sequences", msg.code, msg.message)
            for r in list(core.active.values()):
                if r.draft is worker and r.finish is None:
                    self._rebuild_on_draft(r)
        else:
            log.warning("draft error %s: %s (seq %s)", msg.code, msg.message, msg.seq)
            if req is not None and req.phase is Phase.AWAIT and req.draft is worker:
                # the draft may have dropped the round it waits for (a delta it refused): a JIT instead
                core.resolve_wait(req, None, BackupPolicy.JIT)

    def _rebuild_on_draft(self, req) -> None:
        self.core.add_to_draft(req)
        if req.phase is Phase.JIT:
            self.core.backup(req, BackupPolicy.NGRAM)
        elif req.phase is Phase.AWAIT:   # the round it waits for will not come
            self.core.resolve_wait(req, None, BackupPolicy.NGRAM)
