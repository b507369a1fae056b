"""Several choices of one request (`n`, `best_of`), each its own sequence through the round core. No torch.

A request for n choices of best_of candidates (n <= best_of <= MAX_CHOICES) runs best_of sequences of its prompt.
Each is an ordinary request of the round core, under the id `<request_id>` (candidate 0) or `<request_id>/<i>`,
with its own rounds, speculation, stop strings and finish, so every choice is exactly the target's output.
Candidate 0 goes first and the others once its prompt's KV is in the workers' prefix caches, so their prefills
take it from there instead of computing it again: in ar once candidate 0 has its first token (the target
registers the prompt's full blocks when it prefills), with a draft once its first round has committed too (the
draft registers them on that commit, which reaches it before the others' adds; a feature-reading draft would
otherwise rebuild the prompt's KV without the target's features, which a cache hit on the target does not send).
With a seed, candidate i samples with seed + i (mod 2**64): the choices differ and the whole request reproduces.

`stream` / `astream` yield (index, Delta | Final): the choices' pieces interleaved as they arrive, each choice's
Final last for its index. With best_of > n nothing comes until every candidate has finished; then the n with the
highest cumulative logprob (the sum of the target's log-probabilities of the tokens each generated, as vLLM
ranks them) come best first as indices 0..n-1, each as one Delta and its Final. The others are dropped.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
import threading
from dataclasses import dataclass
from typing import Callable

from ssd.engine.stats import SpecStats
from ssd.params import FinishReason
from services.router.frontend import Delta, Final, Frontend, GenerationRequest, _Output

SEED_MODULUS = 2 ** 64


def choice_seed(seed: int | None, i: int) -> int | None:
    """The seed candidate i samples with: seed + i (mod 2**64); unseeded stays unseeded."""
    return None if seed is None else (seed + i) % SEED_MODULUS


class Fanout:
    """The candidates of one request: submits them, turns their events into (index, Delta | Final), ranks them
    when best_of > n. Driven by one thread (the stream's); `abort` may come from any."""

    def __init__(self, front: Frontend, g: GenerationRequest, sink: Callable[[int], object], on_start=None):
        self.front, self.g, self.sink, self.on_start = front, g, sink, on_start
        self.ranked = g.best_of > g.n
        params = g.params
        if self.ranked and params.logprobs is None:
            params = dataclasses.replace(params, logprobs=0)   # to rank by; not returned
        self.subs = [dataclasses.replace(g, request_id=g.request_id if i == 0 else f"{g.request_id}/{i}",
                                         params=dataclasses.replace(params, seed=choice_seed(params.seed, i)))
                     for i in range(g.best_of)]
        self.outs = [_Output(front.tok, g.stop, g.params.min_tokens) for _ in self.subs]
        self.reqs: list = [None] * g.best_of
        self.finals: list[Final | None] = [None] * g.best_of
        self.held: list[list[Delta]] = [[] for _ in self.subs]   # ranked: each candidate's pieces until the end
        self.others_started = False
        self.commits = 0          # candidate 0's token events so far
        self.aborted = False
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return all(f is not None for f in self.finals)

    def start(self) -> None:
        """Submit candidate 0 (raises submit's ValueError)."""
        self._submit(0)

    def abort(self) -> None:
        """End every candidate still running, and submit no more."""
        with self._lock:
            self.aborted = True
            running = [r for r, f in zip(self.reqs, self.finals) if r is not None and f is None]
        for req in running:
            self.front.core.abort(req)

    def _submit(self, i: int) -> bool:
        with self._lock:
            if self.aborted:
                return False
            self.reqs[i] = self.front._submit(self.subs[i], self.sink(i))
        if self.on_start is not None:
            self.on_start(self.reqs[i])
        return True

    def on_event(self, i: int, event) -> list[tuple[int, Delta | Final]]:
        """Candidate i's core event -> what to yield now."""
        if self.finals[i] is not None:   # e.g. the "done" of a stop string's abort, after its Final
            return []
        req, o, sub = self.reqs[i], self.outs[i], self.subs[i]
        item = self.front._handle(req, o, event, sub)
        items = [] if item is None else [item]
        if o.stopped and not isinstance(item, Final):
            items.append(self.front._final(req, o, FinishReason.STOP_STRING, g=sub))
        out = []
        for it in items:
            out += self._emit(i, it)
        if i == 0 and not self.others_started:
            self.commits += event[0] == "tokens"
            first = self.finals[0]
            if first is not None and (first.error is not None or first.reason is FinishReason.ABORT
                                      or not o.emitted_tokens):
                self.others_started = True   # failed, aborted or ended before its first token: so do the others
                for j in range(1, len(self.subs)):
                    out += self._emit(j, dataclasses.replace(first, text="", completion_tokens=0, stats=SpecStats()))
            elif first is not None or self.commits >= (1 if req.mode == "ar" else 2):
                self.others_started = True
                out += self._start_others()
        return out

    def _start_others(self) -> list:
        out = []
        for j in range(1, len(self.subs)):
            try:
                started, error = self._submit(j), None
            except ValueError as e:
                started, error = False, f"choice {j}: {e}"
            if not started:
                f = Final(FinishReason.ABORT if error is None else FinishReason.ERROR, "", len(self.g.prompt), 0,
                          SpecStats(), 0.0, 0.0, self.g.mode, error)
                out += self._emit(j, f)
        return out

    def _emit(self, i: int, item: Delta | Final) -> list:
        if isinstance(item, Final):
            self.finals[i] = item
        if not self.ranked:
            return [(i, item)]
        if isinstance(item, Delta):
            self.held[i].append(item)
        return self._best() if self.done else []

    def _best(self) -> list:
        """The n best candidates, best first, each as one Delta (if it has output) and its Final."""
        failed = [f for f in self.finals if f.error is not None]
        if failed:
            return [(0, failed[0])]
        scores = [sum(lp.logprob for d in held for lp in d.logprobs or ()) for held in self.held]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:self.g.n]
        out = []
        for rank, i in enumerate(order):
            held = self.held[i]
            if held:
                logprobs = [lp for d in held for lp in d.logprobs or ()] if self.g.params.logprobs is not None \
                    else None
                out.append((rank, Delta([t for d in held for t in d.token_ids], "".join(d.text for d in held),
                                        logprobs=logprobs, prompt_logprobs=held[0].prompt_logprobs)))
            out.append((rank, self.finals[i]))
        return out


