"""Requests on their way in: submit and abort from any thread, met by the core's thread at queues. No torch."""
from __future__ import annotations

import itertools
import queue
import threading
from typing import Callable

from ssd.params import FinishReason, SamplingParams
from ssd.round.state import MODES, Request


class Intake:
    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self._incoming: queue.Queue = queue.Queue()
        self._aborts: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._by_rid: dict[str, Request] = {}
        self._seqs = itertools.count(1)
        self.wake: Callable[[], None] = lambda: None   # called after each submit and abort, from their thread:
                                                       # the loop carrying the core may be waiting on its sockets

    def submit(self, rid: str, prompt: list[int], params: SamplingParams, mode: str, k: int, max_k: int,
               has_drafts: bool, deadline: float | None = None, events=None, replace: bool = False,
               prompt_len: int = 0) -> Request:
        """Queues a request. `replace`: a running request with the same id is aborted and this one takes its id
        (a client resuming its own stream)."""
        if mode not in MODES:
            raise ValueError(f"speculation.mode: must be ar, sd or ssd, got {mode!r}")
        if mode != "ar" and not has_drafts:
            raise ValueError(f"speculation.mode: {mode} needs a draft, and this router has none")
        if k < 0 or (k and k > max_k):
            raise ValueError(f"speculation.k: must be in 0..{max_k} (the draft's K), got {k}")
        with self._lock:
            old = self._by_rid.get(rid)
            if old is not None and not replace:
                raise ValueError(f"request_id: {rid!r} is already running")
            if old is not None:
                self.abort(old)
            req = Request(rid, next(self._seqs), list(prompt), params, events or queue.Queue(), mode, k, deadline,
                          self.clock(), prompt_len)
            self._by_rid[rid] = req
        self._incoming.put(req)
        self.wake()
        return req

    def abort(self, req: Request, reason: FinishReason = FinishReason.ABORT) -> None:
        self._aborts.put((req, reason))
        self.wake()

    def abort_id(self, rid: str) -> bool:
        with self._lock:
            req = self._by_rid.get(rid)
        if req is not None:
            self.abort(req)
        return req is not None

    def forget(self, req: Request) -> None:
        with self._lock:
            if self._by_rid.get(req.rid) is req:
                del self._by_rid[req.rid]

    def new(self) -> list[Request]:
        return _drain(self._incoming)

    def aborted(self) -> list[tuple[Request, FinishReason]]:
        return _drain(self._aborts)


def _drain(q: queue.Queue) -> list:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out
