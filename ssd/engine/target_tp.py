"""One target service over its tensor-parallel ranks (used by `services/target/service.py`).

Rank 0, the leader, is the service: it owns the data plane and the control plane and runs the handler. Ranks
1..N-1, the followers, are processes it spawns; each holds its shard of the model and a `TargetWorker` of its
own. Every call that changes a TargetWorker (prefill, restore, verify, free) is broadcast by the leader before
it runs (a `ssd/tp_wire.py` message: its length, then its bytes in a uint8 tensor), and each follower makes the
same call with the same inputs (the `features` flag included) in the same order, so the collectives inside the
forwards meet; only the leader's `last_features` is read. A call the codec refuses is refused on the leader
before anything runs anywhere. A sampled request without a seed gets one from the leader, so every rank draws
the same tokens. A follower exits when the leader goes, and with code 1 when it cannot decode what the leader
sent; a follower that dies makes the leader exit with code 1.
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import secrets
import threading
import time

import torch
import torch.distributed as dist

from ssd import tp_wire, wire
from ssd.constraints import grammar_for
from ssd.cpus import pin
from ssd.engine.target import TargetWorker
from ssd.models.parallel import TPGroup, free_port

log = logging.getLogger("ssd.tp")

SETTINGS = ("log_level", "cpus", "threads", "max_seqs", "max_len", "kv_tokens", "block_size", "cuda_graphs",
            "dtype")


def build_target(model, s: dict, folder=None) -> TargetWorker:
    """The target's worker from its settings (the same on every rank); with the model `folder`, constrained
    requests are served (its tokenizer is wrapped for the grammar engine on the first one)."""
    grammar = grammar_for(folder, model.cfg.vocab_size)
    return TargetWorker(model, s["max_seqs"], model.cfg.context_length(s["max_len"], strict=True),
                        s["kv_tokens"], s["block_size"], cuda_graphs=s.get("cuda_graphs", "auto"),
                        grammar_tokenizer=grammar)


def init_rank(rank: int, size: int, port: int, device: str = "cpu") -> TPGroup:
    """Join the group: gloo for a model on the CPU (what the services load today), NCCL with one GPU per rank."""
    backend = "gloo"
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(rank)
        backend = "nccl"
    return TPGroup.init(rank, size, f"tcp://127.0.0.1:{port}", backend=backend)


class OpChannel:
    """The leader's broadcast of messages (`tp_wire` bytes) to its followers: a length, then the bytes."""

    def __init__(self):
        self.device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")

    def send(self, data: bytes) -> None:
        dist.broadcast(torch.tensor([len(data)], dtype=torch.int64, device=self.device), 0)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device), 0)

    def recv(self) -> bytes:
        n = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.broadcast(n, 0)
        size = int(n.item())
        if not 2 <= size <= tp_wire.MAX_OP_BYTES:   # the leader never sends such: the broadcast is corrupt
            raise tp_wire.TPWireError(f"a tensor-parallel message of {size} bytes announced; at most "
                                      f"MAX_OP_BYTES={tp_wire.MAX_OP_BYTES} are")
        buf = torch.empty(size, dtype=torch.uint8, device=self.device)
        dist.broadcast(buf, 0)
        return buf.cpu().numpy().tobytes()


def _requests(requests) -> list[tp_wire.Request]:
    return [tp_wire.Request(seq_id, list(tokens), p, (n or [0])[0]) for seq_id, tokens, p, *n in requests]


def _calls(requests: list[tp_wire.Request]) -> list:
    return [(r.seq_id, r.tokens, r.params, r.prompt_len or len(r.tokens)) for r in requests]


def _seeded(requests) -> list:
    """Give each sampled request without a seed one, so that every rank samples alike."""
    return [(seq_id, tokens, p if p.greedy or p.seed is not None else
             dataclasses.replace(p, seed=secrets.randbits(63), seed_stream=True),
             *n) for seq_id, tokens, p, *n in requests]


class MirroredTarget:
    """The leader's TargetWorker: a call that changes it is broadcast first; everything else passes through."""

    def __init__(self, worker: TargetWorker, channel: OpChannel):
        self.worker, self.channel = worker, channel

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def __contains__(self, seq_id) -> bool:
        return seq_id in self.worker

    def prefill(self, requests, features: bool = False):
        requests = _seeded(requests)
        self.channel.send(tp_wire.encode(tp_wire.Prefill(_requests(requests), features)))
        return self.worker.prefill(requests, features=features)

    def restore(self, requests):
        requests = _seeded(requests)
        self.channel.send(tp_wire.encode(tp_wire.Restore(_requests(requests))))
        return self.worker.restore(requests)

    def verify(self, items, features: bool = False):
        wire_items = [tp_wire.Item(it.seq, list(it.tokens), it.proposal) for it in items]
        self.channel.send(tp_wire.encode(tp_wire.Verify(wire_items, features)))
        return self.worker.verify(items, features=features)

    def free(self, seq_id):
        self.channel.send(tp_wire.encode(tp_wire.Free(seq_id)))
        return self.worker.free(seq_id)


