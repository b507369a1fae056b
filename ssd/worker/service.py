"""What the target and draft services share: settings, process setup, the control plane, the serve loop.

A worker process loads its model while its health is NOT_SERVING, binds its data plane (`WorkerEndpoint`),
reports the addresses it bound (`--bound-file`: any of them may be given with port 0), turns SERVING, then
hands each batch of inbox messages to its role's handler until SIGTERM/SIGINT or a Drain. The handler holds
the role's logic; this module only moves messages. What is role-specific (the checks of its settings, how its
worker is loaded and built, its handler, what its `Ready` announces) the role's service passes as a `Role`, so
this module imports no target or draft code.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ssd import wire
from ssd.control import ControlServer
from ssd.cpus import pin
from ssd.curve import server_keys
from ssd.engine.handler import Handler
from ssd.service_config import bound_host_port, write_bound_file
from ssd.worker.io import PeerGone, WorkerEndpoint
from ssd.worker.metrics import kv_stats, serve_metrics

log = logging.getLogger(__name__)

INFO_STATS = ("prefix_cache_queried_tokens", "prefix_cache_hit_tokens", "preemptions")  # in Describe


@dataclass(slots=True)
class Loaded:
    """A role's worker once loaded: what the shell serves, describes and announces."""
    model: Any          # the (rank 0) Decoder: its cfg gives the vocabulary size
    worker: Any         # a TargetWorker, its tensor-parallel leader or a DraftWorker: seqs, free, cache, max_len
    feature_size: int   # Ready.feature_size: a target's hidden size, the row size a draft reads (0: none)
    close: Callable[[], None] | None = None   # called once serving ends (e.g. stop tensor-parallel ranks)


@dataclass(slots=True)
class Role:
    """What a role's service gives the shell: nothing here knows a role beyond this."""
    name: str                 # "target" or "draft": Ready.role, Describe's role, logs and metrics labels
    folder: Path              # the model folder (Ready.model_id is its name; the tokenizer is read from it)
    load: Callable[[], Loaded]                      # loads the model and builds the worker (control plane up)
    handler: Callable[[Any, WorkerEndpoint], Handler]   # the role's logic over the worker and its endpoint
    k: int = 0                # Ready.k and Describe's k (a draft's K)
    fanout: list[int] = field(default_factory=list)     # Ready.fanout and Describe's fan-out (a draft's)
    # why this role cannot run these settings (None: it can), checked before anything loads; without it a
    # --tp-size above 1 is refused (tensor parallelism is the role's to offer)
    check: Callable[[], str | None] | None = None


# each role's --dtype when none is given (the target's is WorkerConfig's; the draft service's config overrides it)
DEFAULT_DTYPES = {"target": "float32", "draft": "auto"}


