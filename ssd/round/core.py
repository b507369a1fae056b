"""RoundCore: admission, the round per sequence, backups and finishing, over a pool of worker handles.

See the package docstring (`ssd.round`) for the round and the events/commands contract. Sequences advance
independently: a verify batch holds whichever sequences are ready, so one miss never stalls the others. If a
draft dies its sequences continue on n-gram/none backups and are re-added from their committed tokens when one
is back; a target that dies has its sequences restored on another. Output never depends on any of this: the
target decides every token. One thread drives the core (the shell's loop); `submit`/`abort` may be called from
any thread and meet it at queues (`ssd.round.intake`).

Rounds: prefill is round 0 and its outcome (0, t0) is a forced miss; verification r >= 1 is round r and its
outcome (j, t*) is looked up under (seq, r, j, t*) for the speculation of round r+1.
"""
from __future__ import annotations

import logging
import time
import weakref
from typing import Callable

from ssd import wire
from ssd.engine.stats import SpecStats
from ssd.params import FinishReason, SamplingParams, ending_tokens, finish_reason, speculation_room
from ssd.round.batches import BatchLedger
from ssd.round.dispatch import Dispatcher
from ssd.round.features import FeatureLedger
from ssd.round.intake import Intake
from ssd.round.metrics import RoundMetrics
from ssd.round.planner import SpeculationPlanner
from ssd.round.pool import WorkerPool
from ssd.round.replies import Replies
from ssd.round.state import MAX_TARGET_FAILURES, CoreConfig, Phase, Request, Timings
from ssd.round.workers import Membership
from ssd.spec.backup import BackupPolicy, BackupTimings, choose_backup
from ssd.spec.cache import LookupReason, SpeculationCache
from ssd.spec.ngram import ngram_propose

log = logging.getLogger("ssd.round")


