"""Fuzzing the OpenAI HTTP API: random JSON bodies against the real aiohttp app and Frontend over a fake core.

Whatever the body, the answer is 200 or a 4xx with OpenAI's error shape `{"error": {message, type, param,
code}}`, never a 5xx; a stream always ends with `data: [DONE]`.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssd.params import FinishReason
from ssd.tokenizer import Tokenizer
from services.router.frontend import Frontend
from services.router.http import HttpServer
from tests.services.http_fakes import FakeRequest

MODEL = "smollm2-135m-instruct"
K = 3


class FakeCore:
    """The round core's surface for Frontend (ssd.round.RoundCore), with its submit checks; streams token 42 at
    once."""

    def __init__(self, tok: Tokenizer):
        self.pool = SimpleNamespace(target=SimpleNamespace(ready=SimpleNamespace(model_id=MODEL,
                                                                                 vocab_size=tok.vocab_size)))
        self.max_len, self.vocab_size, self.k, self.eos = 2048, tok.vocab_size, K, frozenset(tok.eos_token_ids)

    def submit(self, rid, prompt, params, mode="", k=0, deadline=None, events=None, replace=False):
        if mode not in ("", "ar", "sd", "ssd"):
            raise ValueError(f"speculation.mode: must be ar, sd or ssd, got {mode!r}")
        if k < 0 or (k and k > self.k):
            raise ValueError(f"speculation.k: must be in 0..{self.k} (the draft's K), got {k}")
        req = FakeRequest(rid, list(prompt), params, events, mode or "ssd")
        threading.Thread(target=self._feed, args=(req,), daemon=True).start()
        return req

    def _feed(self, req: FakeRequest) -> None:
        n = min(req.params.max_tokens, 64)
        for i in range(0, n, K):
            if req.finish is not None:
                return
            req.first_token_at = req.first_token_at or time.monotonic()
            req.stats.record_round(K, min(K, n - i) - 1, min(K, n - i))
            req.events.put(("tokens", [42] * min(K, n - i)))
        req.finish = FinishReason.LENGTH
        req.events.put(("done", FinishReason.LENGTH))

    def abort(self, req, reason=FinishReason.ABORT) -> None:
        if req.finish is None:
            req.finish = reason
            req.events.put(("done", reason))


@pytest.fixture(scope="module")
def port(default_models):
    tok = Tokenizer.from_folder(default_models["target"])
    server = HttpServer(Frontend(FakeCore(tok), tok), MODEL, None, port=0)
    yield server.start()
    server.stop()


def _post(port: int, path: str, raw: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _check(status: int, raw: bytes) -> None:
    assert status < 500, (status, raw[:300])
    if status == 200:
        text = raw.decode()
        assert text.rstrip().endswith("data: [DONE]") or json.loads(text)["choices"], text[:300]
        return
    assert 400 <= status < 500
    body = json.loads(raw)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


_scalar = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
           | st.text(max_size=12))
_json = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x", ""]) | _json,
                                  "content": st.text(max_size=40) | _json})
FIELDS = {
    "model": st.just(MODEL) | _json,
    "prompt": st.text(max_size=40) | st.lists(st.integers(-5, 60000), max_size=8) | _json,
    "messages": st.lists(_message, max_size=4) | _json,
    "max_tokens": st.integers(-3, 5000) | _json, "max_completion_tokens": st.integers(-3, 40) | _json,
    "temperature": st.floats(-1, 5) | _json, "top_p": st.floats(-1, 2) | _json, "top_k": st.integers(-2, 10**6),
    "min_p": st.floats(-1, 2) | _json, "seed": st.integers(-2**65, 2**65) | _json,
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=300), max_size=20) | _json,
    "stop_token_ids": st.lists(st.integers(-3, 60000), max_size=5) | _json, "n": st.integers(0, 3) | _json,
    "stream": st.booleans() | _json, "stream_options": st.fixed_dictionaries({"include_usage": _json}) | _json,
    "ignore_eos": st.booleans() | _json, "logprobs": _json, "best_of": _json,
    "speculation": st.fixed_dictionaries({"mode": st.sampled_from(["ar", "sd", "ssd", "xx"]) | _json,
                                          "k": st.integers(-2, 6) | _json}) | _json,
}
_bodies = st.fixed_dictionaries({}, optional=FIELDS)
FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), _bodies)
def test_random_field_values_give_200_or_an_openai_4xx(port, path, body):
    _check(*_post(port, path, json.dumps(body).encode()))


@FUZZ
@given(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), _json)
def test_random_json_documents_give_an_openai_4xx(port, path, doc):
    status, raw = _post(port, path, json.dumps(doc).encode())
    _check(status, raw)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_random_bytes_give_an_openai_4xx(port, raw):
    status, body = _post(port, "/v1/chat/completions", raw)
    _check(status, body)
    assert status != 200 or raw.strip().startswith(b"{")


@pytest.mark.parametrize("body", [
    {"prompt": "x" * 1_100_000},                                          # over the 1 MiB body cap: 413
    {"prompt": "x " * 400_000},                                           # under the cap, over max_len tokens
    {"messages": [{"role": "user", "content": "hi"}] * 257},              # more messages than the limit
    {"messages": [{"role": "user", "content": "x " * 100_000}] * 4},      # many characters in few messages
    {"prompt": "hi", "stop": ["x"] * 17},                                 # too many stop strings
    {"prompt": "hi", "stop": ["x" * 257]},                                # a stop string too long
    {"prompt": "hi", "max_tokens": 10**9},                                # max_tokens over the limit
    {"prompt": list(range(3000))},                                        # more prompt tokens than max_len
    {"prompt": "hi", "stop_token_ids": [7] * 150_000},                    # a huge stop_token_ids list
], ids=["body-bytes", "prompt-tokens", "messages", "message-chars", "stop-count", "stop-length", "max-tokens",
        "token-ids", "stop-token-ids"])
def test_every_input_has_a_size_cap(port, body):
    status, raw = _post(port, "/v1/completions" if "prompt" in body else "/v1/chat/completions",
                        json.dumps({"model": MODEL, **body}).encode())
    _check(status, raw)
    assert status in (400, 413), (status, raw[:200])