@dataclass(slots=True)
class WorkerConfig:
    model: Path | None = field(default=None, metadata={"help": "model folder (default: the embedded default)"})
    models_dir: Path | None = field(default=None, metadata={"help": "folder of prepared models"})
    data_address: str = field(default="tcp://127.0.0.1:5601", metadata={"help": "ZeroMQ endpoint to bind"})
    control_address: str = field(default="127.0.0.1:5701", metadata={"help": "gRPC control address to bind"})
    max_seqs: int = field(default=16, metadata={"help": "sequences held at once (KV slots)"})
    max_len: int = field(default=0, metadata={"help": "maximum tokens per sequence, prompt and output (0 = the "
                                                      "model's context: max_position_embeddings in its config)"})
    threads: int = field(default=0, metadata={"help": "torch threads (0 = torch's default)"})
    cpus: str = field(default="", metadata={"help": "CPU affinity, e.g. '0' or '0,1' (empty = any)"})
    log_level: str = field(default="INFO", metadata={"help": "logging level"})
    redis_url: str = field(default="", metadata={"help": "register in this Redis worker registry (empty = no)"})
    advertise_address: str = field(default="", metadata={"help": "data address routers should use "
                                                                  "(default: the bound one)"})
    tp_size: int = field(default=1, metadata={"help": "tensor-parallel ranks of this target (1 = off)"})
    kv_tokens: int = field(default=0, metadata={"help": "KV cache capacity in tokens, at least one full context "
                                                        "(0 = max_seqs * max_len, at most 32768 unless one context "
                                                        "needs more); sequences are preempted and recomputed when "
                                                        "it is full"})
    block_size: int = field(default=16, metadata={"help": "tokens per KV cache block (paging and prefix caching)"})
    device: str = field(default="cpu", metadata={"help": "where the model runs: cpu, cuda or cuda:N"})
    dtype: str = field(default=DEFAULT_DTYPES["target"], metadata={
        "help": "weights and KV cache: auto, float32, bfloat16 or float16 (auto: float32 for a target, whose exact "
                "identity with the target alone is tested in float32; bfloat16 for a draft where the device computes "
                "it natively, else float32)"})
    cuda_graphs: str = field(default="auto", metadata={"help": "replay decode, verify and branch steps as CUDA "
                                                               "graphs: auto (on CUDA), on or off"})
    metrics_address: str = field(default="", metadata={"help": "serve Prometheus /metrics on host:port "
                                                               "(empty = off)"})
    curve_secret_key_file: Path | None = field(default=None, metadata={
        "help": "this worker's CURVE key pair (NAME.key_secret from `ssd keys generate`): the data plane then "
                "admits only --curve-authorized-keys (default: no authentication)"})
    curve_authorized_keys: Path | None = field(default=None, metadata={
        "help": "the routers' CURVE public keys allowed to connect: a NAME.key file or a folder of them"})
    bound_file: Path | None = field(default=None, metadata={
        "help": "once bound, write the addresses actually bound (data, control, metrics) to this JSON file, "
                "atomically: how a worker started on port 0 reports its ports (default: none)"})


def setup_process(cfg: WorkerConfig, role: str) -> None:
    logging.basicConfig(level=cfg.log_level.upper(), format=f"%(asctime)s {role} %(levelname)s %(message)s")
    pin(cfg.cpus)
    if cfg.threads:
        import torch
        torch.set_num_threads(cfg.threads)


def serve(handler: Handler, endpoint: WorkerEndpoint, control: ControlServer, stop: threading.Event) -> None:
    """Run the compute loop until `stop` is set; errors in one batch are reported to its peers, not fatal."""
    control.set_serving(True)
    log.info("serving data plane on %s", endpoint.endpoint)
    while not stop.is_set():
        try:
            batch = [endpoint.inbox.get(timeout=0.05)]
        except queue.Empty:
            continue
        while True:
            try:
                batch.append(endpoint.inbox.get_nowait())
            except queue.Empty:
                break
        gone = [peer for peer, msg in batch if isinstance(msg, PeerGone)]
        if gone:
            batch = [(peer, msg) for peer, msg in batch if not isinstance(msg, PeerGone)]
            for peer in gone:
                log.info("freed %d sequences of the departed router %s", handler.forget_peer(peer), peer.hex())
            if not batch:
                continue
        try:
            handler.handle(batch)
        except Exception as e:  # a bug must not take the worker down for every other sequence
            log.exception("batch of %d messages failed", len(batch))
            for peer in {p for p, _ in batch}:
                endpoint.send(peer, wire.Error("internal", f"{type(e).__name__}: {e}", None))


def install_signal_handlers(stop: threading.Event) -> None:
    def on_signal(signum, _frame):
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def wait_drained(handler: Handler, grace: float) -> int:
    deadline = time.monotonic() + grace
    while handler.active_sequences() and time.monotonic() < deadline:
        time.sleep(0.05)
    return handler.active_sequences()


def load_plain(cfg: WorkerConfig, folder: Path, role: str = "target"):
    """The model of `folder` on --device in --dtype (`resolve_dtype` for `role`; one process, no tensor
    parallelism)."""
    from ssd.models.linear import packed
    from ssd.models.loader import load_model

    dtype = torch_dtype(cfg.dtype, cfg.device, role)
    log.info("%s weights in %s (--dtype %s) on %s", role, dtype, cfg.dtype, cfg.device)
    model = load_model(folder, dtype=dtype, device=cfg.device)
    mats = model.linear_weights()
    log.info("%s: %d of %d weight matrices packed for oneDNN (SSD_PACKED_WEIGHTS=0 turns packing off)", role,
             sum(packed(w) is not None for w in mats), len(mats))
    return model


