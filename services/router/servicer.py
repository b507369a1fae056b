"""The router's gRPC `ssd.v1.Generation` servicer, over the round core's front end.

The servicer is thin: request -> (prompt tokens, SamplingParams) -> `RoundCore.submit` -> stream the events
of that request back as `GenerateResponse`s. Invalid requests raise ValueError, which the server's one error
interceptor turns into INVALID_ARGUMENT with the message. A cancelled stream aborts the request everywhere.
With request state on, a request is journaled before it runs and its tokens before the client gets them
(write-ahead), and a `resume_from` request claims the journaled one (see docs/architecture.md, "Request
state"). A request for several choices (`n`, `best_of`: `services/router/choices.py`) streams each response with
its choice's `index`, each choice ending with its own last response; it is not journaled, and cannot be resumed.
`ApiKeyInterceptor` refuses Generation calls without a valid API key.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc

from services.router import choices
from services.router.auth import ApiKeys
from services.router.frontend import Delta, Frontend
from services.router.journal import Fenced, JournalUnavailable, RequestJournal, fingerprint
from ssd.constraints import Constraint
from ssd.params import FinishReason
from ssd.pb import generation_pb2 as pb
from ssd.pb import generation_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from services.router.service import RouterConfig

log = logging.getLogger("ssd.router")

FINISH = {FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.EOS: pb.FINISH_REASON_EOS,
          FinishReason.LENGTH: pb.FINISH_REASON_LENGTH, FinishReason.ABORT: pb.FINISH_REASON_ABORT,
          FinishReason.STOP_STRING: pb.FINISH_REASON_STOP_STRING, FinishReason.TIME_LIMIT: pb.FINISH_REASON_TIME_LIMIT,
          FinishReason.ERROR: pb.FINISH_REASON_ERROR}
DEADLINE_MARGIN_S = 0.1  # end a request this long before its gRPC deadline, so the client still sees TIME_LIMIT


def request_fields(request) -> dict:
    """GenerateRequest -> Frontend.build keyword arguments."""
    which = request.WhichOneof("prompt")
    prompt = {"text": {"text": request.text}, "token_ids": {"token_ids": list(request.token_ids.ids)},
              "chat": {"messages": [{"role": m.role, "content": m.content} for m in request.chat.messages]},
              None: {}}[which]
    s, spec = request.sampling, request.speculation
    return dict(**prompt, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p or 1.0, min_p=s.min_p,
                seed=s.seed if s.HasField("seed") else None, seed_stream=s.seed_stream,
                max_tokens=request.max_tokens or None,
                stop=list(request.stop), stop_token_ids=list(request.stop_token_ids), ignore_eos=request.ignore_eos,
                presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                repetition_penalty=s.repetition_penalty or 1.0, logit_bias=dict(s.logit_bias),
                min_tokens=request.min_tokens, logprobs=request.logprobs if request.HasField("logprobs") else None,
                mode="ar" if spec.off else spec.mode, k=spec.k, request_id=request.request_id, n=request.n or 1,
                best_of=request.best_of or None, constraint=constraint(request),
                prompt_logprobs=request.prompt_logprobs if request.HasField("prompt_logprobs") else None)


def constraint(request) -> Constraint | None:
    """GenerateRequest.constraint, compiled (ValueError naming the field when it is bad)."""
    if not request.HasField("constraint"):
        return None
    try:
        found = Constraint(request.constraint.kind, request.constraint.text)
        found.validate()
    except ValueError as err:
        raise ValueError(f"constraint: {err}") from None
    return found


def logprobs_pb(logprobs) -> list[pb.TokenLogprob]:
    return [pb.TokenLogprob(token_id=lp.token, logprob=lp.logprob, rank=lp.rank,
                            top=[pb.TopLogprob(token_id=t, logprob=v) for t, v in lp.top]) for lp in logprobs or ()]


def stats_pb(st, mode: str) -> pb.SpeculationStats:
    return pb.SpeculationStats(rounds=st.rounds, tokens_per_round=st.tokens_per_round,
                               acceptance_per_position=st.acceptance_per_position, cache_hits=st.served,
                               cache_misses=st.backed_up, mode=mode)


def request_fingerprint(request) -> str:
    """What must match between a request and its resumption: everything but request_id and resume_from."""
    copy = pb.GenerateRequest()
    copy.CopyFrom(request)
    copy.ClearField("request_id")
    copy.ClearField("resume_from")
    return fingerprint(copy.SerializeToString(deterministic=True))


# Finish reasons after which a journaled stream is over; after the others (an error, a dropped client) it can
# still be resumed.
FINAL = frozenset({FinishReason.STOP, FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP_STRING,
                   FinishReason.ABORT, FinishReason.TIME_LIMIT})


class ApiKeyInterceptor(grpc.ServerInterceptor):
    """Refuses every ssd.v1.Generation call without a valid API key (UNAUTHENTICATED); health and reflection
    stay open for probes."""

    def __init__(self, keys: ApiKeys):
        self.keys = keys

    def intercept_service(self, continuation, handler_call_details):
        if not handler_call_details.method.startswith("/ssd.v1.Generation/"):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        if self.keys.valid(metadata.get("authorization")):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)

        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "a valid API key is needed: send metadata `authorization: Bearer <key>`")

        if handler is not None and handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(refuse, handler.request_deserializer,
                                                        handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(refuse, handler.request_deserializer if handler else None,
                                                   handler.response_serializer if handler else None)


class GenerationServicer(pb_grpc.GenerationServicer):
    def __init__(self, frontend: Frontend, cfg: RouterConfig, journal: RequestJournal | None = None):
        self.frontend, self.core, self.cfg, self.journal = frontend, frontend.core, cfg, journal

    def _start(self, request, context, timeout: float | None):
        """The request to run: a resumed one from the journal, or a new one (journaled when state is on)."""
        j = self.journal
        if (request.n > 1 or request.best_of > 1) and request.resume_from > 0:
            raise ValueError("resume_from: a request of several choices (n or best_of > 1) cannot be resumed")
        if request.HasField("resume_from"):
            rid = request.request_id
            if not rid:
                raise ValueError("request_id: a resumed request needs the request_id of the stream")
            if j is None and request.resume_from > 0:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"this router keeps no request state (--state-redis-url), so request {rid!r} cannot "
                              f"be resumed")
            record = j.claim(rid) if j is not None else None
            if record is None and request.resume_from > 0:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no request state for request_id {rid!r}: it finished "
                              f"long ago, expired, or the state store lost it")
            if record is not None:
                if record.fingerprint != request_fingerprint(request):
                    raise ValueError(f"resume_from: the request differs from the journaled request {rid!r}")
                if request.resume_from > len(record.tokens):
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"resume_from: {request.resume_from} tokens received but the journal of {rid!r} "
                                  f"holds {len(record.tokens)}: the state store lost data")
                log.info("resuming %s after %d tokens (%d journaled, epoch %d)", rid, request.resume_from,
                         len(record.tokens), record.epoch)
                return self.frontend.resumed(record, request.resume_from, timeout)
        g = self.frontend.build(**request_fields(request), timeout_s=timeout)
        if j is not None and g.best_of == 1:
            g.epoch = j.begin(g.request_id, g.prompt, Frontend.journal_params(g), request_fingerprint(request))
        return g

    def Generate(self, request, context):
        if self.core.max_len == 0:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the router is waiting for its workers; retry shortly")
        if self.frontend.draining:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the router is draining (shutting down); retry on another")
        remaining = context.time_remaining()
        timeout = None if remaining is None or remaining > 1e9 else max(0.0, remaining - DEADLINE_MARGIN_S)
        try:
            g = self._start(request, context, timeout)
        except JournalUnavailable as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        running = []

        def on_start(req):
            running.append(req)
            if not context.add_callback(lambda: self.core.abort(req)):   # the call ended already
                self.core.abort(req)

        j = self.journal if g.epoch else None
        for index, item in choices.stream(self.frontend, g, on_start):
            if isinstance(item, Delta):
                if j is not None and item.token_ids and not item.journaled:
                    try:  # write-ahead: the journal has every token before the client does
                        j.append(g.request_id, g.epoch, item.token_ids, item.logprobs)
                    except (Fenced, JournalUnavailable) as e:
                        for req in running:
                            self.core.abort(req)
                        context.abort(grpc.StatusCode.ABORTED if isinstance(e, Fenced) else
                                      grpc.StatusCode.UNAVAILABLE, str(e))
                yield pb.GenerateResponse(request_id=g.request_id, token_ids=item.token_ids, text=item.text,
                                          logprobs=logprobs_pb(item.logprobs), index=index,
                                          prompt_logprobs=logprobs_pb((item.prompt_logprobs or [None])[1:]))
                continue
            if item.error is not None:
                context.abort(grpc.StatusCode.UNAVAILABLE, item.error)
            if j is not None and item.reason in FINAL and context.is_active():
                try:
                    j.finish(g.request_id, g.epoch, item.reason.value)
                except (Fenced, JournalUnavailable) as e:
                    log.warning("request %s: its finish was not journaled: %s", g.request_id, e)
            yield pb.GenerateResponse(
                request_id=g.request_id, text=item.text, finish_reason=FINISH[item.reason],
                usage=pb.Usage(prompt_tokens=item.prompt_tokens, completion_tokens=item.completion_tokens),
                stats=stats_pb(item.stats, item.mode), time_to_first_token_s=item.ttft_s, total_time_s=item.total_s,
                index=index)

    def Abort(self, request, context):
        return pb.AbortResponse(found=self.frontend.abort_id(request.request_id))

    def GetModelInfo(self, request, context):
        t = self.core.pool.target.ready if self.core.pool.target is not None else None
        if t is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the router is waiting for its workers; retry shortly")
        d = self.core.pool.drafts[0].ready if self.core.pool.drafts and self.core.pool.drafts[0].ready else None
        return pb.ModelInfo(model_id=t.model_id, draft_model_id=d.model_id if d else "",
                            tokenizer_hash=t.tokenizer_hash, vocab_size=t.vocab_size, max_len=self.core.max_len,
                            max_tokens_limit=self.frontend.limits.max_tokens_limit or self.core.max_len - 1, mode=self.cfg.mode, k=self.core.k,
                            fanout=list(d.fanout) if d else [])

    def GetServerInfo(self, request, context):
        core = self.core
        st, t = core.stats, core.times
        totals = pb.RouterTotals(rounds=st.rounds, round_tokens=st.tokens, accepted=st.accepted, offered=st.offered,
                                 reached=st.reached, cache=dict(st.cache), backups=dict(st.backups),
                                 waits=dict(st.waits),
                                 verify_batches=t.verify_batches, target_verify_s=t.target_verify_s,
                                 verify_roundtrip_s=t.verify_roundtrip_s, draft_rounds=t.draft_rounds,
                                 draft_round_s=t.draft_round_s, jit_batches=t.jit_batches, jit_s=t.jit_s,
                                 wait_s=t.wait_s)
        return pb.ServerInfo(active_requests=len(core.active), queued_requests=len(core.waiting),
                             targets=[t.address for t in core.pool.targets if t.alive],
                             drafts=[d.address for d in core.pool.drafts if d.alive],
                             finished_requests=core.finished, totals=totals)