class RoundCore:
    def __init__(self, cfg: CoreConfig, pool: WorkerPool, eos_token_ids, metrics: RoundMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic, dynamic_pool: bool = False):
        if cfg.mode != "ar" and not pool.drafts and not dynamic_pool:
            raise ValueError(f"mode {cfg.mode} needs a draft address")
        if not pool.targets and not dynamic_pool:
            raise ValueError("at least one target address (or a discovery source) is needed")
        self.cfg, self.pool, self.clock = cfg, pool, clock
        self.dynamic_pool = dynamic_pool   # workers may join later (discovery): no draft yet is not an error
        self.eos = frozenset(eos_token_ids)
        self.metrics = metrics or RoundMetrics()
        self.backup_policy = BackupPolicy(cfg.backup)
        self.intake = Intake(clock)
        self.cache = SpeculationCache()
        self.timings = BackupTimings(k=3)
        self.stats = SpecStats()
        self.times = Timings()
        self.batches = BatchLedger(clock, cfg.verify_inflight, cfg.verify_hold, cfg.jit_linger)
        self.features = FeatureLedger(pool, self.metrics)
        self.planner = SpeculationPlanner(0, False, False, cfg.probe_every, self.timings, self.metrics, clock)
        # the parts reach the core through a weak proxy: no reference cycle, so a core (and the workers an
        # in-process engine holds through it) is freed as soon as it is dropped, not at the next cyclic GC
        me = weakref.proxy(self)
        self.replies = Replies(me)
        self.members = Membership(me)
        self.dispatcher = Dispatcher(me)
        self.waiting: list[Request] = []
        self.active: dict[int, Request] = {}
        self.finished = 0
        self._held: list | None = None   # events held back while a pass runs (`hold_events`)

    # ---- set-up and the shell's calls -----------------------------------------------------------
    def start(self) -> None:
        """Every worker given is ready: fix the model's shape and K (StartupError if they do not fit)."""
        self.pool.configure()
        k = self.pool.k
        self.timings = BackupTimings(k=max(1, k))
        self.planner = SpeculationPlanner(k, self.cfg.adaptive, self.cfg.adaptive_fanout, self.cfg.probe_every,
                                          self.timings, self.metrics, self.clock,
                                          lambda batch, mode, me=weakref.proxy(self): me._batch_seqs(batch, mode))
        self.members.report_drafts_alive()

    def _batch_seqs(self, batch: int, mode: str) -> list[int]:
        """The active sequences of `mode` whose round verify batch `batch` holds (or answered)."""
        return [r.seq for r in self.active.values() if r.mode == mode and r.round.verify_batch == batch]

    @property
    def k(self) -> int:
        return self.pool.k

    @property
    def max_len(self) -> int:
        return self.pool.max_len

    @property
    def vocab_size(self) -> int:
        return self.pool.vocab_size

    def submit(self, rid: str, prompt: list[int], params: SamplingParams, mode: str = "", k: int = 0,
               deadline: float | None = None, events=None, replace: bool = False, prompt_len: int = 0) -> Request:
        """Queue a request. `prompt_len`: how many of `prompt` the client sent (0 = all; a resumed request's prompt
        holds its journaled output after them, which penalties count as output)."""
        mode = mode or self.cfg.mode
        if params.logit_bias and self.vocab_size and params.logit_bias[-1][0] >= self.vocab_size:
            raise ValueError(f"logit_bias: token ids must be in [0, {self.vocab_size})")
        return self.intake.submit(rid, prompt, params, mode, k, self.pool.k,
                                  bool(self.pool.drafts) or self.dynamic_pool, deadline, events, replace, prompt_len)

    def abort(self, req: Request, reason: FinishReason = FinishReason.ABORT) -> None:
        self.intake.abort(req, reason)

    def abort_id(self, rid: str) -> bool:
        return self.intake.abort_id(rid)

    def emit(self, req: Request, event: tuple) -> None:
        """Hand `event` to the request's stream, or hold it until `release_events` while a pass holds events."""
        if self._held is None:
            req.events.put(event)
        else:
            self._held.append((req.events, event))

    def hold_events(self) -> None:
        """Hold the events of what follows until `release_events`, in their order. The router holds a pass's: each
        event wakes the thread of its client's stream, and those threads took the interpreter from the loop between
        an outcome and the next verify while the target waited. At batch 16 the loop took 3.4 ms (ar) and 4.1 ms
        (ssd) from the one to the other, 2.1 and 1.9 ms with the events held; at batch 1, 1.3 and 1.05 ms (a trace
        of both processes' clocks, 2026-12-06). End to end, with the client on this host's two cores, the gain was
        inside the noise."""
        if self._held is None:
            self._held = []

    def release_events(self) -> None:
        held, self._held = self._held, None
        for events, event in held or ():
            events.put(event)

    def on_message(self, worker, msg) -> None:
        """A worker's reply (Prefilled, Outcomes, Restored, CacheEntries, JitResult, Error)."""
        self.replies.handle(worker, msg)

    def step(self) -> None:
        """One pass of the loop: take new requests and aborts, end what is past its deadline, admit, follow up
        sequences without a target, and send what is ready."""
        self.take_new()
        self.members.follow_orphans()
        self.dispatch()

    def next_timer(self) -> float | None:
        """The clock's time at which a pass is due though no message or request came (a linger ending), or None."""
        return self.batches.linger_ends()

    def shutdown(self, message: str) -> None:
        for req in list(self.active.values()) + self.waiting:
            self.emit(req, ("error", message))

    # ---- admission ------------------------------------------------------------------------------
    def take_new(self) -> None:
        self.waiting.extend(self.intake.new())
        for req, reason in self.intake.aborted():
            self.end(req, reason)
        now = self.clock()
        for req in [r for r in (*self.active.values(), *self.waiting) if r.deadline is not None and r.deadline < now]:
            self.end(req, FinishReason.TIME_LIMIT)
        room = self.cfg.max_batch - len(self.active) if self.pool.any_alive("target") else 0
        admit, self.waiting = self.waiting[:max(0, room)], self.waiting[max(0, room):]
        if not admit:
            return
        self.metrics.set_queue_depth(len(self.waiting))
        self.metrics.set_active(len(self.active) + len(admit))
        for req in admit:
            self.metrics.request_started(req.mode)
            req.admitted_at = now
            self.active[req.seq] = req
        self.send_prefill(admit, wire.Prefill)

    def send_prefill(self, reqs: list[Request], kind) -> None:
        """Prefill (or, after a target failure, Restore) each sequence on the least-loaded live target, one
        message per target. With none alive, a sequence waits (up to `target_wait` s) for one to come back."""
        items: dict = {}
        for req in reqs:
            if req.phase is Phase.AWAIT:   # its target died after the outcome: the Restore's answer takes a backup
                self._end_wait(req, "failed")
            self.pool.assign(req, "target", self.pool.pick("target"))
            req.phase = Phase.PREFILL if kind is wire.Prefill else Phase.RESTORE
            req.last_outcome_at = None   # the wait for a (new) target is not a round's time
            if req.target is None:
                self.members.orphan(req, kind)
                continue
            self.members.adopted(req)
            tokens = req.prompt if kind is wire.Prefill else req.tokens
            item = wire.PrefillItem(req.seq, tokens, self.sampling_spec(req), req.prompt_len or len(req.prompt))
            items.setdefault(req.target, []).append((item, self.features.wanted(req)))
        for target, group in items.items():
            if kind is wire.Prefill:
                for wants in (True, False):   # the features flag is per message
                    part = [it for it, w in group if w is wants]
                    if part:
                        target.send(wire.Prefill(part, wants))
            else:
                target.send(kind([it for it, _ in group]))

    def sampling_spec(self, req: Request) -> wire.SamplingSpec:
        """How the target samples the request's tokens: its parameters, and the tokens that end it (which
        `min_tokens` holds back; the target knows no EOS of its own)."""
        s = req.params
        ending = list(ending_tokens(s, self.eos)) if s.min_tokens else []
        return wire.SamplingSpec(s.temperature, s.top_k, s.top_p, s.min_p, s.seed, s.presence_penalty,
                                 s.frequency_penalty, s.repetition_penalty, list(s.logit_bias), s.min_tokens, ending,
                                 s.logprobs, s.seed_stream, *((s.constraint.kind, s.constraint.text)
                                                              if s.constraint else ()),
                                 prompt_logprobs=s.prompt_logprobs)

    # ---- the round ------------------------------------------------------------------------------
    def room(self, req: Request) -> int:
        return speculation_room(req.round.k, req.params, len(req.output), len(req.prompt) + len(req.output),
                                self.pool.max_len)

    def commit(self, req: Request, tokens: list[int], logprobs: list | None = None) -> int:
        """Append tokens until the sequence finishes, stream them (after their `logprobs`, when it asked for
        them: a ("logprobs", [TokenLogprob]) event before the ("tokens", ids) one); returns how many were
        committed."""
        n, now = 0, self.clock()
        for t in tokens:
            req.output.append(t)
            n += 1
            req.finish = finish_reason(t, req.params, self.eos, len(req.output), len(req.prompt) + len(req.output),
                                       self.pool.max_len)
            if req.finish is not None:
                break
        if req.first_token_at is None:
            req.first_token_at = now
        else:
            self.metrics.tokens_emitted(n, now - req.last_emit_at)
        req.last_emit_at = now
        if logprobs is not None:
            self.emit(req, ("logprobs", logprobs[:n]))
        self.emit(req, ("tokens", req.output[-n:]))
        return n

    def add_to_draft(self, req: Request) -> None:
        """(Re)build the sequence on its draft, or on the least-loaded live one if it has none."""
        if req.mode == "ar":
            return
        if req.draft is None or not req.draft.alive:
            self.pool.assign(req, "draft", self.pool.pick("draft"))
        d = req.draft
        if d is None:
            return
        p = req.params
        if p.greedy:
            params = wire.DraftParamsSpec(0.0, 0, 1.0, 0, p.seed)
        elif p.coupled:   # the draft picks with the target's filters and the position's noise; no q, no Saguaro
            params = wire.DraftParamsSpec(p.temperature, p.top_k, 1.0, 0, p.seed, True, p.top_p, p.min_p)
        else:
            params = wire.DraftParamsSpec(p.temperature, self.cfg.draft_top_k, self.cfg.saguaro_c, 1, p.seed)
        if p.constraint:   # the draft proposes within the grammar the target masks to
            params.constraint_kind, params.constraint = p.constraint.kind, p.constraint.text
        tokens = req.tokens
        d.send(wire.DraftAdd([wire.DraftAddItem(req.seq, tokens, params, self.features.take(req),
                                                req.prompt_len or len(req.prompt))]))
        req.draft_sent = len(tokens)
        req.draft_fresh = True

    def next(self, req: Request, j: int, t: int) -> None:
        """After an outcome (j, t*): the next speculation from the cache, or a backup (none when K is 0).

        An outcome that finds the draft late (nothing published for this round yet, though a DraftRound went out)
        waits for its entries (Phase.AWAIT, `cfg.await_late`) where the backup would be a JIT: the draft runs one
        message at a time, so that JIT would start only once the round in progress was done, and the entries it
        publishes then hold the outcome about two times in three. The lookup counts as late (`stats.cache`, the
        lookups metric: the draft pool's lag, which the draft HPA scales on); how its wait ended counts when the
        entries come (`resolve_wait`: `stats.waits`)."""
        rnd = req.round
        rnd.k = self.planner.plan_k(req)
        if req.mode == "ssd":
            entry, reason = self.cache.lookup(req.seq, rnd.number, j, t)
            self.cache.advance(req.seq, rnd.number + 1)
            wait = reason is LookupReason.LATE and rnd.drafted and rnd.k > 0 and self.cfg.await_late and \
                req.draft is not None and req.draft.alive and self._backup_kind(req) is BackupPolicy.JIT
            if rnd.drafted or reason is LookupReason.FORCED:
                # a round the draft was not asked to speculate for (K = 0 chosen) missed nothing: not counted
                req.stats.count("cache", reason.value)
            if rnd.drafted:   # only a round the draft was asked to speculate for says anything about the drafts
                self.metrics.cache_lookup(reason.value)
                if wait:
                    rnd.awaiting, rnd.await_since, req.phase = (j, t), self.clock(), Phase.AWAIT
                    return
                self.planner.observe_lookup(req, j, reason, len(self.active))
            if rnd.k == 0:
                self.backup(req, BackupPolicy.NONE)
                return
            if reason is LookupReason.HIT:
                self._from_entry(req, entry)
                return
        self.backup(req, self._backup_kind(req))

    def resolve_wait(self, req: Request, entry: wire.CacheEntry | None, failed: BackupPolicy | None = None) -> None:
        """End a sequence's wait for the draft's entries (Phase.AWAIT): `entry` (the one for its outcome; None when
        they held none) runs its round from the cache, else it takes a backup: `failed` where the entries will not
        come (the draft died or erred)."""
        self._end_wait(req, "hit" if entry is not None else "failed" if failed else "no_entry")
        if entry is not None:
            self._from_entry(req, entry)
        else:
            self.backup(req, failed or self._backup_kind(req))

    def _end_wait(self, req: Request, result: str) -> None:
        """Count how a sequence's wait for the draft's entries ended (hit, no_entry or failed) and how long it took,
        and tell the fan-out policy the lookup, late; what the sequence does next is the caller's."""
        rnd = req.round
        (j, _), rnd.awaiting = rnd.awaiting, None
        seconds = max(0.0, self.clock() - rnd.await_since)
        req.stats.count("waits", result)
        self.times.wait_s += seconds
        self.metrics.cache_wait(result, seconds)
        reason = {"hit": LookupReason.HIT, "no_entry": LookupReason.NO_ENTRY}.get(result, LookupReason.LATE)
        self.planner.observe_lookup(req, j, reason, len(self.active), late=True)

    def _from_entry(self, req: Request, entry: wire.CacheEntry) -> None:
        rnd, room = req.round, self.room(req)
        rnd.tokens, rnd.source, req.phase = entry.tokens[:room], "cache", Phase.READY
        rnd.proposal = entry.proposal[:room] if req.params.needs_proposal else None

    def _backup_kind(self, req: Request) -> BackupPolicy:
        return choose_backup(self.policy(req), max(1, len(self.active)), self.timings)

    def policy(self, req: Request) -> BackupPolicy:
        return {"ar": BackupPolicy.NONE, "sd": BackupPolicy.JIT}.get(req.mode, self.backup_policy)

    def backup(self, req: Request, kind: BackupPolicy) -> None:
        room, rnd = self.room(req), req.round
        if kind is BackupPolicy.JIT and (req.draft is None or not req.draft.alive or room == 0):
            kind = BackupPolicy.NGRAM if req.mode != "ar" else BackupPolicy.NONE
        if kind is BackupPolicy.JIT:
            req.phase = Phase.JIT
            self.dispatcher.jit_pending.append(req)
        else:
            tokens = ngram_propose(req.tokens, room) if kind is BackupPolicy.NGRAM and room else []
            kind = BackupPolicy.NGRAM if tokens else BackupPolicy.NONE
            rnd.tokens, req.phase = tokens, Phase.READY
            rnd.proposal = [([x], [1.0]) for x in tokens] if req.params.needs_proposal else None
        rnd.source = kind.value
        req.stats.count("backups", kind.value)
        self.metrics.backup_used(kind.value)

    def delta(self, req: Request) -> list[int]:
        """The committed tokens the sequence's draft has not been sent yet (now counted as sent)."""
        tokens = req.tokens
        out = tokens[req.draft_sent:]
        req.draft_sent = len(tokens)
        return out

    def dispatch(self) -> None:
        """Send what is ready: JITs for the sequences waiting on one, then verify batches (ssd.round.dispatch)."""
        self.dispatcher.dispatch()

    # ---- ending ---------------------------------------------------------------------------------
    def end(self, req: Request, reason: FinishReason) -> None:
        """End a request wherever it is (waiting or running)."""
        if req in self.waiting:
            self.waiting.remove(req)
            self.intake.forget(req)
            self._record_end(req, reason)
            self.emit(req, ("done", reason))
        elif req.seq in self.active:
            self.finish(req, reason)

    def fail(self, req: Request, message: str) -> None:
        self.emit(req, ("error", message))
        self.finish(req, FinishReason.ERROR, notify=False)

    def finish(self, req: Request, reason: FinishReason, notify: bool = True) -> None:
        req.finish = reason
        if self.active.pop(req.seq, None) is None:
            return
        self.intake.forget(req)
        for role in ("target", "draft"):
            worker = getattr(req, role)
            if worker is not None:
                worker.send(wire.Free([req.seq]))
                self.pool.assign(req, role, None)
        if req.seq in self.cache:
            self.cache.end_sequence(req.seq)
        self.features.drop(req.seq)
        self.finished += 1
        self.stats.merge(req.stats)
        self._record_end(req, reason)
        self.metrics.set_active(len(self.active))
        if notify:
            self.emit(req, ("done", reason))

    def _record_end(self, req: Request, reason: FinishReason) -> None:
        ttft = None if req.first_token_at is None else req.first_token_at - req.arrival
        queue = None if req.admitted_at is None else req.admitted_at - req.arrival
        self.metrics.request_finished(req.mode, reason.value, len(req.prompt), len(req.output), ttft,
                                      self.clock() - req.arrival, queue)

    def rebuild_on_target(self, req: Request, problem: str) -> None:
        """What the target holds for the sequence is in doubt: rebuild it there from the committed tokens, or fail
        the request after MAX_TARGET_FAILURES such rebuilds (a failure that repeats)."""
        req.target_failures += 1
        if req.target_failures >= MAX_TARGET_FAILURES:
            self.fail(req, f"target: {problem}")
        else:
            self.send_prefill([req], wire.Prefill if req.phase is Phase.PREFILL else wire.Restore)
