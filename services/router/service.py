"""The router service's process: its settings (`RouterConfig`) and `run`, which builds the round core's shell
(`RouterLoop`), the front end, the gRPC servicer (`servicer.py`) and the OpenAI HTTP server (`http.py`), serves
them, and drains on SIGTERM.

`run` binds gRPC and HTTP first (either may be port 0), reports what it bound (`--bound-file`), then waits for
its workers (health NOT_SERVING, HTTP /health 503 meanwhile) and serves.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from services.router.auth import ApiKeyError, ApiKeys
from services.router.frontend import Frontend, Limits
from services.router.journal import JournalError, RequestJournal
from services.router.loop import RouterLoop, StartupError
from services.router.metrics import RouterMetrics
from services.router.servicer import ApiKeyInterceptor, GenerationServicer
from ssd.control import ControlServer
from ssd.cpus import pin
from ssd.curve import client_keys
from ssd.pb import generation_pb2_grpc as pb_grpc
from ssd.round import CoreConfig
from ssd.service_config import bound_host_port, write_bound_file
from ssd.tokenizer import Tokenizer

log = logging.getLogger("ssd.router")


@dataclass(slots=True)
class RouterConfig:
    """Settings of the router."""
    grpc_address: str = field(default="127.0.0.1:50051", metadata={"help": "client gRPC address to bind"})
    http_address: str = field(default="127.0.0.1:8000",
                              metadata={"help": "OpenAI-compatible HTTP address to bind (empty = off)"})
    targets: tuple[str, ...] = field(default=("tcp://127.0.0.1:5601",),
                                     metadata={"help": "target data-plane addresses, comma-separated"})
    drafts: tuple[str, ...] = field(default=("tcp://127.0.0.1:5602",),
                                    metadata={"help": "draft data-plane addresses, comma-separated"})
    model: Path | None = field(default=None, metadata={"help": "model folder with the tokenizer (default: embedded)"})
    models_dir: Path | None = field(default=None, metadata={"help": "folder of prepared models"})
    discovery: str = field(default="static",
                           metadata={"help": "how workers are found: static (targets/drafts), redis, kubernetes"})
    redis_url: str = field(default="", metadata={"help": "Redis URL for the worker registry (discovery=redis)"})
    k8s_namespace: str = field(default="default", metadata={"help": "namespace of the worker Services"})
    k8s_target_service: str = field(default="ssd-target", metadata={"help": "headless Service of the targets"})
    k8s_draft_service: str = field(default="ssd-draft", metadata={"help": "headless Service of the drafts"})
    k8s_target_port: int = field(default=5601, metadata={"help": "targets' data-plane port"})
    k8s_draft_port: int = field(default=5602, metadata={"help": "drafts' data-plane port"})
    mode: str = field(default="ssd", metadata={"help": "ar, sd or ssd"})
    backup: str = field(default="jit", metadata={"help": "ssd miss policy: jit, ngram, none or auto"})
    max_batch: int = field(default=16, metadata={"help": "sequences generating at once"})
    max_tokens_default: int = field(default=0, metadata={
        "help": "max_tokens when a request sets none (0 = the rest of the context: its length minus the prompt)"})
    max_tokens_limit: int = field(default=0, metadata={
        "help": "largest max_tokens a request may ask for (0 = no limit but the rest of the context)"})
    draft_top_k: int = field(default=32, metadata={"help": "sampling: support size of the draft's proposals"})
    saguaro_c: float = field(default=1.0, metadata={"help": "Saguaro reshaping factor C (1 = off)"})
    adaptive: bool = field(default=True, metadata={
        "help": "choose K per round from measured acceptance and round times, down to 0 (speculation off) where "
                "it does not pay; a request's speculation.k pins its K (false = always the draft's K)"})
    probe_every: int = field(default=16, metadata={
        "help": "adaptive: with speculation off, one round in this many speculates to re-measure acceptance"})
    adaptive_fanout: bool = field(default=True, metadata={
        "help": "send each draft a fan-out adjusted online: split by measured acceptance and miss rates, total cut "
                "while its entries arrive late (false = the draft's own fan-out)"})
    verify_inflight: int = field(default=1, metadata={
        "help": "verify batches out to one target at a time: sequences that become ready meanwhile wait and go "
                "together in the next one (0 = send each at once)"})
    jit_linger: float = field(default=0.05, metadata={
        "help": "seconds a free target waits, at most, for JITs of its sequences so they verify with the ones "
                "ready (about one JIT round trip, measured; 0 = never wait)"})
    ready_timeout: float = field(default=180.0, metadata={"help": "seconds to wait for the workers at start"})
    state_redis_url: str = field(default="", metadata={
        "help": "Redis URL of the request-state journal: streams survive a router failure and several routers "
                "can serve behind one Service (empty = off)"})
    state_ttl: int = field(default=3600, metadata={"help": "seconds a request's state is kept after its last write"})
    state_retry: float = field(default=5.0, metadata={
        "help": "seconds a request-state write is retried while Redis is unreachable before the stream fails"})
    router_id: str = field(default="", metadata={"help": "this router's name in the journal (default host:pid)"})
    api_keys_file: Path | None = field(default=None, metadata={
        "help": "file of API keys, one per line (a mounted Secret; re-read when it changes): clients must send "
                "`authorization: Bearer <key>` (default: no keys needed)"})
    tls_cert_file: Path | None = field(default=None, metadata={
        "help": "PEM certificate chain: serve gRPC and HTTP over TLS (with --tls-key-file)"})
    tls_key_file: Path | None = field(default=None, metadata={"help": "PEM private key of --tls-cert-file"})
    drain_timeout: float = field(default=30.0, metadata={
        "help": "on SIGTERM: seconds running requests get to finish before the rest end with UNAVAILABLE"})
    log_level: str = field(default="INFO", metadata={"help": "logging level"})
    curve_secret_key_file: Path | None = field(default=None, metadata={
        "help": "this router's CURVE key pair (NAME.key_secret from `ssd keys generate`) for the data plane "
                "(default: no authentication)"})
    curve_worker_key: Path | None = field(default=None, metadata={
        "help": "the CURVE public key (NAME.key) the workers serve with"})
    cpus: str = field(default="", metadata={
        "help": "CPU affinity of the router's threads, e.g. '1' (empty = any); beside pinned workers keep it off "
                "the target's CPUs (`ssd up --pin` puts it with the drafts)"})
    bound_file: Path | None = field(default=None, metadata={
        "help": "once bound, write the addresses actually bound (gRPC, HTTP) to this JSON file, atomically: how "
                "a router started on port 0 reports its ports (default: none)"})


def tls_files(cfg: RouterConfig) -> tuple[bytes, bytes] | None:
    """(certificate chain, private key) PEM bytes when TLS is configured; ValueError naming what is wrong."""
    if not cfg.tls_cert_file and not cfg.tls_key_file:
        return None
    if not (cfg.tls_cert_file and cfg.tls_key_file):
        raise ValueError("TLS needs both --tls-cert-file and --tls-key-file")
    try:
        return Path(cfg.tls_cert_file).read_bytes(), Path(cfg.tls_key_file).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read a TLS file: {e}") from e


def make_discovery(cfg: RouterConfig):
    """None for static addresses; otherwise the Redis registry or the Kubernetes EndpointSlice watch."""
    from ssd import discovery

    if cfg.discovery == "static":
        return None
    if cfg.discovery == "redis":
        if not cfg.redis_url:
            raise ValueError("discovery=redis needs --redis-url")
        return discovery.RedisRegistry(cfg.redis_url)
    if cfg.discovery == "kubernetes":
        return discovery.KubernetesDiscovery(cfg.k8s_namespace, cfg.k8s_target_service, cfg.k8s_draft_service,
                                             cfg.k8s_target_port, draft_port=cfg.k8s_draft_port)
    raise ValueError(f"discovery must be static, redis or kubernetes, got {cfg.discovery!r}")


def run(cfg: RouterConfig) -> int:
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s router %(levelname)s %(message)s")
    pin(cfg.cpus)
    from ssd.paths import target_dir

    folder = cfg.model or target_dir(cfg.models_dir)
    tok = Tokenizer.from_folder(folder)
    try:
        discovery = make_discovery(cfg)
        curve = client_keys(cfg.curve_secret_key_file, cfg.curve_worker_key)
    except Exception as e:  # DiscoveryError, a missing in-cluster config, or a CURVE key file
        log.error("%s", e)
        return 2
    journal = None
    if cfg.state_redis_url:
        import os
        import socket

        owner = cfg.router_id or f"{socket.gethostname()}:{os.getpid()}"
        journal = RequestJournal(cfg.state_redis_url, owner, ttl_s=cfg.state_ttl, retry_s=cfg.state_retry)
        try:
            journal.check()
        except JournalError as e:
            log.error("%s", e)
            return 2
        log.info("request state in Redis at %s (router %s)", journal.url, owner)
    try:
        keys = ApiKeys(cfg.api_keys_file) if cfg.api_keys_file else None
        tls = tls_files(cfg)
    except (ApiKeyError, ValueError) as e:
        log.error("%s", e)
        return 2
    static = (list(cfg.targets), list(cfg.drafts)) if discovery is None else ([], [])
    metrics = RouterMetrics(model_name=folder.name)
    try:
        loop = RouterLoop(CoreConfig(cfg.mode, cfg.backup, cfg.max_batch, cfg.draft_top_k, cfg.saguaro_c,
                                     cfg.ready_timeout, cfg.adaptive, cfg.probe_every,
                                     verify_inflight=cfg.verify_inflight, jit_linger=cfg.jit_linger,
                                     adaptive_fanout=cfg.adaptive_fanout),
                          *static, tok.fingerprint, tok.eos_token_ids, metrics, discovery=discovery,
                          curve=curve)
    except ValueError as e:   # a setting out of range: say which, exit 2 like any other bad flag
        log.error("%s", e)
        return 2
    frontend = Frontend(loop.round, tok, Limits(cfg.max_tokens_default, cfg.max_tokens_limit))
    servicer = GenerationServicer(frontend, cfg, journal)
    server = ControlServer(cfg.grpc_address, None, None,
                           extra=[(pb_grpc.add_GenerationServicer_to_server, servicer, "ssd.v1.Generation")],
                           max_workers=2 * cfg.max_batch + 8,
                           interceptors=(ApiKeyInterceptor(keys),) if keys is not None else (),
                           credentials=grpc.ssl_server_credentials([(tls[1], tls[0])]) if tls else None)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    port = server.start()  # NOT_SERVING until the workers are ready
    http = None
    if cfg.http_address:  # bound before the handshake, so it can be reported; 503 until the workers are ready
        from services.router.http import HttpServer

        host, _, http_port = cfg.http_address.rpartition(":")
        http = HttpServer(frontend, folder.name, metrics.render, host=host, port=int(http_port), api_keys=keys,
                          tls=(cfg.tls_cert_file, cfg.tls_key_file) if tls else None)
        log.info("serving the OpenAI-compatible HTTP API on port %d", http.start())
    write_bound_file(cfg.bound_file, {"grpc_address": bound_host_port(cfg.grpc_address, port),
                                      "http_address": bound_host_port(cfg.http_address, http.port) if http else ""})
    try:
        loop.handshake()
    except (StartupError, RuntimeError) as e:
        log.error("%s", e)
        if http is not None:
            http.stop()
        server.stop(0)
        return 2
    thread = threading.Thread(target=loop.run, name="router-loop", daemon=True)
    thread.start()
    server.set_serving(True)
    log.info("serving ssd.v1.Generation on port %d (mode %s%s%s)", port, cfg.mode, ", TLS" if tls else "",
             f", {len(keys)} API keys" if keys is not None else "")
    while not stop.is_set() and thread.is_alive():
        stop.wait(0.2)
    drain(server, frontend, cfg.drain_timeout)
    if http is not None:
        http.stop()
    loop.stop()
    thread.join(timeout=5)
    server.stop(1)
    return 0


def drain(server: ControlServer, frontend: Frontend, timeout: float) -> None:
    """Graceful drain: health NOT_SERVING, no new requests (UNAVAILABLE / 503, which clients retry elsewhere),
    running ones get `timeout` seconds to finish; whatever is left then ends with UNAVAILABLE when the loop
    stops (the SDK resumes it on another router where request state is on)."""
    server.set_serving(False)
    frontend.draining = True
    core = frontend.core
    deadline = time.monotonic() + timeout
    busy = len(core.active) + len(core.waiting)
    log.info("draining: %d requests running or queued, up to %.0f s", busy, timeout)
    while (core.active or core.waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = len(core.active) + len(core.waiting)
    if left:
        log.warning("drain timeout: ending %d requests with UNAVAILABLE", left)
