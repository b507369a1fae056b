"""A fake round core for the HTTP API's tests: what `Frontend` and `HttpServer` need of `ssd.round.RoundCore`,
streaming a fixed text's tokens (or a scripted list, then EOS) in chunks of three from a thread, as the round core
does, so the tests need no workers. Also the fixtures those tests share: `tok` and `served` (a real HttpServer
over a FakeCore: (port, core)), imported by each test module that uses them."""
from __future__ import annotations

import dataclasses
import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import NamedTuple

import openai
import pytest

from ssd.engine.stats import SpecStats
from ssd.params import FinishReason, SamplingParams, TokenLogprob
from ssd.tokenizer import Tokenizer
from services.router.frontend import Frontend
from services.router.http import HttpServer

MODEL = "smollm2-135m-instruct"
TEXT = "The quick brown fox jumps over the lazy dog. "


def fake_logprob(token: int, n: int) -> TokenLogprob:
    """The fake core's logprob of a token: -0.25, with alternatives token, token + 1, ... at -0.25, -1.25, ..."""
    return TokenLogprob(token, -0.25, tuple((token + i, -0.25 - i) for i in range(n)))


@dataclass(eq=False)
class FakeRequest:
    rid: str
    prompt: list[int]
    params: SamplingParams
    events: object
    mode: str
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    finish: FinishReason | None = None


class FakeCore:
    """What Frontend and the HTTP server need of the round core (ssd.round.RoundCore): pool.target.ready,
    vocab_size, max_len, submit, abort."""

    def __init__(self, tok: Tokenizer, ready: bool = True):
        self.pool = SimpleNamespace(target=SimpleNamespace(
            ready=SimpleNamespace(model_id=MODEL, vocab_size=tok.vocab_size) if ready else None))
        self.max_len = 8192 if ready else 0
        self.vocab_size = tok.vocab_size if ready else 0
        self.tokens = tok.encode(TEXT * 400)
        self.delay = 0.0          # seconds between chunks
        self.fail: str | None = None
        self.script: list[int] | None = None   # tokens to stream instead of TEXT's, then EOS (if max_tokens allows)
        self.aborted: dict[str, FinishReason] = {}
        self.last: FakeRequest | None = None   # the request submitted last

    def submit(self, rid, prompt, params, mode="", k=0, deadline=None, events=None):
        if mode not in ("", "ar", "sd", "ssd"):
            raise ValueError(f"speculation.mode: must be ar, sd or ssd, got {mode!r}")
        req = self.last = FakeRequest(rid, list(prompt), params, events, mode or "ssd")
        threading.Thread(target=self._feed, args=(req, self.fail), daemon=True).start()
        return req

    def _feed(self, req: FakeRequest, fail: str | None) -> None:
        if fail is not None:
            req.finish = FinishReason.ERROR
            req.events.put(("error", fail))
            return
        tokens = self.tokens if self.script is None else self.script
        ids = tokens[:req.params.max_tokens]
        end = FinishReason.LENGTH if len(ids) == req.params.max_tokens else FinishReason.EOS
        if req.params.prompt_logprobs is not None:   # rank 1 + the token's id mod 3
            n = req.params.prompt_logprobs
            req.events.put(("prompt_logprobs", [None] + [dataclasses.replace(fake_logprob(t, n), rank=1 + t % 3)
                                                         for t in req.prompt[1:]]))
        for i in range(0, len(ids), 3):
            time.sleep(self.delay)
            if req.finish is not None:
                return
            req.first_token_at = req.first_token_at or time.monotonic()
            req.stats.record_round(3, 2, len(ids[i:i + 3]))
            req.stats.count("cache", "hit")
            if req.params.logprobs is not None:
                req.events.put(("logprobs", [fake_logprob(t, req.params.logprobs) for t in ids[i:i + 3]]))
            req.events.put(("tokens", ids[i:i + 3]))
        req.finish = end
        req.events.put(("done", end))

    def abort(self, req: FakeRequest, reason: FinishReason = FinishReason.ABORT) -> None:
        self.aborted[req.rid] = reason
        if req.finish is None:
            req.finish = reason
            req.events.put(("done", reason))


def serve(tok, ready=True, metrics=True, **server):
    """An HttpServer over a FakeCore on a free port: (server, port, core)."""
    core = FakeCore(tok, ready)
    render = (lambda: (b"ssd_up 1\n", "text/plain; version=0.0.4; charset=utf-8")) if metrics else None
    srv = HttpServer(Frontend(core, tok), MODEL, render, port=0, **server)
    return srv, srv.start(), core


class Served(NamedTuple):
    port: int
    core: "FakeCore"


@pytest.fixture(scope="module")
def tok(default_models):
    return Tokenizer.from_folder(default_models["target"])


@pytest.fixture(scope="module")
def served(tok):
    server, port, core = serve(tok)
    yield Served(port, core)
    server.stop()


def openai_client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=30)


def request(port, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, resp.getheader("Content-Type"), raw


def post_json(port, path, body):
    status, _, raw = request(port, "POST", path, body)
    return status, json.loads(raw)


def assert_error(body, param=None, code=None):
    """An OpenAI error body naming `param`."""
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and body["error"]["code"] == code
    assert body["error"]["param"] == param
