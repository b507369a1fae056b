"""SSD with the draft in a second process sharing the device: the draft service's handler over a pipe
(`draft_process`, ssd.wire messages, one frame each), and the in-process engine whose draft handle carries its
messages there (`two_process_engine`), so the draft speculates while the target verifies, as in the services."""
from __future__ import annotations

import time

import torch

from bench.gpu.models import random_model
from ssd.config import ModelConfig
from ssd.models.decoder import Decoder


def draft_process(conn, cfg_dict: dict, device: str, dtype_name: str, k: int, fanout: list[int], max_seqs: int,
                  max_len: int, graphs: str = "auto") -> None:
    """The draft service's handler (ssd.engine.draft_handler) over a pipe: each batch of messages is handled as
    the service handles one, its replies sent back, then b"end"."""
    from ssd.engine.draft import DraftWorker
    from ssd.engine.draft_handler import DraftHandler
    torch.set_num_threads(1)
    cfg = ModelConfig(**cfg_dict)
    worker = DraftWorker(random_model(cfg, device, getattr(torch, dtype_name)), max_seqs, max_len, k, fanout,
                         cuda_graphs=graphs)

    class PipeEndpoint:
        def send(self, peer, msg) -> None:
            _send(conn, msg)

    handler = DraftHandler(worker, PipeEndpoint())
    conn.send_bytes(b"ready")
    while True:
        batch = []
        while True:
            frames = conn.recv_bytes()
            if frames == b"stop":
                return
            if frames == b"batch":
                break
            batch.append((b"router", _decode(frames)))
        handler.handle(batch)
        conn.send_bytes(b"end")


def _send(conn, msg) -> None:
    from ssd import wire
    head, body = wire.encode(msg)
    conn.send_bytes(head + body)


def _decode(frames: bytes):
    from ssd import wire
    return wire.decode([frames[:1], frames[1:]])


def two_process_engine(target: Decoder, draft_cfg: ModelConfig, conn, k: int, max_batch: int, max_len: int,
                       graphs: str = "auto"):
    """The in-process engine (the shipped round core) whose draft handle carries its messages to the draft
    process: the draft speculates while the target verifies, as in the services."""
    from ssd import wire
    from ssd.engine.speculative import LocalWorker, SpecConfig, SpeculativeEngine

    class PipeDraft(LocalWorker):
        def __init__(self, ready):
            self.role, self.address, self.alive, self.ready = "draft", "draft process", True, ready
            self.inbox, self.pending, self.handler = [], False, None
            self.timing = {"rounds": 0, "verify_s": 0.0, "wait_s": 0.0, "draft_s": 0.0}
            self._sent_at = 0.0

        def deliver(self) -> list:
            batch, self.inbox = self.inbox, []
            for msg in batch:
                _send(conn, msg)
            if batch:
                conn.send_bytes(b"batch")
                self.pending, self._sent_at = True, time.perf_counter()
            return batch

        def replies(self) -> list:
            if not self.pending:
                return []
            t0, out = time.perf_counter(), []
            while (frames := conn.recv_bytes()) != b"end":
                out.append(_decode(frames))
            self.pending = False
            t = self.timing
            rounds = [m for m in out if isinstance(m, wire.CacheEntries)]
            if rounds:
                t["rounds"] += 1
                t["verify_s"] += t0 - self._sent_at            # the target's share while the draft worked
                t["wait_s"] += time.perf_counter() - t0         # how long the target then waited for the draft
                t["draft_s"] += rounds[0].elapsed_s
            return out

    class TwoProcessSSD(SpeculativeEngine):
        def _draft_handle(self, worker):
            return PipeDraft(self._ready("draft", worker.max_len, 0, self.spec.fanout))

        @property
        def timing(self) -> dict:
            return self.draft_handle.timing

        @timing.setter
        def timing(self, value: dict) -> None:
            self.draft_handle.timing = value

    with torch.device("meta"):
        placeholder = Decoder(draft_cfg)   # the engine builds a DraftWorker, unused: the draft process has its own
    return TwoProcessSSD(target, placeholder, SpecConfig(mode="ssd", k=k), max_batch=max_batch, max_len=max_len,
                         eos_token_ids=(), cuda_graphs=graphs)