def native_bf16(device: str) -> bool:
    """Whether `device` multiplies bfloat16 matrices in hardware: on CPU, AVX-512 BF16 or AMX as torch detects them
    (elsewhere bfloat16 is emulated: an AVX2 CPU ran bf16 ~20x slower than float32, docs/models.md); on CUDA,
    `torch.cuda.is_bf16_supported()`."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check is not None and check() for check in checks)


def resolve_dtype(dtype: str, device: str, role: str) -> str:
    """The dtype a worker of `role` loads for --dtype `dtype`: as given, except `auto`: float32 for the target (the
    reference every mode's output is identical to, tested in float32), and for a draft bfloat16 where the device
    computes it natively, else float32. A draft only proposes, so its dtype changes no output, only how often its
    tokens are accepted and how fast it runs: on the default pair's CPU (AVX-512 BF16) a bfloat16 draft's SSD round
    over 64 forks took 0.036 s against 0.062 s in float32, with the same hits and tokens per round."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if role == "draft" and native_bf16(device) else "float32"


def torch_dtype(dtype: str, device: str, role: str):
    """`resolve_dtype` as a torch dtype (what a worker of `role`, or a test or bench standing in for it, loads)."""
    import torch

    return getattr(torch, resolve_dtype(dtype, device, role))


def settings_problem(cfg: WorkerConfig, role: Role) -> str | None:
    """Why `cfg` cannot run as `role` (None when it can); checked before anything loads."""
    if cfg.tp_size < 1:
        return f"--tp-size must be at least 1, got {cfg.tp_size}"
    if role.check is not None:
        problem = role.check()
    else:
        problem = None if cfg.tp_size == 1 else (f"tensor parallelism (--tp-size {cfg.tp_size}) is not available "
                                                 f"for the {role.name}; run it with --tp-size 1")
    return problem or device_problem(cfg) or context_problem(cfg, role)


def context_problem(cfg: WorkerConfig, role: Role) -> str | None:
    """Why --max-len / --kv-tokens do not fit the model (None when they do), read from its config.json before
    anything loads: the context must be within the model's own, and the KV cache must hold one full context (a
    draft's: and one speculation of K)."""
    from ssd.config import ModelConfig

    try:
        model = ModelConfig.from_folder(role.folder)
    except (ValueError, OSError):
        return None   # loading reports the folder itself
    try:
        max_len = model.context_length(cfg.max_len, strict=True)
    except ValueError as e:
        return str(e)
    need = max_len + (role.k + 1 if role.k else 0)
    if 0 < cfg.kv_tokens < need:
        what = f" and a speculation of {role.k}" if role.k else ""
        return (f"a KV cache of {cfg.kv_tokens} tokens (--kv-tokens) cannot hold one full context of {max_len} "
                f"tokens (--max-len){what}; raise --kv-tokens to at least {need} or lower --max-len")
    return None


def run_worker(cfg: WorkerConfig, role: Role) -> int:
    """Serve one worker process: `role.load()` makes the role's worker, `role.handler(worker, endpoint)` its logic."""
    problem = settings_problem(cfg, role)
    if problem:
        log.error("%s", problem)
        return 2
    try:
        curve = server_keys(cfg.curve_secret_key_file, cfg.curve_authorized_keys)
    except ValueError as e:
        log.error("%s", e)
        return 2
    from ssd.tokenizer import Tokenizer

    name, folder, k, fanout = role.name, role.folder, role.k, list(role.fanout)
    stop = threading.Event()
    install_signal_handlers(stop)
    state: dict = {"handler": None}

    def info() -> dict:
        h = state["handler"]
        stats = kv_stats(state["worker"]) if "worker" in state else {}
        return {"role": name.upper(), "model_id": folder.name, "tokenizer_hash": state.get("fingerprint", ""),
                "vocab_size": state.get("vocab", 0), "max_len": state.get("max_len", cfg.max_len),
                "num_slots": cfg.max_seqs,
                "kv_capacity_tokens": state.get("kv_tokens", cfg.kv_tokens),
                "kv_capacity_bytes": state.get("kv_bytes", 0), "k": k, "fanout": fanout,
                "data_address": state.get("endpoint", cfg.data_address), "protocol_version": wire.PROTOCOL_VERSION,
                "state": "DRAINING" if stop.is_set() else "SERVING" if h else "LOADING",
                "active_sequences": h.active_sequences() if h else 0, "pid": os.getpid(),
                **{key: stats[key] for key in INFO_STATS if key in stats}}

    def on_drain(grace: int) -> int:
        left = wait_drained(state["handler"], grace) if state["handler"] else 0
        stop.set()
        return left

    control = ControlServer(cfg.control_address, info, on_drain)
    control_port = control.start()
    try:
        loaded = role.load()
    except ValueError as e:   # settings the model cannot run (its context, the KV budget) or a bad model folder
        log.error("the %s cannot start: %s", name, e)
        control.stop(0)
        return 2
    model, worker = loaded.model, loaded.worker
    tok = Tokenizer.from_folder(folder)
    state["worker"] = worker
    metrics = serve_metrics(cfg.metrics_address, name, worker) if cfg.metrics_address else None
    state.update(fingerprint=tok.fingerprint, vocab=model.cfg.vocab_size, kv_bytes=worker.cache.nbytes(),
                 kv_tokens=worker.cache.capacity_tokens, max_len=worker.max_len)

    def ready() -> wire.Ready:
        return wire.Ready(name, folder.name, tok.fingerprint, model.cfg.vocab_size, worker.max_len, k, fanout,
                          loaded.feature_size)

    endpoint = WorkerEndpoint(cfg.data_address, ready, name, curve)
    state["endpoint"] = endpoint.start()
    write_bound_file(cfg.bound_file, {
        "role": name, "data_address": state["endpoint"],
        "control_address": bound_host_port(cfg.control_address, control_port),
        "metrics_address": bound_host_port(cfg.metrics_address, metrics.server_port) if metrics else ""})
    state["handler"] = handler = role.handler(worker, endpoint)
    registration = None
    if cfg.redis_url:
        from ssd.discovery import RedisRegistry

        registration = RedisRegistry(cfg.redis_url).register(name, cfg.advertise_address or state["endpoint"])
    try:
        serve(handler, endpoint, control, stop)
    finally:
        if registration is not None:
            registration.close()
        control.set_serving(False)
        endpoint.stop()
        control.stop(0)
        if metrics is not None:
            metrics.shutdown()
        if loaded.close is not None:
            loaded.close()
    return 0


DTYPES = ("float32", "bfloat16", "float16")


def device_problem(cfg: WorkerConfig) -> str | None:
    """Why --device / --dtype / --cuda-graphs cannot run (None when they can); checked before anything loads."""
    import torch

    if cfg.dtype not in DTYPES + ("auto",):
        return f"--dtype must be auto or one of {', '.join(DTYPES)}, got {cfg.dtype!r}"
    if cfg.cuda_graphs not in ("auto", "on", "off"):
        return f"--cuda-graphs must be auto, on or off, got {cfg.cuda_graphs!r}"
    try:
        device = torch.device(cfg.device)
    except (RuntimeError, ValueError):
        return f"--device must be cpu, cuda or cuda:N, got {cfg.device!r}"
    if device.type not in ("cpu", "cuda"):
        return f"--device must be cpu, cuda or cuda:N, got {cfg.device!r}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return f"--device {cfg.device}: no CUDA device is visible to this process"
        if device.index is not None and device.index >= torch.cuda.device_count():
            return f"--device {cfg.device}: only {torch.cuda.device_count()} CUDA device(s) are visible"
        if cfg.tp_size > 1:
            return "--tp-size > 1 runs its ranks on the CPU in this version; use --device cpu"
    elif cfg.cuda_graphs == "on":
        return "--cuda-graphs on needs --device cuda"
    return None
