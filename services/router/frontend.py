"""What every client API of the router shares (gRPC and OpenAI HTTP): validation, limits, text, stop strings.

`Frontend.build` turns API fields into a validated `GenerationRequest` or raises ValueError("field: what is
wrong"). `stream` / `astream` run it through the engine loop and yield `Delta`s (token ids, the text they add
and, when asked, their logprobs) and one final `Final`. Stop strings are matched on the detokenized text, across token boundaries: text
that could still be the start of a stop string is held back, so no part of a stop string is ever emitted; on a
match the request is aborted in the engine (its KV freed everywhere) and ends with STOP_STRING. A request for
several choices (`n`, `best_of`) runs through `services.router.choices`, one sequence per choice; `abort_id` ends
all of them.
"""
from __future__ import annotations

import asyncio
import dataclasses
import re
import time
import uuid
from dataclasses import dataclass, field

from ssd.constraints import Constraint
from ssd.params import FinishReason, SamplingParams, TokenLogprob, finish_reason
from ssd.engine.stats import SpecStats
from ssd.tokenizer import Tokenizer
from ssd.round import RoundCore

MAX_CHOICES = 16   # the largest n and best_of of one request


ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


@dataclass(slots=True)
class Limits:
    max_tokens_default: int = 0      # max_tokens when a request sets none (0 = the rest of the context)
    max_tokens_limit: int = 0        # the largest max_tokens (0 = only the context bounds it)
    max_stop_strings: int = 16
    max_stop_chars: int = 256
    max_messages: int = 256
    max_prompt_chars: int = 1_000_000   # raw text, or all chat messages' contents together
    max_stop_token_ids: int = 64
    max_request_id_chars: int = 256
    max_logit_bias: int = 1024       # token ids one request may bias


@dataclass(slots=True)
class GenerationRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    stop: tuple[str, ...] = ()
    mode: str = ""
    k: int = 0
    deadline: float | None = None
    resumed: list[int] = field(default_factory=list)  # committed tokens from the journal (a resumed request)
    skip: int = 0                                      # how many of them the client already has
    finished: FinishReason | None = None               # the journal's finish reason, if it has one
    epoch: int = 0                                     # the journal epoch this router holds (0: no journal)
    n: int = 1                                         # choices to return
    best_of: int = 1                                   # candidates to run (>= n): the best n are returned
    resumed_logprobs: list[TokenLogprob] = field(default_factory=list)   # the journal's, one per resumed token


@dataclass(slots=True)
class Delta:
    token_ids: list[int]
    text: str
    journaled: bool = False  # already in the request journal (the replayed part of a resumed stream)
    logprobs: list[TokenLogprob] | None = None   # one per token id, when the request asked (replayed: the journal's)
    # in a request's first delta, when it asked: None for the first prompt token, then a TokenLogprob per prompt token
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass(slots=True)
class Final:
    reason: FinishReason
    text: str                      # text not yet emitted (the held-back tail)
    prompt_tokens: int
    completion_tokens: int
    stats: object
    ttft_s: float
    total_s: float
    mode: str
    error: str | None = None


class _Output:
    """Detokenization and stop-string holdback for one request. As in vLLM, a stop string ends the request only
    where it ends in the text of the `min_tokens`-th generated token or a later one (it may start before)."""

    def __init__(self, tok: Tokenizer, stop: tuple[str, ...], min_tokens: int = 0):
        self.detok = tok.detokenizer(skip_special_tokens=True)
        self.stop = stop
        self.min_tokens = min_tokens
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.pending = ""
        self.base = 0       # characters emitted before `pending`
        self.early = 0      # characters of the tokens before the min_tokens-th: no stop string ends in them
        self.emitted_tokens = 0
        self.stopped = False
        self.logprobs: list[TokenLogprob] = []   # of the tokens about to arrive
        self.prompt_logprobs: list | None = None   # for the first delta

    def _find(self, text: str) -> int:
        """Where the first stop string that may end the request starts in `text` (at `self.base`), or -1."""
        found = [text.find(s, max(0, self.early - self.base - len(s) + 1)) for s in self.stop]
        return min((i for i in found if i >= 0), default=-1)

    def push(self, ids: list[int]) -> Delta | None:
        for t in ids:
            self.pending += self.detok.push(t)
            self.emitted_tokens += 1
            if self.emitted_tokens < self.min_tokens:
                self.early = self.base + len(self.pending)
        cut = self._find(self.pending) if self.stop else -1
        if cut >= 0:
            self.stopped, text, self.pending = True, self.pending[:cut], ""
            return Delta(ids, text)
        safe = len(self.pending) - self.hold if self.stop else len(self.pending)
        text, self.pending = self.pending[:max(0, safe)], self.pending[max(0, safe):]
        self.base += len(text)
        return Delta(ids, text) if ids or text else None

    def tail(self) -> str:
        if self.stopped:
            return ""
        rest = self.pending + self.detok.flush()
        cut = self._find(rest) if self.stop else -1
        return rest if cut < 0 else rest[:cut]


