"""The router service: the client-facing gRPC `ssd.v1.Generation` API over the router's engine loop.

The servicer is thin: request -> (prompt tokens, SamplingParams) -> `RouterCore.submit` -> stream the events
of that request back as `GenerateResponse`s. Invalid requests raise ValueError, which the server's one error
interceptor turns into INVALID_ARGUMENT with the message. A cancelled stream aborts the request everywhere.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ssd.control import ControlServer
from ssd.params import FinishReason, SamplingParams
from ssd.pb import generation_pb2 as pb
from ssd.pb import generation_pb2_grpc as pb_grpc
from ssd.tokenizer import Tokenizer
from services.router.core import CoreConfig, RouterCore, StartupError

log = logging.getLogger("ssd.router")

FINISH = {FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.EOS: pb.FINISH_REASON_EOS,
          FinishReason.LENGTH: pb.FINISH_REASON_LENGTH, FinishReason.ABORT: pb.FINISH_REASON_ABORT}


@dataclass(slots=True)
class RouterConfig:
    """Settings of the router."""
    grpc_address: str = field(default="127.0.0.1:50051", metadata={"help": "client gRPC address to bind"})
    target: str = field(default="tcp://127.0.0.1:5601", metadata={"help": "the target's data-plane address"})
    drafts: tuple[str, ...] = field(default=("tcp://127.0.0.1:5602",),
                                    metadata={"help": "draft data-plane addresses, comma-separated"})
    model: Path | None = field(default=None, metadata={"help": "model folder with the tokenizer (default: embedded)"})
    models_dir: Path | None = field(default=None, metadata={"help": "folder of prepared models"})
    mode: str = field(default="ssd", metadata={"help": "ar, sd or ssd"})
    backup: str = field(default="jit", metadata={"help": "ssd miss policy: jit, ngram, none or auto"})
    max_batch: int = field(default=16, metadata={"help": "sequences generating at once"})
    max_tokens_default: int = field(default=256, metadata={"help": "max_tokens when a request sets none"})
    max_tokens_limit: int = field(default=2048, metadata={"help": "largest max_tokens a request may ask for"})
    draft_top_k: int = field(default=32, metadata={"help": "sampling: support size of the draft's proposals"})
    saguaro_c: float = field(default=1.0, metadata={"help": "Saguaro reshaping factor C (1 = off)"})
    ready_timeout: float = field(default=180.0, metadata={"help": "seconds to wait for the workers at start"})
    log_level: str = field(default="INFO", metadata={"help": "logging level"})


class GenerationServicer(pb_grpc.GenerationServicer):
    def __init__(self, core: RouterCore, tok: Tokenizer, cfg: RouterConfig, model_id: str):
        self.core, self.tok, self.cfg, self.model_id = core, tok, cfg, model_id

    def _prompt(self, request) -> list[int]:
        which = request.WhichOneof("prompt")
        if which == "text":
            ids = self.tok.encode(request.text)
        elif which == "token_ids":
            ids = list(request.token_ids.ids)
        elif which == "chat":
            msgs = [{"role": m.role, "content": m.content} for m in request.chat.messages]
            ids = self.tok.encode(self.tok.apply_chat_template(msgs))
        else:
            raise ValueError("prompt: set one of text, token_ids or chat")
        if not ids:
            raise ValueError("prompt: must not be empty")
        vocab = self.core.target.ready.vocab_size
        if max(ids) >= vocab:
            raise ValueError(f"prompt: token ids must lie in [0, {vocab})")
        if len(ids) >= self.core.max_len:
            raise ValueError(f"prompt: {len(ids)} tokens; the maximum length is {self.core.max_len}")
        return ids

    def _params(self, request) -> SamplingParams:
        s = request.sampling
        max_tokens = request.max_tokens or self.cfg.max_tokens_default
        if max_tokens > self.cfg.max_tokens_limit:
            raise ValueError(f"max_tokens: {max_tokens} is above the limit {self.cfg.max_tokens_limit}")
        return SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p or 1.0, min_p=s.min_p,
                              seed=s.seed if s.HasField("seed") else None, max_tokens=max_tokens,
                              stop_token_ids=tuple(request.stop_token_ids), ignore_eos=request.ignore_eos)

    def Generate(self, request, context):
        if self.core.max_len == 0:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the router is waiting for its workers; retry shortly")
        prompt, params = self._prompt(request), self._params(request)
        rid = request.request_id or uuid.uuid4().hex
        req = self.core.submit(rid, prompt, params, request.mode)
        context.add_callback(lambda: self.core.abort(req))
        detok = self.tok.detokenizer(skip_special_tokens=True)
        while True:
            kind, payload = req.events.get()
            if kind == "tokens":
                text = "".join(detok.push(t) for t in payload)
                yield pb.GenerateResponse(request_id=rid, token_ids=payload, text=text)
            elif kind == "done":
                yield self._final(req, rid, detok.flush(), payload)
                return
            else:
                context.abort(grpc.StatusCode.UNAVAILABLE, payload)

    def _final(self, req, rid, text, reason):
        st, now = req.stats, time.monotonic()
        stats = pb.SpeculationStats(rounds=st.rounds, tokens_per_round=st.tokens_per_round,
                                    acceptance_per_position=st.acceptance_per_position,
                                    cache_hits=st.cache.get("hit", 0),
                                    cache_misses=sum(v for k, v in st.cache.items() if k != "hit"),
                                    mode=req.mode)
        ttft = (req.first_token_at or now) - req.arrival
        return pb.GenerateResponse(request_id=rid, text=text, finish_reason=FINISH[reason],
                                   usage=pb.Usage(prompt_tokens=len(req.prompt), completion_tokens=len(req.output)),
                                   stats=stats, time_to_first_token_s=ttft, total_time_s=now - req.arrival)

    def GetModelInfo(self, request, context):
        t = self.core.target.ready
        d = self.core.drafts[0].ready if self.core.drafts and self.core.drafts[0].ready else None
        return pb.ModelInfo(model_id=t.model_id, draft_model_id=d.model_id if d else "",
                            tokenizer_hash=t.tokenizer_hash, vocab_size=t.vocab_size, max_len=self.core.max_len,
                            max_tokens_limit=self.cfg.max_tokens_limit, mode=self.cfg.mode, k=self.core.k,
                            fanout=list(d.fanout) if d else [])

    def GetServerInfo(self, request, context):
        core = self.core
        return pb.ServerInfo(active_requests=len(core.active), queued_requests=len(core.waiting),
                             targets=[core.target.address], drafts=[d.address for d in core.drafts if d.alive],
                             finished_requests=core.finished)


def run(cfg: RouterConfig) -> int:
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s router %(levelname)s %(message)s")
    from ssd.paths import target_dir

    folder = cfg.model or target_dir(cfg.models_dir)
    tok = Tokenizer.from_folder(folder)
    core = RouterCore(CoreConfig(cfg.mode, cfg.backup, cfg.max_batch, cfg.draft_top_k, cfg.saguaro_c,
                                 cfg.ready_timeout), cfg.target, list(cfg.drafts), tok.fingerprint, tok.eos_token_ids)
    servicer = GenerationServicer(core, tok, cfg, folder.name)
    server = ControlServer(cfg.grpc_address, None, None,
                           extra=[(pb_grpc.add_GenerationServicer_to_server, servicer, "ssd.v1.Generation")],
                           max_workers=2 * cfg.max_batch + 8)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    port = server.start()  # NOT_SERVING until the workers are ready
    try:
        core.handshake()
    except StartupError as e:
        log.error("%s", e)
        server.stop(0)
        return 2
    loop = threading.Thread(target=core.run, name="router-loop", daemon=True)
    loop.start()
    server.set_serving(True)
    log.info("serving ssd.v1.Generation on port %d (mode %s)", port, cfg.mode)
    while not stop.is_set() and loop.is_alive():
        stop.wait(0.2)
    server.set_serving(False)
    core.stop()
    loop.join(timeout=5)
    server.stop(1)
    return 0
