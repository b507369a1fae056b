"""In-process speculative engines (SD and SSD): the round core that the router ships (`ssd.round`), carried over
function calls to the target and draft handlers that the services run (`ssd.engine.target_handler`,
`ssd.engine.draft_handler`) instead of over sockets.

One `step` delivers what the core sent to each worker and hands the replies back, until one verify round has
been applied. The draft's messages are delivered before the target's and its replies applied first: in process,
SSD speculation (published to the cache) runs before the verify it overlaps in the services, so every cache
entry is on time. Outputs are exactly the target's: greedy outputs equal the AR engine's token for token,
sampled outputs follow its distribution.

A handle (`LocalWorker`) stands for each worker as the core sees it; a subclass may carry its messages
elsewhere (bench/gpu_check.py runs the draft handler in a second process).
"""
from __future__ import annotations

from dataclasses import dataclass

from ssd import wire
from ssd.engine.base import Engine
from ssd.engine.draft import DraftWorker
from ssd.engine.draft_handler import DraftHandler
from ssd.engine.sequence import FinishReason, Sequence
from ssd.engine.stats import SpecStats
from ssd.engine.target import TargetWorker
from ssd.engine.target_handler import TargetHandler
from ssd.models.decoder import Decoder
from ssd.models.kv_cache import DEFAULT_BLOCK_SIZE, default_kv_tokens
from ssd.round import CoreConfig, RoundCore, WorkerPool
from ssd.sampling import SamplingParams
from ssd.spec.backup import BackupPolicy
from ssd.spec.fanout import default_fanout

PEER = b"local"      # the handlers key sequences by (peer, seq): in process there is one peer
TOKENIZER = "local"  # the core checks every worker serves one tokenizer; in process they share the model's
MAX_PASSES = 64      # deliveries in one step before it gives up on reaching a verify (a stuck round is a bug)


