"""What the round core keeps per request, and its settings. No torch, no sockets."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ssd.engine.stats import SpecStats
from ssd.params import FinishReason, SamplingParams

MAX_TARGET_FAILURES = 3   # target batches failing as a whole that a sequence survives (rebuilt each time)
MODES = ("ar", "sd", "ssd")


class Phase(Enum):
    PREFILL = "prefill"   # waiting for the target's first token
    RESTORE = "restore"   # its target died: another one is rebuilding its KV from the committed tokens
    JIT = "jit"           # waiting for a JIT backup from the draft
    AWAIT = "await"       # ssd: its outcome came before the draft's entries for it, which it waits for
    READY = "ready"       # speculation ready, verify not sent yet
    VERIFY = "verify"     # waiting for the target's outcome


@dataclass(slots=True)
class RoundState:
    """The sequence's current round: the speculation it verifies and where it came from."""
    number: int = 0                # rounds verified so far (prefill is round 0)
    k: int = 0                     # draft tokens this round may use (the adaptive choice, or the pinned K)
    tokens: list[int] = field(default_factory=list)   # the speculation
    proposal: list | None = None   # sampling: the rows q each token was drawn from (None when greedy)
    source: str = ""               # cache | jit | ngram | none
    drafted: bool = False          # a DraftRound went out with this round (so a cache miss is informative)
    fanout: list[int] | None = None   # the fan-out that DraftRound asked for (None: the draft's own)
    verify_batch: int = 0          # the verify batch holding this round: only its outcome counts
    mixed: bool = False            # its verify batch ran more than one K (a probe by part of the batch)
    cached: bool = False           # ssd: the round's class speculates into the cache (else JIT only, as sd)
    jit_batch: int = 0             # the JIT batch that asked for this round's tokens: only its answer counts
    awaiting: tuple[int, int] | None = None   # AWAIT: the outcome (j, t*) whose entry the draft still owes
    await_since: float = 0.0       # AWAIT: the core's clock() when the wait began


@dataclass(slots=True, eq=False)
class Request:
    rid: str
    seq: int
    prompt: list[int]
    params: SamplingParams
    events: object                 # anything with put(event): a queue.Queue, or an asyncio bridge
    mode: str = "ssd"
    pinned_k: int = 0              # the request's own K (0: the core chooses, up to the draft's K)
    deadline: float | None = None  # the core's clock() after which the request ends with TIME_LIMIT
    arrival: float = 0.0           # the core's clock() at submit
    prompt_len: int = 0            # tokens of `prompt` the client sent (0 = all; a resumed one's continues it)
    admitted_at: float | None = None   # the core's clock() when it was admitted (its prefill sent)
    output: list[int] = field(default_factory=list)
    phase: Phase = Phase.PREFILL
    round: RoundState = field(default_factory=RoundState)
    draft_sent: int = 0            # committed tokens the draft knows
    draft_fresh: bool = False      # (re)added to its draft, which has not answered for it since: the draft's next
                                   # JIT or round for it also computes the KV of every token it was given
    last_outcome_at: float | None = None   # the core's clock() at its last outcome (prefill's first token
                                           # included): a round's time as the sequence lived it; None: not timed
    target_failures: int = 0       # target batches that failed as a whole while holding this sequence
    first_token_at: float | None = None
    last_emit_at: float = 0.0
    target: object | None = None   # the worker handle of the target this sequence is pinned to
    draft: object | None = None    # the draft replica that speculates for it (None: backups only)
    stats: SpecStats = field(default_factory=SpecStats)
    finish: FinishReason | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


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
    verify_inflight: int = 1       # verify batches out to one target at a time (0 = no limit); see ssd.round.batches
    verify_hold: float = 5.0       # a batch out longer than this no longer holds the next one back
    jit_linger: float = 0.05       # at most this long a free target waits for its sequences' JITs to land
    adaptive_fanout: bool = True   # each DraftRound carries a fan-out from ssd.spec.fanout.FanoutPolicy
    await_late: bool = True        # ssd: an outcome that finds the draft late waits for its entries
                                   # (see RoundCore.next)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be ar, sd or ssd, got {self.mode!r}")
        if self.verify_inflight < 0:
            raise ValueError(f"verify_inflight must be >= 0 (0 = no limit), got {self.verify_inflight}")
        if self.jit_linger < 0:
            raise ValueError(f"jit_linger must be >= 0 seconds (0 = never wait), got {self.jit_linger}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")


@dataclass(slots=True)
class Timings:
    """Cumulative round-time split: target compute, round trip as the core sees it, draft compute."""
    verify_batches: int = 0
    target_verify_s: float = 0.0
    verify_roundtrip_s: float = 0.0
    draft_rounds: int = 0
    draft_round_s: float = 0.0
    jit_batches: int = 0
    jit_s: float = 0.0
    wait_s: float = 0.0            # late lookups' waits for the draft's entries (their count: SpecStats.waits)
