"""The OpenAI-compatible HTTP API, in process: a real Frontend and tokenizer over a fake engine core.

The fake core streams a fixed text's tokens in chunks of three from a thread, as the round core does, so these
tests need no workers. Clients: the official `openai` package, and plain HTTP for the wire details.
"""
from __future__ import annotations

import json
import socket
import time

import openai
import pytest

from ssd.params import FinishReason
from services.router.frontend import Frontend
from tests.services.http_fakes import MODEL, TEXT, FakeCore, openai_client, served, tok  # noqa: F401 (fixtures)
from tests.services.http_fakes import assert_error as _assert_error
from tests.services.http_fakes import post_json as _post_json
from tests.services.http_fakes import request as _request
from tests.services.http_fakes import serve as _serve


@pytest.fixture(autouse=True)
def _reset(request):
    yield
    if "served" in request.fixturenames:
        core = request.getfixturevalue("served").core
        core.delay, core.fail = 0.0, None


@pytest.fixture
def client(served):
    return openai_client(served.port)


def test_completion_streamed_text_equals_whole_text(client, tok):
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0)
    choice = whole.choices[0]
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert choice.text == tok.decode(tok.encode(TEXT * 3)[:20]) and choice.finish_reason == "length"
    assert whole.usage.prompt_tokens == len(tok.encode("Once upon a time"))
    assert whole.usage.completion_tokens == 20 and whole.usage.total_tokens == whole.usage.prompt_tokens + 20
    ssd = whole.model_extra["ssd"]
    assert ssd["finish_reason"] == "length" and ssd["rounds"] == 7 and ssd["cache_hits"] == 7
    assert ssd["acceptance_per_position"] == [1.0, 1.0, 0.0] and ssd["mode"] == "ssd"

    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


def test_completion_defaults_to_the_rest_of_the_context_and_accepts_token_ids(client, served):
    out = client.completions.create(model=MODEL, prompt=[504, 2365, 6354], stop=["lazy"])
    assert out.usage.prompt_tokens == 3
    assert served.core.last.params.max_tokens == served.core.max_len - 3


def test_chat_streamed_content_equals_whole_content(client):
    messages = [{"role": "user", "content": "Tell me about foxes."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content.startswith("The quick")
    assert whole.usage.completion_tokens == 12

    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage is None


def test_stop_string_ends_the_text_before_it_and_aborts_the_engine(client, served):
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=40, stop=["fox"])
    assert out.choices[0].text == "The quick brown " and out.choices[0].finish_reason == "stop"
    assert out.model_extra["ssd"]["finish_reason"] == "stop_string"
    assert served.core.aborted[out.id] is FinishReason.STOP_STRING


@pytest.mark.parametrize("stop, min_tokens, text", [
    ("quick", 5, TEXT + "The "),            # the first "quick" ends in token 2: it does not end the request
    ("quick brown", 3, "The "),             # ends in token 3, the min_tokens-th: it does
    ("quick brown", 4, TEXT + "The "),
])
def test_a_stop_string_ends_a_request_only_from_the_min_tokens_th_token(client, tok, stop, min_tokens, text):
    assert tok.decode(tok.encode(TEXT)[:3]) == "The quick brown"   # the fake's first three tokens
    whole = client.completions.create(model=MODEL, prompt="Hi", max_tokens=40, stop=[stop],
                                      extra_body={"min_tokens": min_tokens})
    assert whole.choices[0].text == text and whole.model_extra["ssd"]["finish_reason"] == "stop_string"
    chunks = client.completions.create(model=MODEL, prompt="Hi", max_tokens=40, stop=[stop], stream=True,
                                       extra_body={"min_tokens": min_tokens})
    assert "".join(c.choices[0].text for c in chunks) == text


def test_models_lists_the_one_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL] and models[0].owned_by == "ssd"


def test_stream_is_server_sent_events_ending_with_done(served):
    status, ctype, raw = _request(served.port, "POST", "/v1/completions",
                                  {"model": MODEL, "prompt": "Hi", "max_tokens": 7, "stream": True})
    assert status == 200 and ctype.startswith("text/event-stream")
    events = raw.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2])
    assert json.loads(events[-3][len("data: "):])["choices"][0]["finish_reason"] == "length"


def test_invalid_json_is_400_in_openai_shape(served):
    status, body = _post_json(served.port, "/v1/completions", b'{"model": ')
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    _assert_error(body)