@dataclass(slots=True)
class SpecConfig:
    mode: str = "ssd"                 # "sd" or "ssd"
    k: int = 3                        # drafted tokens per round (with `adaptive`, the most)
    fanout: tuple[int, ...] | None = None  # F_0..F_K; default: `budget` split by ssd.spec.fanout.default_fanout
    budget: int | None = None         # total forks per sequence and round; default 16 (K + 1)
    backup: BackupPolicy = BackupPolicy.JIT
    draft_top_k: int = 32             # sampling: the draft's q is truncated to its top-k (sparse on the wire)
    saguaro_c: float = 1.0
    adaptive: bool = False            # K per round from measurements, as the router does (False: always `k`)
    adaptive_fanout: bool = False     # each round's fan-out from measured acceptance, as the router does
    jit_linger: float = 0.05          # see ssd.round.batches
    min_confidence: float = 0.0       # the draft stops a chain where its own confidence falls below (DraftWorker)

    def __post_init__(self):
        if self.mode not in ("sd", "ssd"):
            raise ValueError(f"mode must be 'sd' or 'ssd', got {self.mode!r}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        self.backup = BackupPolicy(self.backup)
        if self.fanout is None:
            self.fanout = tuple(default_fanout(self.k, self.budget or None))
        self.fanout = tuple(self.fanout)
        if len(self.fanout) != self.k + 1:
            raise ValueError(f"fanout needs K+1 = {self.k + 1} entries, got {self.fanout}")

    def core_config(self, max_batch: int) -> CoreConfig:
        return CoreConfig(mode=self.mode, backup=self.backup.value, max_batch=max_batch,
                          draft_top_k=self.draft_top_k, saguaro_c=self.saguaro_c, adaptive=self.adaptive,
                          adaptive_fanout=self.adaptive_fanout, jit_linger=self.jit_linger)


class _Replies:
    """The handler's endpoint: what it answers is kept for the core."""

    def __init__(self):
        self.messages: list = []

    def send(self, peer: bytes, msg) -> None:
        self.messages.append(msg)


class LocalWorker:
    """A worker handle for the core: `send` queues a message; `deliver` hands the queue to the handler, whose
    replies `replies` returns."""

    def __init__(self, role: str, handler_cls, worker, ready: wire.Ready):
        self.role, self.address, self.alive, self.ready = role, f"in-process {role}", True, ready
        self._replies = _Replies()
        self.handler = handler_cls(worker, self._replies)
        self.inbox: list = []

    def send(self, msg) -> bool:
        self.inbox.append(msg)
        return True

    def deliver(self) -> list:
        """Run what was sent; returns the messages delivered."""
        batch, self.inbox = self.inbox, []
        if batch:
            self.handler.handle([(PEER, m) for m in batch])
        return batch

    def replies(self) -> list:
        out, self._replies.messages = self._replies.messages, []
        return out


class _Events:
    """A request's event queue that writes into its Sequence."""

    def __init__(self, seq: Sequence):
        self.seq = seq
        self.error: str | None = None

    def put(self, event) -> None:
        kind, value = event
        if kind == "tokens":
            self.seq.output.extend(value)
        elif kind == "logprobs":
            self.seq.logprobs.extend(value)
        elif kind == "prompt_logprobs":
            self.seq.prompt_logprobs = value
        elif kind == "done":
            self.seq.finish_reason = value
        else:
            self.error = value
            self.seq.finish_reason = FinishReason.ERROR


class SpeculativeEngine(Engine):
    def __init__(self, target: Decoder, draft: Decoder, spec: SpecConfig | None = None, max_batch: int = 8,
                 max_len: int | None = None, eos_token_ids: tuple[int, ...] | None = None, kv_tokens: int = 0,
                 block_size: int = DEFAULT_BLOCK_SIZE, prefix_caching: bool = True, cuda_graphs: str = "auto",
                 grammar_tokenizer=None):
        super().__init__()
        self.spec = spec or SpecConfig()
        cfg = target.cfg
        if draft.cfg.vocab_size != cfg.vocab_size:
            raise ValueError(f"draft vocabulary ({draft.cfg.vocab_size}) differs from the target's ({cfg.vocab_size})")
        self.max_len = min(cfg.context_length(max_len or 0), draft.cfg.context_length(max_len or 0))
        self.vocab_size = cfg.vocab_size
        t_worker = TargetWorker(target, max_batch, self.max_len, kv_tokens, block_size, prefix_caching, cuda_graphs,
                                grammar_tokenizer)
        draft_kv = kv_tokens or default_kv_tokens(max_batch, self.max_len + self.spec.k + 1)
        d_worker = DraftWorker(draft, max_batch, self.max_len, self.spec.k, list(self.spec.fanout), draft_kv,
                               block_size, prefix_caching, cuda_graphs, grammar_tokenizer, self.spec.min_confidence)
        self.target_handle = LocalWorker("target", TargetHandler, t_worker,
                                         self._ready("target", t_worker.max_len, cfg.hidden_size))
        self.draft_handle = self._draft_handle(d_worker)
        pool = WorkerPool([self.target_handle], [self.draft_handle], TOKENIZER)
        eos = cfg.eos_token_ids if eos_token_ids is None else eos_token_ids
        self.core = RoundCore(self.spec.core_config(max_batch), pool, eos)
        self.core.start()
        self._requests: dict[int, tuple[Sequence, object, _Events]] = {}   # Sequence.seq_id -> (seq, req, events)

    def _ready(self, role: str, max_len: int, feature_size: int, fanout=()) -> wire.Ready:
        return wire.Ready(role, role, TOKENIZER, self.vocab_size, max_len, self.spec.k if role == "draft" else 0,
                          list(fanout), feature_size)

    def _draft_handle(self, worker: DraftWorker) -> LocalWorker:
        return LocalWorker("draft", DraftHandler, worker,
                           self._ready("draft", worker.max_len, worker.feature_size, self.spec.fanout))

    # ---- the workers, the cache and the figures, as tests and benchmarks read them --------------
    @property
    def target(self) -> TargetWorker:
        return self.target_handle.handler.worker

    @property
    def draft(self) -> DraftWorker:
        return self.draft_handle.handler.worker

    @property
    def cache(self):
        return self.core.cache

    @property
    def timings(self):
        return self.core.timings

    @property
    def stats(self) -> SpecStats:
        return self.core.stats

    @stats.setter
    def stats(self, value: SpecStats) -> None:
        self.core.stats = value

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, prompt: list[int], params: SamplingParams | None = None) -> Sequence:
        seq = super().add_request(prompt, params)
        self.waiting.remove(seq)   # the core holds the queue
        events = _Events(seq)
        pinned = 0 if self.spec.adaptive else self.spec.k
        req = self.core.submit(str(seq.seq_id), seq.prompt, seq.params, self.spec.mode, pinned, events=events)
        seq.stats = req.stats
        self._requests[seq.seq_id] = (seq, req, events)
        return seq

    def has_unfinished(self) -> bool:
        return any(not seq.finished for seq, _, _ in self._requests.values())

    def abort(self, seq: Sequence) -> None:
        entry = self._requests.get(seq.seq_id)
        if entry is not None and not seq.finished:
            self.core.abort(entry[1])
            self.core.take_new()
            self._flush()

    def step(self) -> list[Sequence]:
        """Deliver and apply until one verify round has been applied (or nothing moves); returns the sequences
        that got tokens."""
        before = {sid: len(s.output) for sid, (s, _, _) in self._requests.items()}
        self.core.step()
        for _ in range(MAX_PASSES):
            moved, verified = self._flush()
            if not moved or verified:
                break
            self.core.dispatch()
        else:
            raise RuntimeError(f"no verify round after {MAX_PASSES} deliveries: the round is stuck")
        self._raise_errors()
        stepped = [s for sid, (s, _, _) in self._requests.items() if len(s.output) > before.get(sid, 0)]
        for sid in [sid for sid, (s, _, _) in self._requests.items() if s.finished]:
            del self._requests[sid]
        return stepped

    def _flush(self) -> tuple[bool, bool]:
        """Deliver every queued message, draft first, and apply the replies, the draft's first."""
        handles = [self.draft_handle, self.target_handle]
        delivered = [h.deliver() for h in handles]
        for h in handles:
            for msg in h.replies():
                self.core.on_message(h, msg)
        verified = any(isinstance(m, wire.Verify) for m in delivered[1])
        return any(delivered), verified

    def _raise_errors(self) -> None:
        for seq, _, events in self._requests.values():
            if events.error is not None:
                raise RuntimeError(f"request {seq.seq_id} failed: {events.error}")

    def _finish(self, seq: Sequence) -> None:
        self.abort(seq)
