"""The target service: one process owning the target model, serving `TargetHandler` over ZeroMQ.

The protocol (prefill, verify, features) is the handler's: `ssd/engine/target_handler.py`. This module holds
the service's settings and its entry point over the worker shell (`ssd/worker_service.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ssd.engine.target import TargetWorker
from ssd.engine.target_handler import TargetHandler
from ssd.tp_service import SETTINGS, build_target
from ssd.worker_service import WorkerConfig, run_worker, setup_process


@dataclass(slots=True)
class TargetConfig(WorkerConfig):
    """Settings of the target service."""
    data_address: str = field(default="tcp://127.0.0.1:5601", metadata={"help": "ZeroMQ endpoint to bind"})
    control_address: str = field(default="127.0.0.1:5701", metadata={"help": "gRPC control address to bind"})


def run(cfg: TargetConfig) -> int:
    setup_process(cfg, "target")
    from ssd.paths import target_dir

    def build(model) -> TargetWorker:   # every tensor-parallel rank builds its worker the same way
        return build_target(model, {name: getattr(cfg, name) for name in SETTINGS})

    return run_worker(cfg, "target", cfg.model or target_dir(cfg.models_dir), build, TargetHandler)
