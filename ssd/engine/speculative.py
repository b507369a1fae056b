"""In-process speculative engines: SD (draft K tokens, then verify) and SSD (the speculation cache).

Both run the router's logic over a `TargetWorker` and a `DraftWorker` in one process. One `step` is one
round for every running sequence:

  SD:  draft K tokens now (JIT) -> verify -> commit.
  SSD: take each sequence's next speculation from the cache (hit) or a backup (miss: jit / ngram / none,
       chosen per sequence) -> the draft speculates on it for every likely outcome and publishes to the cache
       (in the services this runs while the target verifies) -> verify -> commit -> look the outcome up.

A feature-reading draft gets the target's features with every commit (prefill's with `add`).

Rounds: prefill is round 0 and its outcome (0, t0) is a forced miss; verification r >= 1 is round r and its
outcome (j, t*) is looked up under (seq, r, j, t*) for the speculation of round r+1. Outputs are exactly the
target's: greedy outputs equal the AR engine's token for token, sampled outputs follow its distribution.
"""
from __future__ import annotations

from dataclasses import dataclass

from ssd.engine.draft import DraftWorker, Speculation, draft_params_for
from ssd.engine.base import Engine
from ssd.engine.sequence import Sequence
from ssd.engine.stats import SpecStats
from ssd.engine.target import TargetWorker, VerifyItem
from ssd.models.decoder import Decoder
from ssd.models.kv_cache import DEFAULT_BLOCK_SIZE
from ssd.params import speculation_room
from ssd.sampling import SamplingParams
from ssd.spec.backup import BackupPolicy, BackupTimings, choose_backup
from ssd.spec.cache import LookupReason, SpeculationCache
from ssd.spec.fanout import uniform_fanout
from ssd.spec.ngram import ngram_propose


