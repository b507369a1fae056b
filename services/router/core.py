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

A draft that reads the target's features (`Ready.feature_size` equal to the targets' hidden size) gets them
with its adds and deltas: Prefill and Verify ask the target for the features of sequences whose draft reads
them, and each sequence keeps only the block its draft has not been sent yet (`services.router.features`).
A draft whose feature size differs is logged and gets none.
"""
from __future__ import annotations

import itertools
from collections import Counter
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from enum import Enum

import zmq

from ssd import wire
from ssd.engine.stats import SpecStats
from ssd.params import FinishReason, SamplingParams, finish_reason, speculation_room
from ssd.spec.adaptive import AdaptiveK, CostTable
from ssd.spec.backup import BackupPolicy, BackupTimings, choose_backup
from ssd.spec.cache import CacheEntry, LookupReason, SpeculationCache
from ssd.spec.check import speculation_problem
from ssd.spec.fanout import FanoutPolicy
from ssd.spec.ngram import ngram_propose
from services.router import features
from services.router.metrics import RouterMetrics
from services.router.peers import Peer

log = logging.getLogger("ssd.router")

MAX_TARGET_FAILURES = 3   # target batches failing as a whole that a sequence survives (rebuilt each time)


class Phase(Enum):
    PREFILL = "prefill"   # waiting for the target's first token
    RESTORE = "restore"   # its target died: another one is rebuilding its KV from the committed tokens
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
    deadline: float | None = None  # the core's clock() after which the request ends with TIME_LIMIT
    arrival: float = 0.0           # the core's clock() at submit
    output: list[int] = field(default_factory=list)
    phase: Phase = Phase.PREFILL
    round: int = 0
    spec: list[int] = field(default_factory=list)
    proposal: list | None = None
    spec_kind: str = ""
    draft_sent: int = 0            # committed tokens the draft knows
    k_now: int = 0                 # draft tokens this round may use (the adaptive policy's K, or the fixed K)
    since_probe: int = 0           # rounds run with speculation off since the last probe round
    since_explore: int = 0         # rounds run at the adaptive choice since one ran at a neighbouring K
    drafted: bool = False          # a DraftRound went out with this round (so a cache miss is informative)
    fanout_sent: list[int] | None = None   # the fan-out that DraftRound asked for (None: the draft's own)
    verify_batch: int = 0          # the verify batch holding this round: only its outcome counts
    jit_batch: int = 0             # the JIT batch that asked for this round's tokens: only its answer counts
    target_failures: int = 0       # target batches that failed as a whole while holding this sequence
    first_token_at: float | None = None
    last_emit_at: float = 0.0
    target: Peer | None = None     # the target this sequence is pinned to
    draft: Peer | None = None      # the draft replica that speculates for it (None: backups only)
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
    adaptive: bool = True          # K per round from measurements (ssd.spec.adaptive); False: always the draft's K
    probe_every: int = 16          # with speculation off, one round in this many speculates to re-measure
    target_wait: float = 30.0      # seconds a sequence waits for a live target before it fails
    verify_inflight: int = 1       # verify batches out to one target at a time (0 = no limit); see _dispatch
    verify_hold: float = 5.0       # a batch out longer than this no longer holds the next one back
    jit_linger: float = 0.05       # at most this long a free target waits for its sequences' JITs to land
    adaptive_fanout: bool = True   # each DraftRound carries a fan-out from ssd.spec.fanout.FanoutPolicy


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
    def __init__(self, cfg: CoreConfig, targets: list[str], drafts: list[str], tokenizer_hash: str, eos_token_ids,
                 metrics: RouterMetrics | None = None, discovery=None, curve=None, clock=time.monotonic):
        if cfg.mode not in ("ar", "sd", "ssd"):
            raise ValueError(f"mode must be ar, sd or ssd, got {cfg.mode!r}")
        if cfg.mode != "ar" and not drafts and discovery is None:
            raise ValueError(f"mode {cfg.mode} needs a draft address")
        if cfg.verify_inflight < 0:
            raise ValueError(f"verify_inflight must be >= 0 (0 = no limit), got {cfg.verify_inflight}")
        if cfg.jit_linger < 0:
            raise ValueError(f"jit_linger must be >= 0 seconds (0 = never wait), got {cfg.jit_linger}")
        drafts = drafts if cfg.mode != "ar" else []
        self.cfg = cfg
        self.clock = clock  # every time the core reads (deadlines, liveness, holds, lingers); tests drive their own
        self.backup = BackupPolicy(cfg.backup)
        self.tokenizer_hash, self.eos = tokenizer_hash, frozenset(eos_token_ids)
        self._ctx = zmq.Context()
        self._curve = curve  # ssd.curve.ClientKeys: the data plane authenticates (None: plain sockets)
        if not targets and discovery is None:
            raise ValueError("at least one target address (or a discovery source) is needed")
        self.discovery = discovery  # ssd.discovery.Discovery: workers that appear and leave at run time
        self._poller = zmq.Poller()
        self.targets = [Peer(self._ctx, t, "target", curve, clock) for t in targets]
        self.drafts = [Peer(self._ctx, d, "draft", curve, clock) for d in drafts]
        self._load: dict[Peer, int] = {p: 0 for p in self.targets + self.drafts}
        self.vocab_size = 0
        self.hidden_size = 0  # the targets' (Ready.feature_size): 2 x this is the byte size of a feature row
        self._features: dict[int, wire.Features] = {}  # seq -> the target's features its draft has not been sent
        self.cache = SpeculationCache()
        self.timings = BackupTimings(k=3)
        self.stats = SpecStats()
        self.metrics = metrics or RouterMetrics()
        self.times = Timings()
        self._sent_at: dict[int, tuple[float, int]] = {}   # verify batch id -> (sent at, positions)
        self._out: dict[Peer, set[int]] = {}              # target -> its verify batches not answered yet
        self._lingering: dict[Peer, float] = {}           # target -> since when it waits for JITs of its sequences
        self._jit_sent: dict[int, float] = {}             # JIT batch id -> sent at
        self._jit_latency = 0.02                          # EMA of a JIT's round trip, seconds (prior 20 ms)
        self.k = 0
        self.max_len = 0
        self.adaptive: dict[str, AdaptiveK] = {}  # per speculating mode, made at handshake (K known)
        self._fanout: dict[Peer, FanoutPolicy] = {}      # per draft replica, made at its first round
        self._fanout_logged: dict[Peer, list[int]] = {}
        self._choice: dict[str, int] = {}
        self._adapt_logged = 0.0
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
        self._orphans: dict[int, tuple] = {}  # seq -> (request, Prefill or Restore, since): no live target yet
        self._drafts_alive = -1               # what ssd_drafts_alive last reported (-1: nothing yet)

    # ---- called from other threads ------------------------------------------------------------
    def submit(self, rid: str, prompt: list[int], params: SamplingParams, mode: str = "", k: int = 0,
               deadline: float | None = None, events=None, replace: bool = False) -> Request:
        """Queues a request. `replace`: a running request with the same id is aborted and this one takes its
        id (a client resuming its own stream on this router)."""
        mode = mode or self.cfg.mode
        if mode not in ("ar", "sd", "ssd"):
            raise ValueError(f"speculation.mode: must be ar, sd or ssd, got {mode!r}")
        if mode != "ar" and not self.drafts and self.discovery is None:
            raise ValueError(f"speculation.mode: {mode} needs a draft, and this router has none")
        if k < 0 or (k and k > self.k):
            raise ValueError(f"speculation.k: must be in 0..{self.k} (the draft's K), got {k}")
        with self._lock:
            old = self._by_rid.get(rid)
            if old is not None and not replace:
                raise ValueError(f"request_id: {rid!r} is already running")
            if old is not None:
                self.abort(old)
            req = Request(rid, next(self._seqs), list(prompt), params, events or queue.Queue(), mode, k, deadline,
                          self.clock())
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
    def target(self) -> Peer | None:
        """A live target (else the first known one): what describes the model."""
        return next((t for t in self.targets if t.alive), self.targets[0] if self.targets else None)

    def _pick(self, peers: list[Peer]) -> Peer | None:
        """The live peer holding the fewest sequences (least-loaded sharding: new replicas fill up first)."""
        live = [p for p in peers if p.alive]
        return min(live, key=lambda p: self._load[p]) if live else None

    def _assign(self, req: Request, role: str, peer: Peer | None) -> None:
        old = getattr(req, role)
        if old is not None:
            self._load[old] -= 1
        if peer is not None:
            self._load[peer] += 1
        setattr(req, role, peer)

    # ---- start-up -------------------------------------------------------------------------------
    def handshake(self) -> None:
        """Wait for every worker's Ready and check that they fit together, or raise StartupError."""
        deadline = self.clock() + self.cfg.ready_timeout
        if self.discovery is not None:
            self.discovery.start()
            self._discover()
        peers = [*self.targets, *self.drafts]
        while not (all(p.alive for p in peers) and any(t.alive for t in self.targets)):
            if self.clock() > deadline:
                missing = ", ".join(f"{p.role} at {p.address}" for p in peers if not p.alive)
                raise StartupError(f"no Ready from {missing} within {self.cfg.ready_timeout:.0f} s: is the "
                                   f"worker running (`ssd target` / `ssd draft`) and its data address right?")
            if self.discovery is not None:
                self._discover()
                peers = [*self.targets, *self.drafts]
            for p in peers:
                p.receive()
                p.tick(self.clock())
            time.sleep(0.02)
        t = self.target.ready
        self.vocab_size, self.hidden_size = t.vocab_size, t.feature_size
        self.k = self.drafts[0].ready.k if self.drafts else 0
        for p in peers:
            problem = self._incompatible(p)
            if problem:
                raise StartupError(problem)
        for d in self.drafts:
            self._check_features(d)
        self.max_len = min(p.ready.max_len for p in peers)
        self.timings = BackupTimings(k=max(1, self.k))
        if self.k and self.cfg.adaptive:
            # One set of measurements serves both modes: the verify cost table here, the draft-step line of the backup
            # timings (both fed once per message).
            self._verify_cost = CostTable()
            self.adaptive = {m: AdaptiveK(self.k, m, self.cfg.probe_every, verify=self._verify_cost,
                                          draft_step=self.timings.draft_step) for m in ("sd", "ssd")}
            self._choice = {m: self.k for m in self.adaptive}
        self._report_drafts_alive()
        log.info("workers ready: targets %s (%s), drafts %s; mode %s, K=%d", [p.address for p in self.targets],
                 t.model_id, [d.address for d in self.drafts], self.cfg.mode, self.k)

    def _discover(self) -> None:
        """Apply what the discovery source saw: connect to new workers, treat removed ones as dead."""
        for change in self.discovery.changes():
            role, address = change.worker.role, change.worker.address
            pool = self.targets if role == "target" else self.drafts
            known = next((p for p in pool if p.address == address), None)
            if change.kind == "added" and known is None and (role == "target" or self.cfg.mode != "ar"):
                peer = Peer(self._ctx, address, role, self._curve, self.clock)
                pool.append(peer)
                self._load[peer] = 0
                self._poller.register(peer.sock, zmq.POLLIN)
                log.info("discovered %s %s", role, address)
            elif change.kind == "removed" and known is not None:
                log.info("%s %s left", role, address)
                known.last_seen = 0.0  # the next liveness pass moves its sequences
                self._liveness()
                pool.remove(known)
                self._fanout.pop(known, None), self._fanout_logged.pop(known, None)
                self._poller.unregister(known.sock)
                known.close()

    def _incompatible(self, p: Peer) -> str | None:
        """Why a worker cannot join (None if it can): tokenizer, vocabulary, K."""
        r = p.ready
        if r.tokenizer_hash != self.tokenizer_hash or r.vocab_size != self.vocab_size:
            what = "a draft must share the target's tokenizer" if p.role == "draft" else \
                "point router and targets at the same model folder"
            return (f"{p.role} at {p.address} ({r.model_id}) has tokenizer {r.tokenizer_hash[:12]} and vocabulary "
                    f"{r.vocab_size}; the router serves {self.tokenizer_hash[:12]} and {self.vocab_size}: {what}")
        if p.role == "draft" and r.k != self.k:
            return f"draft at {p.address} speculates K={r.k}; the pool uses K={self.k}"
        return None

    def _check_features(self, d: Peer) -> None:
        """Log a draft that reads features of another size than the targets' hidden size: it gets none."""
        size = d.ready.feature_size
        if size and size != self.hidden_size:
            log.error("draft at %s (%s) reads features of size %d, but the targets' hidden size is %d: it gets no "
                      "features (worse proposals; output unchanged)", d.address, d.ready.model_id, size,
                      self.hidden_size)

    def _reads_features(self, d: Peer | None) -> bool:
        return d is not None and d.ready is not None and 0 < d.ready.feature_size == self.hidden_size

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        for p in [*self.targets, *self.drafts]:
            self._poller.register(p.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if self.discovery is not None:
                self._discover()
            self._take_new()
            busy = bool(self.active or self.waiting)
            self._poller.poll(1 if busy else 20)
            for t in self.targets:
                for msg in t.receive():
                    self._on_target(t, msg)
            for d in self.drafts:
                for msg in d.receive():
                    self._on_draft(d, msg)
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
        now = self.clock()
        for req in [r for r in (*self.active.values(), *self.waiting) if r.deadline is not None and r.deadline < now]:
            self._end(req, FinishReason.TIME_LIMIT)
        room = self.cfg.max_batch - len(self.active)
        if not any(t.alive for t in self.targets):
            room = 0  # no target to admit to: requests wait (their deadlines still apply)
        admit, self.waiting = self.waiting[:max(0, room)], self.waiting[max(0, room):]
        if not admit:
            return
        self.metrics.set_queue_depth(len(self.waiting))
        self.metrics.set_active(len(self.active) + len(admit))
        for req in admit:
            self.metrics.request_started(req.mode)
            self.active[req.seq] = req
            self._send_prefill(req, wire.Prefill)

    def _send_prefill(self, req: Request, kind) -> None:
        """Prefill (or, after a target failure, Restore) the sequence on the least-loaded live target. With none
        alive, the sequence waits (up to `target_wait` seconds) for one to come back or be discovered."""
        self._assign(req, "target", self._pick(self.targets))
        req.phase = Phase.PREFILL if kind is wire.Prefill else Phase.RESTORE
        if req.target is None:
            self._orphans.setdefault(req.seq, (req, kind, self.clock()))
            return
        self._orphans.pop(req.seq, None)
        s = req.params
        item = wire.PrefillItem(req.seq, req.prompt if kind is wire.Prefill else req.prompt + req.output,
                                wire.SamplingSpec(s.temperature, s.top_k, s.top_p, s.min_p, s.seed))
        req.target.send(wire.Prefill([item], self._wants_features(req)) if kind is wire.Prefill else kind([item]))

    def _on_target(self, peer: Peer, msg) -> None:
        if isinstance(msg, wire.Outcomes):
            self._out.get(peer, set()).discard(msg.batch_id)
            sent = self._sent_at.pop(msg.batch_id, None)
            if sent is None:   # its items match no sequence's verify_batch either: each is ignored below
                log.warning("target %s answered verify batch %d, which is not out (answered before or never sent)",
                            peer.address, msg.batch_id)
            if not msg.items:   # none of its items could run (each got an Error): nothing was verified
                return
            if sent is not None:
                self.timings.observe_verify(len(msg.items), msg.elapsed_s)
                t = self.times
                t.verify_batches += 1
                t.target_verify_s += msg.elapsed_s
                roundtrip = self.clock() - sent[0]
                t.verify_roundtrip_s += roundtrip
                self.metrics.target_verify(msg.elapsed_s, len(msg.items))
                self.metrics.router_hop(max(0.0, roundtrip - msg.elapsed_s))
            blocks = {seq: block for seq, *block in msg.features}
            counts = Counter(out.seq for out in msg.items)
            for out in msg.items:
                req = self.active.get(out.seq)
                if req is None or req.phase is not Phase.VERIFY or req.target is not peer or \
                        req.verify_batch != msg.batch_id:
                    # stale (the sequence finished or was restored since: this target stalled, then came back)
                    log.debug("target %s: outcome for seq %d not awaited from batch %d: ignored", peer.address,
                              out.seq, msg.batch_id)
                    continue
                problem = self._outcome_problem(req, out, counts[out.seq])
                if problem:
                    self._target_sent_bad(peer, req, problem)
                    continue
                self._keep_features(req, blocks.get(out.seq))
                req.round += 1
                new = req.spec[:out.accepted] + [out.token]
                committed = self._commit(req, new)
                req.stats.record_round(len(req.spec), out.accepted, committed)
                self.metrics.round_finished(req.mode, len(req.spec), out.accepted, committed)
                if req.spec_kind in ("jit", "ngram") and req.spec:
                    self.timings.observe_acceptance(BackupPolicy(req.spec_kind), out.accepted, len(req.spec))
                if req.spec_kind in ("cache", "jit") and req.mode in self.adaptive:
                    self.adaptive[req.mode].observe_round(len(req.spec), out.accepted)
                if req.finish is not None:
                    self._finish(req, req.finish)
                else:
                    self._next(req, out.accepted, out.token)
            if self.adaptive and sent is not None:
                # the target's compute: a round trip also holds time queued behind prefills, which K does not change
                self._verify_cost.observe(sent[1], msg.elapsed_s, roundtrip - msg.elapsed_s)
        elif isinstance(msg, wire.Prefilled):
            blocks = {seq: block for seq, *block in msg.features}
            counts = Counter(seq for seq, _ in msg.items)
            for seq, token in msg.items:
                req = self.active.get(seq)
                if req is None or req.phase is not Phase.PREFILL or req.target is not peer:
                    log.debug("target %s: first token for seq %d, which is not waiting for one: ignored",
                              peer.address, seq)
                    continue
                problem = self._token_problem(token) or (f"{counts[seq]} first tokens" if counts[seq] > 1 else None)
                if problem:
                    self._target_sent_bad(peer, req, problem)
                    continue
                self._keep_features(req, blocks.get(seq))
                self.cache.start_sequence(seq, first_round=0)
                self._commit(req, [token])
                if req.finish is not None:
                    self._finish(req, req.finish)
                else:
                    self._add_to_draft(req)
                    self._next(req, 0, token)
        elif isinstance(msg, wire.Restored):
            for seq in msg.seqs:
                req = self.active.get(seq)
                if req is not None and req.phase is Phase.RESTORE and req.target is peer:
                    self._backup(req, choose_backup(self._policy(req), max(1, len(self.active)), self.timings))
        elif isinstance(msg, wire.Error):
            req = self.active.get(msg.seq) if msg.seq is not None else None
            if msg.seq is None and msg.code == "internal":
                self._target_batch_failed(peer, msg)
            elif req is None or req.target is peer:
                self._worker_error("target", msg)

    def _on_draft(self, peer: Peer, msg) -> None:
        if isinstance(msg, wire.CacheEntries):
            self.times.draft_rounds += 1
            self.times.draft_round_s += msg.elapsed_s
            self.metrics.draft_round(msg.elapsed_s)
            req = self.active.get(msg.seq)
            if req is None or req.draft is not peer:
                log.debug("draft %s: cache entries for seq %d, which is not its sequence (now): ignored",
                          peer.address, msg.seq)
                return
            problem = next(filter(None, (self._entry_problem(req, e) for e in msg.entries)), None)
            if problem:   # the sequence misses this round and takes a backup: the target decides every token anyway
                log.warning("draft %s: cache entries for seq %d round %d rejected: %s", peer.address, msg.seq,
                            msg.round, problem)
                return
            entries = {(e.accepted, e.token): CacheEntry(e.tokens, e.proposal) for e in msg.entries}
            self.cache.publish(msg.seq, msg.round, entries)
        elif isinstance(msg, wire.JitResult):
            sent = self._jit_sent.pop(msg.batch_id, None)
            if sent is not None:
                roundtrip = self.clock() - sent
                self._jit_latency = 0.9 * self._jit_latency + 0.1 * roundtrip
                for policy in self.adaptive.values():
                    policy.observe_jit(roundtrip, msg.elapsed_s)
            steps = max((len(tokens) for _, tokens, _ in msg.items), default=0)   # K of this JIT, not the draft's
            if steps:
                self.timings.observe_draft_step(len(msg.items), msg.elapsed_s / steps)
            self.times.jit_batches += 1
            self.times.jit_s += msg.elapsed_s
            self.metrics.jit(msg.elapsed_s)
            counts = Counter(seq for seq, _, _ in msg.items)
            for seq, tokens, proposal in msg.items:
                req = self.active.get(seq)
                if req is None or req.phase is not Phase.JIT or req.draft is not peer or req.jit_batch != msg.batch_id:
                    log.debug("draft %s: JIT tokens for seq %d, which did not ask batch %d for them: ignored",
                              peer.address, seq, msg.batch_id)
                    continue
                room = self._room(req)
                problem = self._speculation_problem(req, tokens, proposal, room) or \
                    (f"{counts[seq]} answers for one sequence" if counts[seq] > 1 else None)
                if problem:
                    log.warning("draft %s: JIT tokens for seq %d rejected (%s): n-gram backup", peer.address, seq,
                                problem)
                    self._backup(req, BackupPolicy.NGRAM)
                    continue
                req.spec = tokens[:room]
                req.proposal = None if req.params.greedy else (proposal or [])[:room]
                req.phase = Phase.READY
        elif isinstance(msg, wire.Error):
            req = self.active.get(msg.seq) if msg.seq is not None else None
            if msg.code == "unknown_sequence" and req is not None and req.finish is None and req.draft is peer:
                self._add_to_draft(req)  # the draft lost it (restart): rebuild from committed tokens
                if req.phase is Phase.JIT:
                    self._backup(req, BackupPolicy.NGRAM)
            elif msg.code == "internal" and msg.seq is None:
                # a whole batch failed on the draft: its state for our sequences is in doubt and a JIT it
                # owed will never come, so rebuild them there and back up the ones waiting
                log.warning("draft error %s: %s: rebuilding its sequences", msg.code, msg.message)
                for req in list(self.active.values()):
                    if req.draft is peer and req.finish is None:
                        self._add_to_draft(req)
                        if req.phase is Phase.JIT:
                            self._backup(req, BackupPolicy.NGRAM)
            else:
                log.warning("draft error %s: %s (seq %s)", msg.code, msg.message, msg.seq)

    def _record_end(self, req: Request, reason: FinishReason) -> None:
        now = self.clock()
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

    def _target_batch_failed(self, peer: Peer, msg) -> None:
        """A target batch failed as a whole (an exception in the target): no answer will come for what it held.
        Every sequence waiting on this target is rebuilt there from its committed tokens (what the target held for
        it may be half-updated), and fails after MAX_TARGET_FAILURES such batches (a failure that repeats)."""
        log.warning("target %s: a batch failed (%s); rebuilding the sequences waiting on it", peer.address,
                    msg.message)
        self._out.pop(peer, None)
        waiting = [r for r in self.active.values()
                   if r.target is peer and r.phase in (Phase.PREFILL, Phase.RESTORE, Phase.VERIFY)]
        for req in waiting:
            self._rebuild_on_target(req, msg.message)

    def _rebuild_on_target(self, req: Request, problem: str) -> None:
        """What the target holds for the sequence is in doubt: rebuild it there from the committed tokens, or fail
        the request after MAX_TARGET_FAILURES such rebuilds (a failure that repeats)."""
        req.target_failures += 1
        if req.target_failures >= MAX_TARGET_FAILURES:
            req.events.put(("error", f"target: {problem}"))
            self._finish(req, FinishReason.ERROR, notify=False)
        else:
            self._send_prefill(req, wire.Prefill if req.phase is Phase.PREFILL else wire.Restore)

    # ---- checking what workers answer -----------------------------------------------------------
    # The codec checks each field's kind; these check what a field must mean for the sequence it names. A reply
    # that fails is logged and never committed or cached: an outcome or first token rebuilds its sequence on
    # the target, a cache entry is not published (a miss), a JIT answer gives way to an n-gram backup.
    def _target_sent_bad(self, peer: Peer, req: Request, problem: str) -> None:
        log.warning("target %s: reply for seq %d rejected (%s): rebuilding the sequence from its committed tokens",
                    peer.address, req.seq, problem)
        self._rebuild_on_target(req, f"invalid reply: {problem}")

    def _token_problem(self, token: int) -> str | None:
        return f"token {token} lies outside the vocabulary [0, {self.vocab_size})" if token >= self.vocab_size else None

    def _outcome_problem(self, req: Request, out: wire.Outcome, copies: int) -> str | None:
        if copies > 1:
            return f"{copies} outcomes for one sequence in one batch"
        if out.accepted > len(req.spec):
            return f"j={out.accepted} accepted of a speculation of {len(req.spec)} tokens"
        return self._token_problem(out.token)

    def _entry_problem(self, req: Request, e: wire.CacheEntry) -> str | None:
        if e.accepted > self.k:
            return f"an entry for outcome j={e.accepted}, more than K={self.k}"
        return self._token_problem(e.token) or self._speculation_problem(req, e.tokens, e.proposal, self.k)

    def _speculation_problem(self, req: Request, tokens: list[int], proposal, k: int) -> str | None:
        """Why draft tokens (a cache entry's or a JIT answer's) cannot be the sequence's next speculation of at
        most `k` tokens: what the target would refuse (failing the request) must not reach it."""
        if len(tokens) > k:
            return f"{len(tokens)} tokens, more than the {k} asked for"
        if not req.params.greedy and proposal is None:   # the target would take it as one-hot: a biased q
            return f"no proposal rows for {len(tokens)} tokens"
        return speculation_problem(tokens, None if req.params.greedy else proposal, self.vocab_size)

    def _worker_error(self, role: str, msg) -> None:
        req = self.active.get(msg.seq) if msg.seq is not None else None
        log.warning("%s error %s: %s (seq %s)", role, msg.code, msg.message, msg.seq)
        if req is not None:
            req.events.put(("error", f"{role}: {msg.message}"))
            self._finish(req, FinishReason.ERROR, notify=False)

    # ---- per-sequence decisions ---------------------------------------------------------------
    def _room(self, req: Request) -> int:
        return speculation_room(req.k_now, req.params, len(req.output), len(req.prompt) + len(req.output),
                                self.max_len)

    def _plan_k(self, req: Request) -> int:
        """Draft tokens for the sequence's next round: the request's own K if it pinned one, else the adaptive
        policy's choice for the current batch (with a probe round now and then while it is 0)."""
        if req.mode == "ar":
            return 0
        if req.k or req.mode not in self.adaptive:
            return req.k or self.k
        k = self._choice.get(req.mode, self.k)
        policy = self.adaptive[req.mode]
        if k == 0:
            req.since_probe += 1
            if policy.probe(req.since_probe):
                req.since_probe = 0
                return self.k
            return 0
        req.since_explore += 1
        other = policy.explore(req.since_explore, k)
        if other is not None:
            req.since_explore = 0
            return other
        return k

    def _commit(self, req: Request, tokens: list[int]) -> int:
        n, now = 0, self.clock()
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
        """(Re)build the sequence on its draft, or on the least-loaded live one if it has none."""
        if req.mode == "ar":
            return
        if req.draft is None or not req.draft.alive:
            self._assign(req, "draft", self._pick(self.drafts))
        d = req.draft
        if d is None:
            return
        p = req.params
        params = (wire.DraftParamsSpec(0.0, 0, 1.0, 0, p.seed) if p.greedy else
                  wire.DraftParamsSpec(p.temperature, self.cfg.draft_top_k, self.cfg.saguaro_c, 1, p.seed))
        tokens = req.prompt + req.output
        d.send(wire.DraftAdd([wire.DraftAddItem(req.seq, tokens, params, self._take_features(req))]))
        req.draft_sent = len(tokens)

    def _wants_features(self, req: Request) -> bool:
        """Whether the target should send the sequence's features: its draft reads them (or, while it has no
        draft, a draft of the pool does)."""
        if req.mode == "ar":
            return False
        return any(self._reads_features(d) for d in ([req.draft] if req.draft is not None else self.drafts))

    def _keep_features(self, req: Request, block: list | None) -> None:
        """Merge a block the target sent for the sequence into its pending block (see `features`)."""
        if block is None or not self._wants_features(req):
            return
        start, data = block
        if len(data) % (2 * self.hidden_size):
            log.warning("target %s sent %d feature bytes for seq %d: not rows of hidden size %d; dropped",
                        req.target.address, len(data), req.seq, self.hidden_size)
            return
        self._features[req.seq] = features.merge(self._features.get(req.seq), start, data, 2 * self.hidden_size)

    def _take_features(self, req: Request) -> wire.Features | None:
        """The sequence's pending features for the message about to go to its draft (None if that draft does not
        read them); either way they are no longer pending."""
        block = self._features.pop(req.seq, None)
        if block is None or not self._reads_features(req.draft):
            return None
        self.metrics.feature_rows(len(block[1]) // (2 * self.hidden_size))
        return block

    def _next(self, req: Request, j: int, t: int) -> None:
        """After an outcome: the next speculation from the cache, or a backup (none when K is 0)."""
        req.k_now = self._plan_k(req)
        if req.mode == "ssd":
            entry, reason = self.cache.lookup(req.seq, req.round, j, t)
            self.cache.advance(req.seq, req.round + 1)
            req.stats.count("cache", reason.value)
            if req.drafted:   # only a round the draft was asked to speculate for says anything about the drafts
                self.metrics.cache_lookup(reason.value)
            if req.drafted and req.mode in self.adaptive:
                self.adaptive[req.mode].observe_lookup(reason is LookupReason.HIT)
            if req.drafted:
                self._observe_fanout(req, j, reason)
            if req.k_now == 0:
                self._backup(req, BackupPolicy.NONE)
                return
            if reason is LookupReason.HIT:
                room = self._room(req)
                req.spec, req.spec_kind, req.phase = list(entry.tokens[:room]), "cache", Phase.READY
                req.proposal = None if req.params.greedy else [(list(i), list(p)) for i, p in entry.proposal[:room]]
                return
        self._backup(req, choose_backup(self._policy(req), max(1, len(self.active)), self.timings))

    def _policy(self, req: Request) -> BackupPolicy:
        return {"ar": BackupPolicy.NONE, "sd": BackupPolicy.JIT}.get(req.mode, self.backup)

    def _backup(self, req: Request, kind: BackupPolicy) -> None:
        room = self._room(req)
        if kind is BackupPolicy.JIT and (req.draft is None or not req.draft.alive or room == 0):
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
            jits: dict[Peer, list] = {}
            for req in self._jit_pending:
                if req.phase is not Phase.JIT:
                    continue
                if req.draft is None or not req.draft.alive:
                    self._backup(req, BackupPolicy.NGRAM)
                    continue
                jits.setdefault(req.draft, []).append(wire.JitItem(req.seq, self._delta(req), self._room(req),
                                                                   self._take_features(req)))
            self._jit_pending = []
            for d, items in jits.items():
                for run in features.runs(items):
                    batch_id = next(self._batches)
                    for it in run:
                        self.active[it.seq].jit_batch = batch_id
                    self._jit_sent[batch_id] = self.clock()
                    if len(self._jit_sent) > 4096:   # answers lost with a draft that died: forget the oldest
                        del self._jit_sent[next(iter(self._jit_sent))]
                    d.send(wire.Jit(batch_id, run))
        ready = [r for r in self.active.values() if r.phase is Phase.READY and not self._target_busy(r.target)]
        if not ready:
            return
        if self.cfg.jit_linger > 0:
            jit_targets = {r.target for r in self.active.values() if r.phase is Phase.JIT}
            waiting = {t for t in {r.target for r in ready} if t in jit_targets and self._linger(t)}
            ready = [r for r in ready if r.target not in waiting]
            if not ready:
                return
        self._adapt()
        verifies: dict[Peer, list] = {}
        rounds: dict[Peer, list] = {}
        for r in ready:
            r.phase = Phase.VERIFY
            verifies.setdefault(r.target, []).append(wire.VerifyItem(r.seq, r.spec, r.proposal))
            r.drafted = r.mode == "ssd" and r.draft is not None and r.draft.alive and \
                (r.k_now > 0 or self._choice.get("ssd", self.k) > 0)
            if r.drafted:
                rounds.setdefault(r.draft, []).append(wire.DraftRoundItem(r.seq, r.round + 1, self._delta(r), r.spec,
                                                                          self._take_features(r)))
        for t, items in verifies.items():
            self._lingering.pop(t, None)
            batch_id = next(self._batches)
            self._sent_at[batch_id] = (self.clock(), sum(len(it.tokens) + 1 for it in items))
            self._out.setdefault(t, set()).add(batch_id)
            for it in items:
                self.active[it.seq].verify_batch = batch_id
            t.send(wire.Verify(batch_id, items, any(self._wants_features(self.active[it.seq]) for it in items)))
        for d, items in rounds.items():
            fanout = self._round_fanout(d)
            for it in items:
                self.active[it.seq].fanout_sent = fanout or None
            for run in features.runs(items):
                d.send(wire.DraftRound(run, fanout))

    def _fanout_policy(self, draft: Peer) -> FanoutPolicy | None:
        if not (self.cfg.adaptive_fanout and self.k and draft.ready is not None and draft.ready.fanout):
            return None
        policy = self._fanout.get(draft)
        if policy is None:
            policy = self._fanout[draft] = FanoutPolicy(self.k, sum(draft.ready.fanout))
        return policy

    def _round_fanout(self, draft: Peer) -> list[int]:
        """The fan-out this round's DraftRound carries to `draft` (empty: its own): the split by the measured
        acceptance (the ssd policy's first position), the total by the draft's lateness."""
        policy = self._fanout_policy(draft)
        if policy is None:
            return []
        # the first position's acceptance: every speculating round measures it (later positions only at K >= 2)
        fanout = policy.fanout(self.adaptive["ssd"].acceptance[0] if "ssd" in self.adaptive else 0.6)
        if fanout != self._fanout_logged.get(draft):
            self._fanout_logged[draft] = fanout
            log.debug("fan-out for draft %s: %s (budget %d of %d, r %.2f)", draft.address, fanout, policy.budget,
                      policy.max_budget, policy.exponent())
        return fanout

    def _observe_fanout(self, req: Request, j: int, reason: LookupReason) -> None:
        """A drafted round's lookup, for its draft's fan-out policy: late or not; and for an outcome its draft had
        candidates for (hit or no entry), how many it had."""
        policy = self._fanout.get(req.draft) if req.draft is not None else None
        if policy is None or reason in (LookupReason.STALE, LookupReason.FORCED):
            return
        policy.observe_late(reason is LookupReason.LATE)
        if reason in (LookupReason.HIT, LookupReason.NO_ENTRY) and req.fanout_sent:
            fan = req.fanout_sent[:len(req.spec)] + [req.fanout_sent[-1]]
            if j < len(fan) and fan[j] > 0:
                policy.observe_lookup(fan[j], reason is LookupReason.HIT)

    def _target_busy(self, target: Peer | None) -> bool:
        """Whether `target` already has `verify_inflight` verify batches out. Sequences that become ready meanwhile
        wait here instead of queueing at the target as batches of their own: the target runs one forward at a
        time, so they would wait as long either way, and sent together when its answer arrives they join the
        answered sequences in one forward. Without this, sequences that fall out of step (a prefill, a cache miss)
        stay in separate cohorts for good, each a forward of its own, every round. A batch out longer than
        `verify_hold` seconds stops counting (a lost answer must not stall its target)."""
        limit = self.cfg.verify_inflight
        out = self._out.get(target) if target is not None else None
        if not limit or not out:
            return False
        now = self.clock()
        for batch_id in [b for b in out if now - self._sent_at.get(b, (now,))[0] > self.cfg.verify_hold]:
            out.discard(batch_id)
            log.debug("verify batch %d to %s unanswered for over %.1f s: no longer holding sequences back", batch_id,
                      target.address, self.cfg.verify_hold)
        return len(out) >= limit

    def _linger(self, target: Peer) -> bool:
        """Whether free `target` should wait before verifying what is ready, because some of its sequences wait
        for a JIT: sent now, those would go in a batch of their own once it lands, and the two groups would stay
        apart (each a forward every round: the sequences a verify answers need a JIT before they are ready again,
        the others are ready first). Waiting about one JIT round trip (measured; at most `jit_linger`) lets them
        go together."""
        now = self.clock()
        since = self._lingering.setdefault(target, now)
        return now - since < min(self.cfg.jit_linger, 1.5 * self._jit_latency)

    def _adapt(self) -> None:
        """The adaptive policy's K per mode for the current batch size (logged and exported when it changes)."""
        batch = len(self.active)
        for mode, a in self.adaptive.items():
            k = a.choose(batch, self._choice.get(mode))
            if k != self._choice.get(mode):
                now = self.clock()
                level = logging.INFO if now - self._adapt_logged > 10.0 else logging.DEBUG  # at most one line in 10 s
                self._adapt_logged = now if level == logging.INFO else self._adapt_logged
                log.log(level, "adaptive speculation (%s, batch %d): K %s -> %d %s", mode, batch,
                        self._choice.get(mode), k, a.summary(batch))
                self._choice[mode] = k
                self.metrics.set_speculation_k(mode, k)

    def _delta(self, req: Request) -> list[int]:
        tokens = req.prompt + req.output
        delta = tokens[req.draft_sent:]
        req.draft_sent = len(tokens)
        return delta

    def _liveness(self) -> None:
        now = self.clock()
        for t in self.targets:
            change = t.tick(now)
            if change is not None:
                self._out.pop(t, None)   # whatever it had out will not be answered (died) or was lost (came back)
            if change == "ready" and self.vocab_size and self._incompatible(t):
                log.error("refusing %s", self._incompatible(t))
                t.alive = False
            elif change == "died":
                moved = [r for r in self.active.values() if r.target is t]
                log.warning("target %s died: moving %d sequences to other targets", t.address, len(moved))
                for req in moved:  # re-prefill elsewhere from the committed tokens; greedy output is unchanged
                    self._assign(req, "target", None)
                    self._send_prefill(req, wire.Prefill if req.phase is Phase.PREFILL else wire.Restore)
        if self._orphans:
            for seq, (req, kind, since) in list(self._orphans.items()):
                if req.finish is not None or seq not in self.active:
                    del self._orphans[seq]
                elif any(t.alive for t in self.targets):
                    self._send_prefill(req, kind)
                elif now - since > self.cfg.target_wait:
                    del self._orphans[seq]
                    req.events.put(("error", f"no target is alive (waited {self.cfg.target_wait:.0f} s)"))
                    self._finish(req, FinishReason.ERROR, notify=False)
        for d in self.drafts:
            change = d.tick(now)
            if change == "ready" and self._incompatible(d):
                log.error("refusing %s", self._incompatible(d))
                d.alive = False
            elif change == "died":
                moved = [r for r in self.active.values() if r.draft is d]
                for req in moved:  # survivors rebuild draft KV from committed tokens; backups meanwhile
                    self._assign(req, "draft", None)
                    if req.phase is Phase.JIT:
                        self._backup(req, BackupPolicy.NGRAM)
                    if req.phase is not Phase.PREFILL:
                        self._add_to_draft(req)
            elif change == "ready":
                self._check_features(d)
                orphans = [r for r in self.active.values() if r.draft is None and r.phase is not Phase.PREFILL]
                log.info("draft %s is ready: it takes new sequences and %d without a draft", d.address, len(orphans))
                for req in orphans:
                    self._add_to_draft(req)
        self._report_drafts_alive()

    def _report_drafts_alive(self) -> None:
        """ssd_drafts_alive from the handshake on, set again whenever the count changes."""
        n = sum(p.alive for p in self.drafts)
        if n != self._drafts_alive:
            self._drafts_alive = n
            self.metrics.set_drafts_alive(n)

    def _finish(self, req: Request, reason: FinishReason, notify: bool = True) -> None:
        req.finish = reason
        if self.active.pop(req.seq, None) is None:
            return
        self._forget(req)
        for role in ("target", "draft"):
            peer = getattr(req, role)
            if peer is not None:
                peer.send(wire.Free([req.seq]))
                self._assign(req, role, None)
        if req.seq in self.cache:
            self.cache.end_sequence(req.seq)
        self._features.pop(req.seq, None)
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
        for p in [*self.targets, *self.drafts]:
            p.close()
        self._ctx.term()
