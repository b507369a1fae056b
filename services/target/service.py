"""The target service: one process owning the target model, serving `TargetHandler` over ZeroMQ.

The protocol (prefill, verify, features) is the handler's: `ssd/engine/target_handler.py`. This module holds
the service's settings and what the worker shell (`ssd/worker/service.py`) needs of the target role: how its
worker is loaded, over tensor-parallel ranks with `--tp-size` > 1 (`ssd/engine/target_tp.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ssd.engine.target_handler import TargetHandler
from ssd.engine.target_tp import SETTINGS, build_target, load_leader, tp_problem
from ssd.engine.warmup import warm_up_target
from ssd.worker.service import Loaded, Role, WorkerConfig, load_plain, resolve_dtype, run_worker, setup_process


@dataclass(slots=True)
class TargetConfig(WorkerConfig):
    """Settings of the target service."""
    data_address: str = field(default="tcp://127.0.0.1:5601", metadata={"help": "ZeroMQ endpoint to bind"})
    control_address: str = field(default="127.0.0.1:5701", metadata={"help": "gRPC control address to bind"})


def target_role(cfg: TargetConfig, folder: Path) -> Role:
    """The target as the worker shell runs it (building it loads nothing)."""
    settings = {name: getattr(cfg, name) for name in SETTINGS}   # every tensor-parallel rank builds alike
    settings["dtype"] = resolve_dtype(cfg.dtype, cfg.device, "target")

    def load() -> Loaded:
        if cfg.tp_size > 1:
            model, worker, close = load_leader(folder, settings, cfg.tp_size)
        else:
            model, close = load_plain(cfg, folder), None
            worker = build_target(model, settings, folder)
            warm_up_target(worker)
        return Loaded(model, worker, model.cfg.hidden_size, close)   # its features are its hidden states

    return Role("target", folder, load, TargetHandler, check=lambda: tp_problem(cfg.tp_size, folder))


def run(cfg: TargetConfig) -> int:
    setup_process(cfg, "target")
    from ssd.paths import target_dir

    return run_worker(cfg, target_role(cfg, cfg.model or target_dir(cfg.models_dir)))