class Frontend:
    def __init__(self, core: RoundCore, tok: Tokenizer, limits: Limits | None = None):
        self.core, self.tok, self.limits = core, tok, limits or Limits()
        self.draining = False  # set on SIGTERM: no new requests (the APIs answer UNAVAILABLE / 503)
        self.groups: dict = {}  # request id -> the running choices of a request of several (choices.Fanout)

    def build(self, *, text: str | None = None, token_ids: list[int] | None = None,
              messages: list[dict] | None = None, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
              min_p: float = 0.0, seed: int | None = None, seed_stream: bool = False, max_tokens: int | None = None,
              stop=(),
              stop_token_ids=(), ignore_eos: bool = False, presence_penalty: float = 0.0,
              frequency_penalty: float = 0.0, repetition_penalty: float = 1.0, logit_bias: dict | None = None,
              min_tokens: int = 0, logprobs: int | None = None, mode: str = "", k: int = 0, request_id: str = "",
              timeout_s: float | None = None, n: int = 1, best_of: int | None = None,
              constraint: Constraint | None = None, prompt_logprobs: int | None = None) -> GenerationRequest:
        lim = self.limits
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"n: must be an integer in 1..{MAX_CHOICES}, got {n!r}")
        best_of = n if best_of is None else best_of
        if not isinstance(best_of, int) or isinstance(best_of, bool) or not n <= best_of <= MAX_CHOICES:
            raise ValueError(f"best_of: must be an integer in n..{MAX_CHOICES} (n = {n}), got {best_of!r}")
        if not isinstance(request_id, str) or len(request_id) > lim.max_request_id_chars:
            raise ValueError(f"request_id: at most {lim.max_request_id_chars} characters")
        given = [x is not None for x in (text, token_ids, messages)]
        if sum(given) != 1:
            raise ValueError("prompt: give exactly one of text, token_ids or messages")
        if token_ids is not None:
            if len(token_ids) >= self.core.max_len:  # the cheap check before any per-token work
                raise ValueError(f"prompt: {len(token_ids)} tokens; the maximum length is {self.core.max_len}")
            ids = list(token_ids)
        else:
            ids = self.tokenize(text=text, messages=messages)
        if not ids:
            raise ValueError("prompt: must not be empty")
        vocab = self.core.vocab_size
        if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in ids):
            raise ValueError(f"prompt: token ids must be integers in [0, {vocab})")
        if len(ids) >= self.core.max_len:
            raise ValueError(f"prompt: {len(ids)} tokens; the maximum length is {self.core.max_len}")
        max_tokens = self._max_tokens(max_tokens, len(ids))
        stop = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if len(stop) > lim.max_stop_strings or any(not isinstance(s, str) or not s or len(s) > lim.max_stop_chars
                                                    for s in stop):
            raise ValueError(f"stop: at most {lim.max_stop_strings} non-empty strings of at most "
                             f"{lim.max_stop_chars} characters")
        if len(stop_token_ids) > lim.max_stop_token_ids:
            raise ValueError(f"stop_token_ids: at most {lim.max_stop_token_ids} token ids")
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in stop_token_ids):
            raise ValueError(f"stop_token_ids: must be integers in [0, {vocab})")
        logit_bias = dict(logit_bias or {})
        if len(logit_bias) > lim.max_logit_bias:
            raise ValueError(f"logit_bias: at most {lim.max_logit_bias} token ids")
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in logit_bias):
            raise ValueError(f"logit_bias: token ids must be integers in [0, {vocab})")
        if not isinstance(min_tokens, int) or not 0 <= min_tokens <= max_tokens:
            raise ValueError(f"min_tokens: must be an integer in 0..max_tokens ({max_tokens}), got {min_tokens!r}")
        try:
            params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                                    max_tokens=max_tokens, stop_token_ids=tuple(stop_token_ids),
                                    ignore_eos=ignore_eos, presence_penalty=presence_penalty,
                                    frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty,
                                    logit_bias=logit_bias, min_tokens=min_tokens, logprobs=logprobs,
                                    seed_stream=seed_stream, constraint=constraint, prompt_logprobs=prompt_logprobs)
        except ValueError as e:
            raise ValueError(re.sub(r"^SamplingParams\.(\w+) ", r"\1: ", str(e))) from None
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        return GenerationRequest(request_id or uuid.uuid4().hex, ids, params, stop, mode, k, deadline, n=n,
                                 best_of=best_of)

    def tokenize(self, *, text: str | None = None, messages: list[dict] | None = None,
                 add_special_tokens: bool = False, add_generation_prompt: bool = True) -> list[int]:
        """The token ids of raw text or of chat messages rendered with the model's template (what a request with
        that prompt runs on), within the request limits."""
        lim = self.limits
        if text is not None:
            if len(text) > lim.max_prompt_chars:
                raise ValueError(f"prompt: {len(text)} characters; the limit is {lim.max_prompt_chars}")
            return self.tok.encode(text, add_special_tokens)
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages: must be a non-empty list of {role, content} objects")
        if len(messages) > lim.max_messages:
            raise ValueError(f"messages: {len(messages)} messages; the limit is {lim.max_messages}")
        for i, m in enumerate(messages):
            role = m.get("role") if isinstance(m, dict) else None
            if not isinstance(role, str) or role not in ROLES or not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}]: needs a role in {sorted(ROLES)} and a string content")
        chars = sum(len(m["content"]) for m in messages)
        if chars > lim.max_prompt_chars:  # before the template and the tokenizer spend time on it
            raise ValueError(f"messages: {chars} characters in all; the limit is {lim.max_prompt_chars}")
        try:
            return self.tok.encode(self.tok.apply_chat_template(messages, add_generation_prompt), add_special_tokens)
        except ValueError as e:
            raise ValueError(f"messages: {e}") from None

    def _max_tokens(self, max_tokens, prompt_tokens: int) -> int:
        """The request's max_tokens: what it asked for, within the rest of the context and the router's limit;
        by default the router's default or, without one, the rest of the context."""
        lim, max_len = self.limits, self.core.max_len
        room = max_len - prompt_tokens
        cap = min(room, lim.max_tokens_limit) if lim.max_tokens_limit else room
        if max_tokens is None:
            return min(lim.max_tokens_default, cap) if lim.max_tokens_default else cap
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {max_tokens!r}")
        if lim.max_tokens_limit and max_tokens > lim.max_tokens_limit:
            raise ValueError(f"max_tokens: {max_tokens} is above this server's limit of {lim.max_tokens_limit}")
        if max_tokens > room:
            raise ValueError(f"max_tokens: {max_tokens} tokens asked for, but the context holds {max_len} tokens "
                             f"and the prompt takes {prompt_tokens}: at most {room} can follow")
        return max_tokens

    def abort_id(self, rid: str) -> bool:
        """Abort a running request by its id, every choice of it; False when none runs."""
        group = self.groups.get(rid)
        if group is not None:
            group.abort()
            return True
        return self.core.abort_id(rid)

    def detokenize(self, ids) -> str:
        """The text of token ids (special tokens included, as they are)."""
        vocab = self.core.vocab_size or self.tok.vocab_size
        if not isinstance(ids, list) or any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab
                                            for t in ids):
            raise ValueError(f"tokens: must be a list of token ids in [0, {vocab})")
        return self.tok.decode(ids)

    @staticmethod
    def journal_params(g: GenerationRequest) -> dict:
        """What the request journal keeps of a request besides its prompt (JSON-able)."""
        p = g.params
        return {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p, "seed": p.seed,
                "max_tokens": p.max_tokens, "stop_token_ids": list(p.stop_token_ids), "ignore_eos": p.ignore_eos,
                "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty,
                "repetition_penalty": p.repetition_penalty, "logit_bias": [list(b) for b in p.logit_bias],
                "min_tokens": p.min_tokens, "logprobs": p.logprobs, "stop": list(g.stop), "mode": g.mode, "k": g.k,
                "seed_stream": p.seed_stream,
                "constraint": [p.constraint.kind, p.constraint.text] if p.constraint else None}

    def resumed(self, record, skip: int, timeout_s: float | None = None) -> GenerationRequest:
        """The request a journal record describes, continuing after its committed tokens; the client has the
        first `skip` of them."""
        p = dict(record.params)
        stop, mode, k = tuple(p.pop("stop")), p.pop("mode"), p.pop("k")
        constraint = p.pop("constraint", None)
        params = SamplingParams(**{**p, "stop_token_ids": tuple(p["stop_token_ids"]),
                                   "logit_bias": tuple(tuple(b) for b in p.get("logit_bias", ())),
                                   "constraint": Constraint(*constraint) if constraint else None})
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        finished = FinishReason(record.finish) if record.finish else None
        return GenerationRequest(record.request_id, list(record.prompt), params, stop, mode, k, deadline,
                                 list(record.tokens), skip, finished, record.epoch,
                                 resumed_logprobs=list(record.logprobs))

    def _done_before(self, g: GenerationRequest) -> FinishReason | None:
        """Whether the journaled tokens of a resumed request already end it."""
        if g.finished is not None or not g.resumed:
            return g.finished
        n = len(g.resumed)
        return finish_reason(g.resumed[-1], g.params, self.core.eos, n, len(g.prompt) + n, self.core.max_len)

    def _submit(self, g: GenerationRequest, events=None):
        if not g.epoch:  # not journaled: a fresh request
            return self.core.submit(g.request_id, g.prompt, g.params, g.mode, g.k, g.deadline, events)
        params = dataclasses.replace(g.params, max_tokens=g.params.max_tokens - len(g.resumed))
        return self.core.submit(g.request_id, g.prompt + g.resumed, params, g.mode, g.k, g.deadline, events,
                                replace=g.epoch > 1, prompt_len=len(g.prompt))

    def _final(self, req, out: _Output, reason: FinishReason, error: str | None = None,
               g: GenerationRequest | None = None) -> Final:
        now = time.monotonic()
        prompt = len(req.prompt) - (len(g.resumed) if g is not None else 0)
        return Final(reason, out.tail(), prompt, out.emitted_tokens, req.stats,
                     (req.first_token_at or now) - req.arrival, now - req.arrival, req.mode, error)

    def _handle(self, req, out: _Output, event, g: GenerationRequest) -> Delta | Final | None:
        kind, payload = event
        if kind == "logprobs":   # the core sends a commit's logprobs just before its tokens
            out.logprobs.extend(payload)
            return None
        if kind == "prompt_logprobs":   # before the first tokens: they ride in the first delta
            out.prompt_logprobs = payload
            return None
        if kind == "tokens":
            delta = out.push(payload)
            if out.prompt_logprobs is not None and delta is not None:
                delta.prompt_logprobs, out.prompt_logprobs = out.prompt_logprobs, None
            if g.params.logprobs is not None and delta is not None:
                delta.logprobs, out.logprobs = out.logprobs[:len(payload)], out.logprobs[len(payload):]
            if out.stopped:
                self.core.abort(req, FinishReason.STOP_STRING)
            return delta
        if kind == "done":
            return self._final(req, out, payload, g=g)
        return self._final(req, out, FinishReason.ERROR, payload, g=g)

    def _replay(self, g: GenerationRequest, out: _Output):
        """A resumed request's journaled tokens the client lacks (one Delta), and its Final if they end it."""
        out.push(g.resumed[:g.skip])  # what the client has: text emitted so far is a function of these tokens
        delta = out.push(g.resumed[g.skip:]) if g.skip < len(g.resumed) else None
        if delta is not None:
            delta.journaled = True
            if g.params.logprobs is not None and len(g.resumed_logprobs) == len(g.resumed):
                delta.logprobs = g.resumed_logprobs[g.skip:]
            yield delta
        reason = FinishReason.STOP_STRING if out.stopped else self._done_before(g)
        if reason is not None:
            yield Final(reason, out.tail(), len(g.prompt), out.emitted_tokens, SpecStats(), 0.0, 0.0, g.mode or "")

    def stream(self, g: GenerationRequest, on_start=None):
        """Yields Delta... then one Final (blocking; for gRPC handler threads)."""
        out = _Output(self.tok, g.stop, g.params.min_tokens)
        for item in self._replay(g, out):
            yield item
            if isinstance(item, Final):
                return
        req = self._submit(g)
        if on_start is not None:
            on_start(req)
        while True:
            items = self._items(req, out, req.events.get(), g)
            yield from items
            if items and isinstance(items[-1], Final):
                return

    def _items(self, req, out: _Output, event, g: GenerationRequest) -> list:
        """What one event of the request yields: a Delta or Final, or nothing; a Final last when it ends (a stop
        string found ends it too)."""
        item = self._handle(req, out, event, g)
        items = [] if item is None else [item]
        if out.stopped and not isinstance(item, Final):
            items.append(self._final(req, out, FinishReason.STOP_STRING, g=g))
        return items

    async def astream(self, g: GenerationRequest):
        """The asyncio version of `stream` (for the HTTP server); aborts the request if the consumer leaves."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        req = self._submit(g, _AsyncSink(loop, q))
        out = _Output(self.tok, g.stop, g.params.min_tokens)
        try:
            while True:
                items = self._items(req, out, await q.get(), g)
                for item in items:
                    yield item
                if items and isinstance(items[-1], Final):
                    return
        finally:
            if req.finish is None:
                self.core.abort(req)


@dataclass(slots=True)
class _AsyncSink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(repr=False)

    def put(self, event) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
