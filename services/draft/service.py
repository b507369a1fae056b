"""The draft service: one process owning a draft model, serving `DraftHandler` over ZeroMQ.

The protocol (adds, rounds, JIT, features, fan-out) is the handler's: `ssd/engine/draft_handler.py`. This
module holds the service's settings and its entry point over the worker shell (`ssd/worker_service.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ssd.engine.draft import DraftWorker
from ssd.engine.draft_handler import DraftHandler
from ssd.spec.fanout import uniform_fanout
from ssd.worker_service import WorkerConfig, run_worker, setup_process


@dataclass(slots=True)
class DraftConfig(WorkerConfig):
    """Settings of a draft replica."""
    data_address: str = field(default="tcp://127.0.0.1:5602", metadata={"help": "ZeroMQ endpoint to bind"})
    control_address: str = field(default="127.0.0.1:5702", metadata={"help": "gRPC control address to bind"})
    k: int = field(default=3, metadata={"help": "tokens per speculation (K)"})
    fanout: tuple[int, ...] = field(default=(), metadata={"help": "forks per acceptance position F_0..F_K"})
    budget: int = field(default=0, metadata={"help": "total forks per round when fanout is not given"})

    def resolved_fanout(self) -> list[int]:
        if self.fanout:
            return list(self.fanout)
        return uniform_fanout(self.k, self.budget or 2 * (self.k + 1))


def run(cfg: DraftConfig) -> int:
    setup_process(cfg, "draft")
    from ssd.paths import draft_dir

    fanout = cfg.resolved_fanout()

    def build(model) -> DraftWorker:
        return DraftWorker(model, cfg.max_seqs, min(cfg.max_len, model.cfg.max_position_embeddings), cfg.k, fanout,
                           cfg.kv_tokens, cfg.block_size, cuda_graphs=cfg.cuda_graphs)

    return run_worker(cfg, "draft", cfg.model or draft_dir(cfg.models_dir), build, DraftHandler, cfg.k, fanout)
