"""What the round-core tests drive `ssd.round.RoundCore` with: worker handles that record what they are sent, a
clock the test moves, and a rig that builds a started core over them. No sockets, no models: a test hands the core
the replies a worker would send (`core.on_message`) and reads what it sent back.
"""
from __future__ import annotations

from ssd import wire
from ssd.round import CoreConfig, RoundCore, WorkerPool
from ssd.round.metrics import RoundMetrics

TOKENIZER = "h"
VOCAB, MAX_LEN, K = 100, 256, 3
EOS = [2]


def ready(role: str, feature_size: int = 0, vocab: int = VOCAB, k: int = K) -> wire.Ready:
    """A worker's handshake: drafts speculate K with fan-out [2, 1, 1, 1]; `feature_size` as `Ready`'s."""
    return wire.Ready(role, "m", TOKENIZER, vocab, MAX_LEN, k, [2, 1, 1, 1] if role == "draft" else [], feature_size)


class Clock:
    """The core's clock, moved by the test: a hold or a wait ends when the test says, never by real time."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Worker:
    """A worker handle as the core sees it (`role`, `address`, `alive`, `ready`, `send`): every message it is sent
    goes to `log` as (this handle, message)."""

    def __init__(self, role: str, address: str, ready: wire.Ready | None, log: list):
        self.role, self.address, self.ready, self.log = role, address, ready, log
        self.alive = ready is not None

    def send(self, msg) -> bool:
        self.log.append((self, msg))
        return True

    def __repr__(self) -> str:
        return f"Worker({self.role} {self.address})"


class RecordingMetrics(RoundMetrics):
    """The core's metric hooks, the ones the tests read recorded."""

    def __init__(self):
        self.feature_rows_sent = 0
        self.drafts_alive: list[int] = []
        self.speculation_k: dict[str, list[int]] = {}
        self.finished: list[dict] = []
        self.waits: list[tuple[str, float]] = []   # (result, seconds) per ended wait for the draft's entries

    def request_finished(self, mode, outcome, prompt_tokens, completion_tokens, ttft_s, e2e_s, queue_s=None):
        self.finished.append(dict(mode=mode, outcome=outcome, prompt_tokens=prompt_tokens,
                                  completion_tokens=completion_tokens, ttft_s=ttft_s, e2e_s=e2e_s, queue_s=queue_s))

    def feature_rows(self, n: int) -> None:
        self.feature_rows_sent += n

    def cache_wait(self, result: str, seconds: float) -> None:
        self.waits.append((result, seconds))

    def set_drafts_alive(self, n: int) -> None:
        self.drafts_alive.append(n)

    def set_speculation_k(self, mode: str, k: int) -> None:
        self.speculation_k.setdefault(mode, []).append(k)


class Rig:
    """A started RoundCore over recording workers, one per `Ready` given (targets at tcp://127.0.0.1:9.., drafts
    after them), with the test's clock."""

    def __init__(self, cfg: CoreConfig, targets=(None,), drafts=(), clock: Clock | None = None, metrics=None,
                 start: bool = True):
        self.sent: list = []   # (worker, message), in the order sent
        self.clock = clock or Clock()
        self.metrics = metrics or RecordingMetrics()
        readies = [r or ready("target") for r in targets] + [r or ready("draft") for r in drafts]
        workers = [Worker(r.role, f"tcp://127.0.0.1:{9 + i}", r, self.sent) for i, r in enumerate(readies)]
        self.targets = [w for w in workers if w.role == "target"]
        self.drafts = [w for w in workers if w.role == "draft"]
        self.pool = WorkerPool(self.targets, self.drafts, TOKENIZER)
        self.core = RoundCore(cfg, self.pool, EOS, metrics=self.metrics, clock=self.clock)
        if start:
            self.core.start()

    @property
    def target(self) -> Worker:
        return self.targets[0]

    def take(self, cls) -> list:
        """The messages of type `cls` sent since the last take of that type (now taken)."""
        return [m for _, m in self.take_sent(cls)]

    def take_sent(self, cls) -> list[tuple[Worker, object]]:
        """As `take`, with the worker each went to."""
        out = [(w, m) for w, m in self.sent if isinstance(m, cls)]
        self.sent[:] = [(w, m) for w, m in self.sent if not isinstance(m, cls)]
        return out


def events(req) -> list:
    """The request's events so far (now taken)."""
    out = []
    while not req.events.empty():
        out.append(req.events.get_nowait())
    return out


def tokens_seen(req) -> list[int]:
    """Every token the client was sent so far, in order (what a stream would show)."""
    return [t for kind, value in events(req) if kind == "tokens" for t in value]