@dataclass(slots=True)
class _Sink:
    """A candidate's events object: puts (index, event) on the request's one queue."""
    put_tagged: Callable
    index: int

    def put(self, event) -> None:
        self.put_tagged((self.index, event))


def stream(front: Frontend, g: GenerationRequest, on_start=None):
    """Yields (index, Delta | Final) of every choice (blocking; for gRPC handler threads); `on_start(req)` for each
    core request submitted."""
    if g.best_of == 1:
        for item in front.stream(g, on_start):
            yield 0, item
        return
    q: queue.Queue = queue.Queue()
    fan = Fanout(front, g, lambda i: _Sink(q.put, i), on_start)
    fan.start()
    front.groups[g.request_id] = fan
    try:
        while not fan.done:
            yield from fan.on_event(*q.get())
    finally:
        if front.groups.get(g.request_id) is fan:
            del front.groups[g.request_id]
        fan.abort()


async def astream(front: Frontend, g: GenerationRequest):
    """The asyncio version of `stream` (for the HTTP server); aborts every choice if the consumer leaves."""
    if g.best_of == 1:
        async with contextlib.aclosing(front.astream(g)) as items:
            async for item in items:
                yield 0, item
        return
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    fan = Fanout(front, g, lambda i: _Sink(lambda x: loop.call_soon_threadsafe(q.put_nowait, x), i))
    fan.start()
    front.groups[g.request_id] = fan
    try:
        while not fan.done:
            for item in fan.on_event(*await q.get()):
                yield item
    finally:
        if front.groups.get(g.request_id) is fan:
            del front.groups[g.request_id]
        fan.abort()