def follow(worker: TargetWorker, channel: OpChannel) -> None:
    """A follower's loop: run what the leader broadcasts until it says stop. TPWireError when a message does not
    decode: this rank can no longer mirror the leader."""
    while True:
        msg = tp_wire.decode(channel.recv())
        try:
            if isinstance(msg, tp_wire.Stop):
                return
            if isinstance(msg, tp_wire.Prefill):
                worker.prefill(_calls(msg.requests), features=msg.features)
            elif isinstance(msg, tp_wire.Restore):
                worker.restore(_calls(msg.requests))
            elif isinstance(msg, tp_wire.Verify):
                worker.verify([wire.VerifyItem(it.seq_id, it.tokens, it.proposal) for it in msg.items],
                              features=msg.features)
            elif isinstance(msg, tp_wire.Free):
                worker.free(msg.seq_id)
        except Exception as e:  # noqa: BLE001 - the leader meets the same error and reports it
            log.debug("%s failed here as on the leader: %s", type(msg).__name__, e)


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def follower_main(rank: int, size: int, port: int, folder: str, settings: dict) -> None:
    """Entry point of follower `rank` (a spawned process)."""
    logging.basicConfig(level=settings["log_level"].upper(),
                        format=f"%(asctime)s target[rank {rank}] %(levelname)s %(message)s")
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    pin(settings["cpus"])
    if settings["threads"]:
        torch.set_num_threads(settings["threads"])
    from ssd.models.loader import load_model

    tp = init_rank(rank, size, port)
    worker = build_target(load_model(folder, dtype=getattr(torch, settings.get("dtype", "float32")), tp=tp),
                          settings, folder)
    log.info("tensor-parallel rank %d of %d ready", rank, size)
    try:
        follow(worker, OpChannel())
    except tp_wire.TPWireError as e:
        log.error("rank %d cannot follow its leader: %s; exiting", rank, e)
        logging.shutdown()
        os._exit(1)
    except RuntimeError as e:   # the leader went away mid-collective
        log.info("leader gone (%s); rank %d exits", e, rank)
        os._exit(0)
    dist.destroy_process_group()


class Followers:
    """Ranks 1..size-1 of one target, spawned by the leader and watched: if one dies, the leader exits 1."""

    def __init__(self, size: int, folder: str, settings: dict):
        self.size, self.port, self.stopping = size, free_port(), False
        ctx = mp.get_context("spawn")
        self.procs = [ctx.Process(target=follower_main, args=(r, size, self.port, folder, settings), daemon=True,
                                  name=f"ssd-target-rank{r}") for r in range(1, size)]
        for p in self.procs:
            p.start()
        threading.Thread(target=self._watch, daemon=True, name="ssd-tp-watch").start()

    def init_leader(self) -> TPGroup:
        return init_rank(0, self.size, self.port)

    def _watch(self) -> None:
        while not self.stopping:
            for rank, p in enumerate(self.procs, 1):
                if p.exitcode is not None and not self.stopping:
                    log.error("tensor-parallel rank %d exited with code %s: the target cannot run without it; "
                              "exiting", rank, p.exitcode)
                    logging.shutdown()
                    os._exit(1)
            time.sleep(0.2)

    def stop(self, channel: OpChannel | None) -> None:
        self.stopping = True
        if channel is not None:
            try:
                channel.send(tp_wire.encode(tp_wire.Stop()))
            except RuntimeError as e:
                log.warning("could not tell the followers to stop: %s", e)
        for p in self.procs:
            p.join(timeout=10)
            if p.exitcode is None:
                p.terminate()
        if dist.is_initialized():
            dist.destroy_process_group()


def tp_problem(size: int, folder) -> str | None:
    """Why the model in `folder` cannot run over `size` ranks (None when it can); read before anything loads."""
    if size == 1:
        return None
    from ssd.config import ModelConfig

    try:
        TPGroup(0, size).check(ModelConfig.from_folder(folder))
    except (ValueError, OSError) as e:
        return f"--tp-size {size}: {e}"
    return None


def load_leader(folder, settings: dict, size: int):
    """Spawn ranks 1..size-1, join them and load rank 0's shard: `(model, worker, close)`, the worker mirroring
    every change to the followers and `close()` stopping them."""
    from ssd.models.loader import load_model

    followers = Followers(size, str(folder), settings)
    tp = followers.init_leader()
    channel = OpChannel()
    model = load_model(folder, dtype=getattr(torch, settings.get("dtype", "float32")), tp=tp)
    worker = MirroredTarget(build_target(model, settings, folder), channel)
    log.info("tensor parallel over %d ranks", size)
    return model, worker, lambda: followers.stop(channel)