@dataclass(slots=True)
class SpecConfig:
    mode: str = "ssd"                 # "sd" or "ssd"
    k: int = 3                        # drafted tokens per round
    fanout: tuple[int, ...] | None = None  # F_0..F_K; default: uniform over `budget`
    budget: int | None = None         # total forks per sequence and round; default 2 (K + 1)
    backup: BackupPolicy = BackupPolicy.JIT
    draft_top_k: int = 32             # sampling: the draft's q is truncated to its top-k (sparse on the wire)
    saguaro_c: float = 1.0

    def __post_init__(self):
        if self.mode not in ("sd", "ssd"):
            raise ValueError(f"mode must be 'sd' or 'ssd', got {self.mode!r}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        self.backup = BackupPolicy(self.backup)
        if self.fanout is None:
            self.fanout = tuple(uniform_fanout(self.k, self.budget or 2 * (self.k + 1)))
        self.fanout = tuple(self.fanout)
        if len(self.fanout) != self.k + 1:
            raise ValueError(f"fanout needs K+1 = {self.k + 1} entries, got {self.fanout}")


@dataclass(slots=True)
class _Round:
    spec: Speculation | None = None   # the speculation to verify next (None: a backup is needed)
    round: int = 0
    kind: str = "cache"               # where `spec` came from: cache, jit, ngram, none


class SpeculativeEngine(Engine):
    def __init__(self, target: Decoder, draft: Decoder, spec: SpecConfig | None = None, max_batch: int = 8,
                 max_len: int | None = None, eos_token_ids: tuple[int, ...] | None = None, kv_tokens: int = 0,
                 block_size: int = DEFAULT_BLOCK_SIZE, prefix_caching: bool = True, cuda_graphs: str = "auto"):
        super().__init__()
        self.spec = spec or SpecConfig()
        cfg = target.cfg
        if draft.cfg.vocab_size != cfg.vocab_size:
            raise ValueError(f"draft vocabulary ({draft.cfg.vocab_size}) differs from the target's ({cfg.vocab_size})")
        self.max_len = min(max_len or 2048, cfg.max_position_embeddings, draft.cfg.max_position_embeddings)
        self.eos_token_ids = frozenset(cfg.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.vocab_size = cfg.vocab_size
        self.target = TargetWorker(target, max_batch, self.max_len, kv_tokens, block_size, prefix_caching,
                                   cuda_graphs)
        self.draft = DraftWorker(draft, max_batch, self.max_len, self.spec.k, list(self.spec.fanout), kv_tokens,
                                 block_size, prefix_caching, cuda_graphs)
        self.cache = SpeculationCache()
        self.timings = BackupTimings(k=self.spec.k)
        self.stats = SpecStats()
        self._rounds: dict[int, _Round] = {}

    def add_request(self, prompt: list[int], params: SamplingParams | None = None) -> Sequence:
        seq = super().add_request(prompt, params)
        seq.stats = SpecStats()
        return seq

    def step(self) -> list[Sequence]:
        admitted = self._admit()
        batch = [s for s in self.running if s not in admitted]
        if not batch:
            return admitted
        self._fill_backups(batch)
        items = [VerifyItem(s.seq_id, self._rounds[s.seq_id].spec.tokens, self._rounds[s.seq_id].spec.proposal)
                 for s in batch]
        outcomes = self._speculate_and_verify(batch, items)
        self.timings.observe_verify(len(batch), self.target.last_verify_s)
        for s, it, out in zip(batch, items, outcomes):
            st = self._rounds[s.seq_id]
            st.round += 1
            new = it.tokens[:out.accepted] + [out.token]
            s.stats.record_round(len(it.tokens), out.accepted, self._commit(s, new))
            if st.kind in ("jit", "ngram") and it.tokens:
                self.timings.observe_acceptance(BackupPolicy(st.kind), out.accepted, len(it.tokens))
            if s.finished:
                self._finish(s)
                continue
            self.draft.commit(s.seq_id, new, self.target.last_features.get(s.seq_id))
            self._next_from_cache(s, st, out.accepted, out.token)
        return admitted + batch

    def _speculate_and_verify(self, batch: list[Sequence], items: list[VerifyItem]) -> list:
        """The round's two halves: ssd speculation for the next round (published to the cache), then the verify.
        In process they run one after the other; an engine with a remote draft overlaps them."""
        if self.spec.mode == "ssd":
            published = self.draft.speculate([(it.seq_id, it.tokens) for it in items])
            for s in batch:
                self.cache.publish(s.seq_id, self._rounds[s.seq_id].round + 1, published[s.seq_id])
        return self.target.verify(items, features=self.draft.feature_size > 0)

    def _admit(self) -> list[Sequence]:
        new = [self.waiting.popleft() for _ in range(min(len(self.waiting), self.target.free_slots))]
        if not new:
            return []
        firsts = self.target.prefill([(s.seq_id, s.prompt, s.params) for s in new],
                                     features=self.draft.feature_size > 0)
        for s, t0 in zip(new, firsts):
            self.running.append(s)
            self._rounds[s.seq_id] = _Round()
            self.cache.start_sequence(s.seq_id, first_round=0)
            self._commit(s, [t0])
            if s.finished:
                self._finish(s)
                continue
            dp = draft_params_for(s.params, self.spec.draft_top_k, self.spec.saguaro_c, self.spec.fanout[0])
            self.draft.add(s.seq_id, s.prompt + s.output, dp, self.target.last_features.get(s.seq_id))
            self._next_from_cache(s, self._rounds[s.seq_id], 0, t0)
        return new

    def _commit(self, s: Sequence, tokens: list[int]) -> int:
        """Append tokens until the sequence finishes; returns how many were committed."""
        n = 0
        for t in tokens:
            s.append(t, self.eos_token_ids, self.max_len)
            n += 1
            if s.finished:
                break
        return n

    def _room(self, s: Sequence) -> int:
        """The most tokens a speculation may hold: never past max_len nor far past max_tokens."""
        return speculation_room(self.spec.k, s.params, len(s.output), s.num_tokens, self.max_len)

    def _next_from_cache(self, s: Sequence, st: _Round, j: int, t: int) -> None:
        st.spec, st.kind = None, "cache"
        if self.spec.mode != "ssd":
            return
        entry, reason = self.cache.lookup(s.seq_id, st.round, j, t)
        self.cache.advance(s.seq_id, st.round + 1)
        s.stats.count("cache", reason.value)
        if reason is LookupReason.HIT:
            room = self._room(s)
            proposal = None if entry.proposal is None else [(list(i), list(p)) for i, p in entry.proposal[:room]]
            st.spec = Speculation(list(entry.tokens[:room]), proposal)

    def _fill_backups(self, batch: list[Sequence]) -> None:
        need = [s for s in batch if self._rounds[s.seq_id].spec is None]
        if not need:
            return
        policy = BackupPolicy.JIT if self.spec.mode == "sd" else self.spec.backup
        jit = []
        for s in need:
            st = self._rounds[s.seq_id]
            kind = choose_backup(policy, len(batch), self.timings)
            room = self._room(s)
            if kind is BackupPolicy.NGRAM:
                tokens = ngram_propose(s.prompt + s.output, room)
                kind = BackupPolicy.NGRAM if tokens else BackupPolicy.NONE
                proposal = None if s.params.greedy else [([t], [1.0]) for t in tokens]
                st.spec = Speculation(tokens, proposal)
            elif kind is BackupPolicy.NONE or room == 0:
                kind = BackupPolicy.NONE
                st.spec = Speculation([], None if s.params.greedy else [])
            else:
                jit.append(s)
            st.kind = kind.value
            s.stats.count("backups", kind.value)
        if jit:
            rooms = [self._room(s) for s in jit]
            specs = self.draft.jit([s.seq_id for s in jit], max(rooms))
            self.timings.observe_draft_step(len(jit), self.draft.last_jit_step_s)
            for s, sp, room in zip(jit, specs, rooms):
                proposal = None if sp.proposal is None else sp.proposal[:room]
                self._rounds[s.seq_id].spec = Speculation(sp.tokens[:room], proposal)

    def _finish(self, s: Sequence) -> None:
        if s in self.running:
            self.running.remove(s)
        self.target.free(s.seq_id)
        self.draft.free(s.seq_id)
        if s.seq_id in self.cache:
            self.cache.end_sequence(s.seq_id)
        self._rounds.pop(s.seq_id, None)
        self.stats.merge(s.stats)