@pytest.mark.parametrize("fields, param", [
    ({"temperature": "hot"}, "temperature"), ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"), ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": ""}, "prompt"),
    ({"n": 17}, "n"), ({"stop": [1]}, "stop"), ({"stream": "yes"}, "stream"), ({"logprobs": 30}, "logprobs"),
    ({"speculation": {"mode": "fast"}}, "speculation.mode"), ({"speculation": {"k": "x"}}, "speculation.k"),
])
def test_a_bad_field_is_400_naming_it(served, fields, param):
    status, body = _post_json(served.port, "/v1/completions", {"model": MODEL, "prompt": "Hi", **fields})
    assert status == 400, body
    _assert_error(body, param)


def test_batched_prompts_are_refused_by_name(served):
    status, body = _post_json(served.port, "/v1/completions", {"model": MODEL, "prompt": ["a", "b"]})
    assert status == 400 and body["error"]["message"] == "prompt: batched prompts are not supported"


def test_bad_chat_messages_are_400(served):
    for messages, param in (([{"role": "robot", "content": "x"}], "messages[0]"), ([], "messages"),
                            ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content"),
                            (None, "messages")):
        status, body = _post_json(served.port, "/v1/chat/completions", {"model": MODEL, "messages": messages})
        assert status == 400, body
        _assert_error(body, param)


def test_openai_client_sees_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="Hi", temperature=-2)
    assert e.value.param == "temperature"


def test_unknown_model_path_method_and_big_body(served):
    status, body = _post_json(served.port, "/v1/completions", {"model": "gpt-4", "prompt": "Hi"})
    assert status == 404
    _assert_error(body, "model", "model_not_found")
    status, _, raw = _request(served.port, "GET", "/v2/nothing")
    assert status == 404
    _assert_error(json.loads(raw))
    status, _, raw = _request(served.port, "GET", "/v1/completions")
    assert status == 405
    _assert_error(json.loads(raw))
    status, _, raw = _request(served.port, "POST", "/v1/completions", b'{"prompt": "' + b"a" * (1 << 20) + b'"}')
    assert status == 413
    _assert_error(json.loads(raw))


def test_engine_error_is_503(served):
    served.core.fail = "the target died"
    status, body = _post_json(served.port, "/v1/completions", {"model": MODEL, "prompt": "Hi"})
    assert status == 503 and body["error"]["message"] == "the target died"


def test_health_and_metrics(served, tok):
    status, _, raw = _request(served.port, "GET", "/health")
    assert status == 200 and json.loads(raw) == {"status": "ok"}
    status, ctype, raw = _request(served.port, "GET", "/metrics")
    assert status == 200 and raw == b"ssd_up 1\n" and ctype.startswith("text/plain; version=0.0.4")
    server, port, _ = _serve(tok, metrics=False)
    try:
        assert _request(port, "GET", "/metrics")[0] == 404
    finally:
        server.stop()


def test_not_ready_is_503(tok):
    server, port, _ = _serve(tok, ready=False)
    try:
        assert _request(port, "GET", "/health")[0] == 503
        for path, body in (("/v1/completions", {"prompt": "Hi"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
            status, out = _post_json(port, path, body)
            assert status == 503
            _assert_error(out)
    finally:
        server.stop()


def test_client_leaving_mid_stream_aborts_the_request(served):
    served.core.delay = 0.02
    body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 2000, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        seen = b""
        while b"data: {" not in seen:
            seen += s.recv(4096)
    rid = json.loads(seen.split(b"data: ", 1)[1].split(b"\n\n", 1)[0])["id"]
    deadline = time.monotonic() + 5
    while rid not in served.core.aborted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert served.core.aborted.get(rid) is FinishReason.ABORT


@pytest.mark.parametrize("fields, message", [
    ({"text": "hi", "request_id": "x" * 257}, "request_id: at most 256 characters"),
    ({"text": "hi", "stop_token_ids": [7] * 65}, "stop_token_ids: at most 64 token ids"),
    ({"messages": [{"role": "user", "content": "a" * 600_000}] * 2}, "messages: 1200000 characters in all"),
    ({"token_ids": [5] * 9000}, "prompt: 9000 tokens; the maximum length is 8192"),
])
def test_frontend_caps_every_input_before_doing_work(tok, fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Frontend(FakeCore(tok), tok).build(**fields)
