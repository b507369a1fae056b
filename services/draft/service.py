"""The draft service: one process owning a draft model, serving `DraftHandler` over ZeroMQ.

The protocol (adds, rounds, JIT, features, fan-out) is the handler's: `ssd/engine/draft_handler.py`. This
module holds the service's settings and what the worker shell (`ssd/worker/service.py`) needs of the draft
role: how its worker is built, and the K and fan-out its `Ready` announces.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ssd.constraints import grammar_for
from ssd.engine.draft import DraftWorker
from ssd.engine.draft_handler import DraftHandler
from ssd.engine.warmup import warm_up_draft
from ssd.models.kv_cache import default_kv_tokens
from ssd.spec.fanout import default_fanout
from ssd.worker.service import DEFAULT_DTYPES, Loaded, Role, WorkerConfig, load_plain, run_worker, setup_process


@dataclass(slots=True)
class DraftConfig(WorkerConfig):
    """Settings of a draft replica."""
    data_address: str = field(default="tcp://127.0.0.1:5602", metadata={"help": "ZeroMQ endpoint to bind"})
    control_address: str = field(default="127.0.0.1:5702", metadata={"help": "gRPC control address to bind"})
    dtype: str = field(default=DEFAULT_DTYPES["draft"], metadata={
        "help": "weights and KV cache: auto (bfloat16 where the device computes it natively, else float32), float32, "
                "bfloat16 or float16; a draft's dtype changes no output"})
    k: int = field(default=3, metadata={"help": "tokens per speculation (K)"})
    fanout: tuple[int, ...] = field(default=(), metadata={"help": "forks per acceptance position F_0..F_K"})
    min_confidence: float = field(default=0.0, metadata={
        "help": "stop a chain before a token (past its first) where the product of the draft's probabilities "
                "of its own tokens along it falls below this (0 = chains of the full K); in [0, 1)"})
    budget: int = field(default=0, metadata={"help": "total forks per round when fanout is not given "
                                                     "(0 = 16 (K+1)); sizes the draft's scratch KV"})

    def resolved_fanout(self) -> list[int]:
        if self.fanout:
            return list(self.fanout)
        return default_fanout(self.k, self.budget or None)


def draft_role(cfg: DraftConfig, folder: Path) -> Role:
    """The draft as the worker shell runs it (building it loads nothing)."""
    fanout = cfg.resolved_fanout()

    def load() -> Loaded:
        model = load_plain(cfg, folder, "draft")
        max_len = model.cfg.context_length(cfg.max_len, strict=True)
        columns = max_len + cfg.k + 1   # a sequence's committed KV and one speculation
        worker = DraftWorker(model, cfg.max_seqs, max_len, cfg.k, fanout,
                             cfg.kv_tokens or default_kv_tokens(cfg.max_seqs, columns), cfg.block_size,
                             cuda_graphs=cfg.cuda_graphs, grammar_tokenizer=grammar_for(folder, model.cfg.vocab_size),
                             min_confidence=cfg.min_confidence)
        warm_up_draft(worker)
        return Loaded(model, worker, worker.feature_size)

    def check() -> str | None:
        if not 0.0 <= cfg.min_confidence < 1.0:
            return f"--min-confidence must be in [0, 1), got {cfg.min_confidence}"
        if cfg.tp_size != 1:
            return f"tensor parallelism (--tp-size {cfg.tp_size}) is for the target; run the draft with --tp-size 1"
        return None

    return Role("draft", folder, load, DraftHandler, cfg.k, fanout, check)


def run(cfg: DraftConfig) -> int:
    setup_process(cfg, "draft")
    from ssd.paths import draft_dir

    return run_worker(cfg, draft_role(cfg, cfg.model or draft_dir(cfg.models_dir)))
