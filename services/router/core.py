"""The router's engine loop: admission, rounds, the speculation cache, backups. No torch, no model.

One thread owns the ZeroMQ sockets and all sequence state; gRPC handler threads meet it only at queues
(`submit`/`abort` in, per-request event queues out). Per sequence, a round is:

  speculation ready -> Verify to the target and, in ssd mode, DraftRound to the draft (at the same time)
  -> Outcomes (j, t*) -> commit and stream the tokens -> look (seq, round, j, t*) up in the cache
  -> hit: the next speculation is ready at once; miss: a backup (jit asks the draft, ngram and none are
     immediate) -> ...

Sequences advance independently: a verify batch holds whichever sequences are ready, so one miss never stalls
the others. If the draft dies, its sequences continue on n-gram/none backups; when it is back, they are
re-added from their committed tokens. Output never depends on any of this: the target decides every token.
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from enum import Enum

import zmq

from ssd import wire
from ssd.engine.stats import SpecStats
from ssd.params import FinishReason, SamplingParams, finish_reason
from ssd.spec.backup import BackupPolicy, BackupTimings, choose_backup
from ssd.spec.cache import CacheEntry, LookupReason, SpeculationCache
from ssd.spec.ngram import ngram_propose
from services.router.metrics import RouterMetrics
from services.router.peers import Peer

log = logging.getLogger("ssd.router")


class Phase(Enum):
    PREFILL = "prefill"   # waiting for the target's first token
    JIT = "jit"           # waiting for a JIT backup from the draft
    READY = "ready"       # speculation ready, verify not sent yet
    VERIFY = "verify"     # waiting for the target's outcome


class StartupError(RuntimeError):
    """The router cannot serve with the workers it was given; the message says why and what to do."""


@dataclass(slots=True, eq=False)
class Request:
    rid: str
    seq: int
    prompt: list[int]
    params: SamplingParams
    events: object                 # anything with put(event): a queue.Queue, or an asyncio bridge
    mode: str = "ssd"
    k: int = 0                     # per-request K (0: the draft's)
    deadline: float | None = None  # time.monotonic() after which the request ends with TIME_LIMIT
    arrival: float = field(default_factory=time.monotonic)
    output: list[int] = field(default_factory=list)
    phase: Phase = Phase.PREFILL
    round: int = 0
    spec: list[int] = field(default_factory=list)
    proposal: list | None = None
    spec_kind: str = ""
    draft_sent: int = 0            # committed tokens the draft knows
    first_token_at: float | None = None
    last_emit_at: float = 0.0
    stats: SpecStats = field(default_factory=SpecStats)
    finish: FinishReason | None = None


@dataclass(slots=True)
class CoreConfig:
    mode: str = "ssd"              # ar | sd | ssd
    backup: str = "jit"            # jit | ngram | none | auto (ssd misses)
    max_batch: int = 16            # sequences generating at once
    draft_top_k: int = 32          # sampling: the draft's proposal support size
    saguaro_c: float = 1.0
    ready_timeout: float = 180.0


@dataclass(slots=True)
class Timings:
    """Cumulative round-time split: target compute, round trip as the router sees it, draft compute."""
    verify_batches: int = 0
    target_verify_s: float = 0.0
    verify_roundtrip_s: float = 0.0
    draft_rounds: int = 0
    draft_round_s: float = 0.0
    jit_batches: int = 0
    jit_s: float = 0.0


class RouterCore:
    def __init__(self, cfg: CoreConfig, target: str, drafts: list[str], tokenizer_hash: str, eos_token_ids,
                 metrics: RouterMetrics | None = None):
        if cfg.mode not in ("ar", "sd", "ssd"):
            raise ValueError(f"mode must be ar, sd or ssd, got {cfg.mode!r}")
        if cfg.mode != "ar" and not drafts:
            raise ValueError(f"mode {cfg.mode} needs a draft address")
        drafts = drafts if cfg.mode != "ar" else []
        self.cfg = cfg
        self.backup = BackupPolicy(cfg.backup)
        self.tokenizer_hash, self.eos = tokenizer_hash, frozenset(eos_token_ids)
        self._ctx = zmq.Context()
        self.target = Peer(self._ctx, target, "target")
        self.drafts = [Peer(self._ctx, d, "draft") for d in drafts]
        self.cache = SpeculationCache()
        self.timings = BackupTimings(k=3)
        self.stats = SpecStats()
        self.metrics = metrics or RouterMetrics()
        self.times = Timings()
        self._sent_at: dict[int, float] = {}
        self.k = 0
        self.max_len = 0
        self._incoming: queue.Queue = queue.Queue()
        self._aborts: queue.Queue = queue.Queue()
        self.waiting: list[Request] = []
        self.active: dict[int, Request] = {}
        self.finished = 0
        self._seqs = itertools.count(1)
        self._batches = itertools.count(1)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._by_rid: dict[str, Request] = {}
        self._jit_pending: list[Request] = []

    # ---- called from other threads ------------------------------------------------------------
    def submit(self, rid: str, prompt: list[int], params: SamplingParams, mode: str = "", k: int = 0,
               deadline: float | None = None, events=None) -> Request:
        mode = mode or self.cfg.mode
        if mode not in ("ar", "sd", "ssd"):
            raise ValueError(f"speculation.mode: must be ar, sd or ssd, got {mode!r}")
        if mode != "ar" and not self.drafts:
            raise ValueError(f"speculation.mode: {mode} needs a draft, and this router has none")
        if k < 0 or (k and k > self.k):
            raise ValueError(f"speculation.k: must be in 0..{self.k} (the draft's K), got {k}")
        with self._lock:
            if rid in self._by_rid:
                raise ValueError(f"request_id: {rid!r} is already running")
            req = Request(rid, next(self._seqs), list(prompt), params, events or queue.Queue(), mode, k, deadline)
            self._by_rid[rid] = req
        self._incoming.put(req)
        return req

    def abort(self, req: Request, reason: FinishReason = FinishReason.ABORT) -> None:
        self._aborts.put((req, reason))

    def abort_id(self, rid: str) -> bool:
        with self._lock:
            req = self._by_rid.get(rid)
        if req is not None:
            self.abort(req)
        return req is not None

    def stop(self) -> None:
        self._stop.set()

    @property
    def draft(self) -> Peer | None:
        return self.drafts[0] if self.drafts and self.drafts[0].alive else None

    # ---- start-up -------------------------------------------------------------------------------
    def handshake(self) -> None:
        """Wait for every worker's Ready and check that they fit together, or raise StartupError."""
        deadline = time.monotonic() + self.cfg.ready_timeout
        peers = [self.target, *self.drafts]
        while not all(p.alive for p in peers):
            if time.monotonic() > deadline:
                missing = ", ".join(f"{p.role} at {p.address}" for p in peers if not p.alive)
                raise StartupError(f"no Ready from {missing} within {self.cfg.ready_timeout:.0f} s: is the "
                                   f"worker running (`ssd target` / `ssd draft`) and its data address right?")
            for p in peers:
                p.receive()
                p.tick(time.monotonic())
            time.sleep(0.02)
        t = self.target.ready
        if t.tokenizer_hash != self.tokenizer_hash:
            raise StartupError(f"target at {self.target.address} uses tokenizer {t.tokenizer_hash[:12]}, but the "
                               f"router loaded {self.tokenizer_hash[:12]}: point both at the same model folder")
        for d in self.drafts:
            r = d.ready
            if r.tokenizer_hash != t.tokenizer_hash or r.vocab_size != t.vocab_size:
                raise StartupError(
                    f"draft at {d.address} ({r.model_id}) has tokenizer {r.tokenizer_hash[:12]} and vocabulary "
                    f"{r.vocab_size}; the target ({t.model_id}) has {t.tokenizer_hash[:12]} and {t.vocab_size}: "
                    f"a draft must share the target's tokenizer")
        self.max_len = min([t.max_len] + [d.ready.max_len for d in self.drafts])
        self.k = self.drafts[0].ready.k if self.drafts else 0
        self.timings = BackupTimings(k=max(1, self.k))
        log.info("workers ready: target %s (%s), drafts %s; mode %s, K=%d", self.target.address, t.model_id,
                 [d.address for d in self.drafts], self.cfg.mode, self.k)

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        poller = zmq.Poller()
        for p in [self.target, *self.drafts]:
            poller.register(p.sock, zmq.POLLIN)
        while not self._stop.is_set():
            self._take_new()
            busy = bool(self.active or self.waiting)
            poller.poll(1 if busy else 20)
            for msg in self.target.receive():
                self._on_target(msg)
            for d in self.drafts:
                for msg in d.receive():
                    self._on_draft(msg)
            self._liveness()
            self._dispatch()
        self._shutdown()

    def _take_new(self) -> None:
        while True:
            try:
                self.waiting.append(self._incoming.get_nowait())
            except queue.Empty:
                break
        while True:
            try:
                req, reason = self._aborts.get_nowait()
            except queue.Empty:
                break
            self._end(req, reason)
        now = time.monotonic()
        for req in [r for r in (*self.active.values(), *self.waiting) if r.deadline is not None and r.deadline < now]:
            self._end(req, FinishReason.TIME_LIMIT)
        room = self.cfg.max_batch - len(self.active)
        admit, self.waiting = self.waiting[:max(0, room)], self.waiting[max(0, room):]
        if not admit:
            return
        items = []
        self.metrics.set_queue_depth(len(self.waiting))
        self.metrics.set_active(len(self.active) + len(admit))
        for req in admit:
            self.metrics.request_started(req.mode)
            self.active[req.seq] = req
            s = req.params
            items.append(wire.PrefillItem(req.seq, req.prompt, wire.SamplingSpec(s.temperature, s.top_k, s.top_p,
                                                                                   s.min_p, s.seed)))
        self.target.send(wire.Prefill(items))

    def _on_target(self, msg) -> None:
        if isinstance(msg, wire.Outcomes):
            self.timings.observe_verify(len(msg.items), msg.elapsed_s)
            t = self.times
            t.verify_batches += 1
            t.target_verify_s += msg.elapsed_s
            roundtrip = time.monotonic() - self._sent_at.pop(msg.batch_id, time.monotonic())
            t.verify_roundtrip_s += roundtrip
            self.metrics.target_verify(msg.elapsed_s, len(msg.items))
            self.metrics.router_hop(max(0.0, roundtrip - msg.elapsed_s))
            for out in msg.items:
                req = self.active.get(out.seq)
                if req is None or req.phase is not Phase.VERIFY:
                    continue
                req.round += 1
                new = req.spec[:out.accepted] + [out.token]
                committed = self._commit(req, new)
                req.stats.record_round(len(req.spec), out.accepted, committed)
                self.metrics.round_finished(req.mode, len(req.spec), out.accepted, committed)
                if req.spec_kind in ("jit", "ngram") and req.spec:
                    self.timings.observe_acceptance(BackupPolicy(req.spec_kind), out.accepted, len(req.spec))
                if req.finish is not None:
                    self._finish(req, req.finish)
                else:
                    self._next(req, out.accepted, out.token)
        elif isinstance(msg, wire.Prefilled):
            for seq, token in msg.items:
                req = self.active.get(seq)
                if req is None or req.phase is not Phase.PREFILL:
                    continue
                self.cache.start_sequence(seq, first_round=0)
                self._commit(req, [token])
                if req.finish is not None:
                    self._finish(req, req.finish)
                else:
                    self._add_to_draft(req)
                    self._next(req, 0, token)
        elif isinstance(msg, wire.Error):
            self._worker_error("target", msg)

    def _on_draft(self, msg) -> None:
        if isinstance(msg, wire.CacheEntries):
            self.times.draft_rounds += 1
            self.times.draft_round_s += msg.elapsed_s
            self.metrics.draft_round(msg.elapsed_s)
            if msg.seq in self.active:
                entries = {(e.accepted, e.token): CacheEntry(e.tokens, e.proposal) for e in msg.entries}
                self.cache.publish(msg.seq, msg.round, entries)
        elif isinstance(msg, wire.JitResult):
            self.timings.observe_draft_step(len(msg.items), msg.elapsed_s / max(1, self.k))
            self.times.jit_batches += 1
            self.times.jit_s += msg.elapsed_s
            self.metrics.jit(msg.elapsed_s)
            for seq, tokens, proposal in msg.items:
                req = self.active.get(seq)
                if req is None or req.phase is not Phase.JIT:
                    continue
                room = self._room(req)
                req.spec = tokens[:room]
                req.proposal = None if req.params.greedy else (proposal or [])[:room]
                req.phase = Phase.READY
        elif isinstance(msg, wire.Error):
            req = self.active.get(msg.seq) if msg.seq is not None else None
            if msg.code == "unknown_sequence" and req is not None and req.finish is None:
                self._add_to_draft(req)  # the draft lost it (restart): rebuild from committed tokens
                if req.phase is Phase.JIT:
                    self._backup(req, BackupPolicy.NGRAM)
            else:
                log.warning("draft error %s: %s (seq %s)", msg.code, msg.message, msg.seq)

    def _record_end(self, req: Request, reason: FinishReason) -> None:
        now = time.monotonic()
        ttft = None if req.first_token_at is None else req.first_token_at - req.arrival
        self.metrics.request_finished(req.mode, reason.value, len(req.prompt), len(req.output), ttft, now - req.arrival)

    def _end(self, req: Request, reason: FinishReason) -> None:
        if req in self.waiting:
            self.waiting.remove(req)
            self._forget(req)
            self._record_end(req, reason)
            self._emit_done(req, reason)
        elif req.seq in self.active:
            self._finish(req, reason)

    def _forget(self, req: Request) -> None:
        with self._lock:
            if self._by_rid.get(req.rid) is req:
                del self._by_rid[req.rid]

    def _worker_error(self, role: str, msg) -> None:
        req = self.active.get(msg.seq) if msg.seq is not None else None
        log.warning("%s error %s: %s (seq %s)", role, msg.code, msg.message, msg.seq)
        if req is not None:
            req.events.put(("error", f"{role}: {msg.message}"))
            self._finish(req, FinishReason.ERROR, notify=False)

    # ---- per-sequence decisions ---------------------------------------------------------------
    def _room(self, req: Request) -> int:
        n = len(req.prompt) + len(req.output)
        return max(0, min(req.k or self.k, self.max_len - n - 1, req.params.max_tokens - len(req.output) - 1))

    def _commit(self, req: Request, tokens: list[int]) -> int:
        n, now = 0, time.monotonic()
        for t in tokens:
            req.output.append(t)
            n += 1
            req.finish = finish_reason(t, req.params, self.eos, len(req.output), len(req.prompt) + len(req.output),
                                       self.max_len)
            if req.finish is not None:
                break
        if req.first_token_at is None:
            req.first_token_at = now
        else:
            self.metrics.tokens_emitted(n, now - req.last_emit_at)
        req.last_emit_at = now
        req.events.put(("tokens", req.output[-n:]))
        return n

    def _add_to_draft(self, req: Request) -> None:
        d = self.draft
        if d is None or req.mode == "ar":
            return
        p = req.params
        params = (wire.DraftParamsSpec(0.0, 0, 1.0, 0, p.seed) if p.greedy else
                  wire.DraftParamsSpec(p.temperature, self.cfg.draft_top_k, self.cfg.saguaro_c, 1, p.seed))
        tokens = req.prompt + req.output
        d.send(wire.DraftAdd([wire.DraftAddItem(req.seq, tokens, params)]))
        req.draft_sent = len(tokens)

    def _next(self, req: Request, j: int, t: int) -> None:
        """After an outcome: the next speculation from the cache, or a backup."""
        if req.mode == "ssd":
            entry, reason = self.cache.lookup(req.seq, req.round, j, t)
            self.cache.advance(req.seq, req.round + 1)
            req.stats.count("cache", reason.value)
            self.metrics.cache_lookup(reason.value)
            if reason is LookupReason.HIT:
                room = self._room(req)
                req.spec, req.spec_kind, req.phase = list(entry.tokens[:room]), "cache", Phase.READY
                req.proposal = None if req.params.greedy else [(list(i), list(p)) for i, p in entry.proposal[:room]]
                return
        policy = {"ar": BackupPolicy.NONE, "sd": BackupPolicy.JIT}.get(req.mode, self.backup)
        self._backup(req, choose_backup(policy, max(1, len(self.active)), self.timings))

    def _backup(self, req: Request, kind: BackupPolicy) -> None:
        room = self._room(req)
        if kind is BackupPolicy.JIT and (self.draft is None or room == 0):
            kind = BackupPolicy.NGRAM if req.mode != "ar" else BackupPolicy.NONE
        if kind is BackupPolicy.JIT:
            req.phase = Phase.JIT
            self._jit_pending.append(req)
        else:
            tokens = ngram_propose(req.prompt + req.output, room) if kind is BackupPolicy.NGRAM and room else []
            kind = BackupPolicy.NGRAM if tokens else BackupPolicy.NONE
            req.spec, req.phase = tokens, Phase.READY
            req.proposal = None if req.params.greedy else [([x], [1.0]) for x in tokens]
        req.spec_kind = kind.value
        req.stats.count("backups", kind.value)
        self.metrics.backup_used(kind.value)

    def _dispatch(self) -> None:
        if self._jit_pending:
            d, items = self.draft, []
            for req in self._jit_pending:
                if req.phase is not Phase.JIT:
                    continue
                if d is None:
                    self._backup(req, BackupPolicy.NGRAM)
                    continue
                items.append(wire.JitItem(req.seq, self._delta(req), self._room(req)))
            self._jit_pending = []
            if items:
                d.send(wire.Jit(next(self._batches), items))
        ready = [r for r in self.active.values() if r.phase is Phase.READY]
        if not ready:
            return
        batch_id = next(self._batches)
        self._sent_at[batch_id] = time.monotonic()
        self.target.send(wire.Verify(batch_id, [wire.VerifyItem(r.seq, r.spec, r.proposal) for r in ready]))
        d = self.draft
        rounds = []
        for r in ready:
            r.phase = Phase.VERIFY
            if r.mode == "ssd" and d is not None:
                rounds.append(wire.DraftRoundItem(r.seq, r.round + 1, self._delta(r), r.spec))
        if rounds:
            d.send(wire.DraftRound(rounds))

    def _delta(self, req: Request) -> list[int]:
        tokens = req.prompt + req.output
        delta = tokens[req.draft_sent:]
        req.draft_sent = len(tokens)
        return delta

    def _liveness(self) -> None:
        now = time.monotonic()
        if self.target.tick(now) == "died":
            for req in list(self.active.values()):
                req.events.put(("error", f"target at {self.target.address} stopped answering"))
                self._finish(req, FinishReason.ERROR, notify=False)
        for d in self.drafts:
            change = d.tick(now)
            if change is not None:
                self.metrics.set_drafts_alive(sum(p.alive for p in self.drafts))
            if change == "died":
                for req in list(self.active.values()):
                    if req.phase is Phase.JIT:
                        self._backup(req, BackupPolicy.NGRAM)
            elif change == "ready":
                log.info("draft %s is back: re-adding %d sequences", d.address, len(self.active))
                for req in self.active.values():
                    if req.finish is None and req.phase is not Phase.PREFILL:
                        self._add_to_draft(req)

    def _finish(self, req: Request, reason: FinishReason, notify: bool = True) -> None:
        req.finish = reason
        if self.active.pop(req.seq, None) is None:
            return
        self._forget(req)
        self.target.send(wire.Free([req.seq]))
        if self.draft is not None:
            self.draft.send(wire.Free([req.seq]))
        if req.seq in self.cache:
            self.cache.end_sequence(req.seq)
        self.finished += 1
        self.stats.merge(req.stats)
        self._record_end(req, reason)
        self.metrics.set_active(len(self.active))
        if notify:
            self._emit_done(req, reason)

    @staticmethod
    def _emit_done(req: Request, reason: FinishReason) -> None:
        req.events.put(("done", reason))

    def _shutdown(self) -> None:
        for req in list(self.active.values()) + self.waiting:
            req.events.put(("error", "the router is shutting down"))
        for p in [self.target, *self.drafts]:
            p.close()
        self._ctx.term()
