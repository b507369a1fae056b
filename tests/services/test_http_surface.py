"""The HTTP API's surface as OpenAI and vLLM clients expect it, through the real aiohttp app over a fake core:
every request field is honoured or refused with a 400 naming it (none is silently dropped), `/v1/models/{id}`,
`/tokenize`, `/detokenize`, `/version`, and `max_tokens` bounded by (and by default) the rest of the context."""
from __future__ import annotations

import json

import openai
import pytest

from services.router.auth import ApiKeys
from services.router.frontend import Frontend, Limits
from tests.services.http_fakes import (MODEL, FakeCore, assert_error, openai_client, post_json, request,  # noqa: F401
                                       serve, served, tok)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 4}


@pytest.fixture
def client(served):
    return openai_client(served.port)


REFUSED = [  # (endpoint body, extra fields, the param the 400 names)
    (CHAT, {"guided_json": 3}, "guided_json"),
    (CHAT, {"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (CHAT, {"guided_choice": []}, "guided_choice"),
    (CHAT, {"guided_choice": ["a", 1]}, "guided_choice"),
    (COMPLETION, {"guided_choice": "a"}, "guided_choice"),
    (COMPLETION, {"guided_grammar": "start: ("}, "guided_grammar"),
    (COMPLETION, {"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),   # two structured fields
    (CHAT, {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    (CHAT, {"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
    (CHAT, {"structured_outputs": {"grammar": "start: ("}}, "structured_outputs.grammar"),
    (CHAT, {"structured_outputs": {"json": {"type": 3}}}, "structured_outputs.json"),
    (COMPLETION, {"structured_outputs": {"choice": [2]}}, "structured_outputs.choice"),
    (COMPLETION, {"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
    (COMPLETION, {"structured_outputs": {"choices": ["a"]}}, "structured_outputs.choices"),
    (COMPLETION, {"structured_outputs": {}}, "structured_outputs"),
    (COMPLETION, {"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "maybe"}, "tool_choice"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}], "guided_regex": "a"}, "guided_regex"),   # auto with a constraint
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]}, "tools"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"description": "x" * 70000}}}],
            "tool_choice": "auto"}, "tools"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f", "x": 1}}], "tool_choice": "required"},
     "tools[0].function.x"),
    (CHAT, {"tool_choice": "required"}, "tool_choice"),
    (CHAT, {"n": 0}, "n"),
    (CHAT, {"n": 17}, "n"),
    (CHAT, {"best_of": 2}, "best_of"),                     # a completions field
    (CHAT, {"temprature": 0.5}, "temprature"),           # a typo is not silently dropped
    (CHAT, {"prompt": "Hi"}, "prompt"),
    (CHAT, {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
     "stream_options.continuous_usage_stats"),
    (CHAT, {"speculation": {"mode": "sd", "fanout": [1, 1]}}, "speculation.fanout"),
    (CHAT, {"messages": [{"role": "user", "content": "Hi", "name": "bob"}]}, "messages[0].name"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]},
     "messages[0].content"),
    (CHAT, {"echo": True}, "echo"),                        # a completions field
    (COMPLETION, {"echo": 1}, "echo"),
    (COMPLETION, {"logprobs": 21, "echo": True}, "logprobs"),
    (COMPLETION, {"prompt_logprobs": 21}, "prompt_logprobs"),
    (CHAT, {"prompt_logprobs": -1}, "prompt_logprobs"),
    (COMPLETION, {"prompt_logprobs": True}, "prompt_logprobs"),
    (CHAT, {"prompt_logprobs": "3"}, "prompt_logprobs"),
    (COMPLETION, {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),   # as vLLM
    (COMPLETION, {"best_of": 3, "stream": True}, "best_of"),
    (COMPLETION, {"n": 3, "best_of": 2}, "best_of"),
    (COMPLETION, {"suffix": "end"}, "suffix"),
    (COMPLETION, {"messages": []}, "messages"),
    (COMPLETION, {"include_stop_str_in_output": True}, "include_stop_str_in_output"),
    (COMPLETION, {"skip_special_tokens": False}, "skip_special_tokens"),
    (COMPLETION, {"whatever": None, "frobnicate": 1}, "frobnicate"),
    (COMPLETION, {"temperature": float("inf")}, "temperature"),
]


@pytest.mark.parametrize("base, extra, param", REFUSED, ids=[p for _, _, p in REFUSED])
def test_a_field_not_honoured_is_a_400_naming_it(served, base, extra, param):
    path = "/v1/chat/completions" if "messages" in base else "/v1/completions"
    status, body = post_json(served[0], path, {**base, **extra})
    assert status == 400, body
    assert_error(body, param)


@pytest.mark.parametrize("base, extra", [
    (CHAT, {"n": 1, "response_format": {"type": "text"}, "logprobs": False, "top_logprobs": 0, "tools": [],
            "tool_choice": "none", "parallel_tool_calls": True, "store": False, "user": "u-1", "stop": None,
            "stream_options": {"include_usage": True}, "add_generation_prompt": True, "frequency_penalty": None}),
    (COMPLETION, {"n": 1, "best_of": 1, "echo": False, "suffix": "", "user": "u-2", "logprobs": None,
                  "skip_special_tokens": True, "speculation": {"mode": "ssd", "k": 0}}),
])
def test_fields_at_the_value_that_changes_nothing_are_accepted(served, base, extra):
    path = "/v1/chat/completions" if "messages" in base else "/v1/completions"
    status, body = post_json(served[0], path, {**base, **extra})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 4


def test_the_openai_client_sees_a_refused_field_by_name(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       extra_body={"guided_decoding_backend": "xgrammar"})
    assert e.value.param == "guided_decoding_backend" and "not supported" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:   # two structured-output fields: the message names both
        client.completions.create(model=MODEL, prompt="Hi", extra_body={"guided_json": {}, "guided_grammar": "a"})
    assert e.value.param == "guided_grammar" and "guided_json" in e.value.message


def test_model_by_id_and_unknown_ids(client, served):
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model" and card.owned_by == "ssd"
    assert card.model_extra["max_model_len"] == served[1].max_len
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    status, _, raw = request(served[0], "GET", "/v1/models/org/other-model")
    assert status == 404
    assert_error(json.loads(raw), "model", "model_not_found")


def test_tokenize_gives_the_tokens_a_request_runs_on(served, tok, client):
    port, core = served
    status, out = post_json(port, "/tokenize", {"model": MODEL, "prompt": "Hello world"})
    assert status == 200
    assert out == {"count": len(tok.encode("Hello world")), "max_model_len": core.max_len,
                   "tokens": tok.encode("Hello world"), "token_strs": None}
    messages = [{"role": "user", "content": "Tell me about foxes."}]
    status, chat = post_json(port, "/tokenize", {"messages": messages, "return_token_strs": True})
    assert status == 200
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert chat["count"] == whole.usage.prompt_tokens == len(chat["tokens"])
    assert chat["token_strs"] == [tok.id_to_token(i) for i in chat["tokens"]]
    status, bare = post_json(port, "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert status == 200 and bare["count"] < chat["count"]


def test_detokenize_inverts_tokenize_and_version(served, tok):
    port, _ = served
    ids = tok.encode("The quick brown fox")
    status, out = post_json(port, "/detokenize", {"model": MODEL, "tokens": ids})
    assert status == 200 and out == {"prompt": "The quick brown fox"}
    for body, param in (({"tokens": [tok.vocab_size]}, "tokens"), ({"tokens": "abc"}, "tokens"), ({}, "tokens"),
                        ({"tokens": [1], "extra": 1}, "extra")):
        status, err = post_json(port, "/detokenize", body)
        assert status == 400, body
        assert_error(err, param)
    for body, param in (({"prompt": 5}, "prompt"), ({}, "prompt"), ({"prompt": "a", "echo": True}, "echo"),
                        ({"model": "other", "prompt": "a"}, "model")):
        status, err = post_json(port, "/tokenize", body)
        assert status == (404 if param == "model" else 400), body
        assert_error(err, param, "model_not_found" if param == "model" else None)
    status, _, raw = request(port, "GET", "/version")
    assert status == 200 and json.loads(raw)["version"]


def test_tokenize_needs_the_api_key_where_keys_are_set(tok, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("secret-key-0123456789\n")
    server, port, _ = serve(tok, api_keys=ApiKeys(keys))
    try:
        for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [1]})):
            assert request(port, "POST", path, body)[0] == 401
            assert request(port, "POST", path, body, {"Authorization": "Bearer secret-key-0123456789"})[0] == 200
        assert request(port, "GET", "/version")[0] == 200
    finally:
        server.stop()


def test_max_tokens_defaults_to_the_rest_of_the_context(served, client):
    _, core = served
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], stop=["fox"])
    assert core.last.params.max_tokens == core.max_len - len(core.last.prompt)


def test_max_tokens_past_the_context_is_a_400(served, tok):
    port, core = served
    n = len(tok.encode("Hi"))
    status, body = post_json(port, "/v1/completions", {**COMPLETION, "max_tokens": core.max_len - n + 1})
    assert status == 400 and f"at most {core.max_len - n} can follow" in body["error"]["message"]
    assert_error(body, "max_tokens")
    status, body = post_json(port, "/v1/completions", {**COMPLETION, "max_tokens": core.max_len - n})
    assert status == 200, body


def test_a_router_limit_and_default_bound_max_tokens(tok):
    front = Frontend(FakeCore(tok), tok, Limits(max_tokens_default=100, max_tokens_limit=500))
    assert front.build(text="Hi").params.max_tokens == 100
    assert front.build(text="Hi", max_tokens=500).params.max_tokens == 500
    with pytest.raises(ValueError, match="max_tokens: 501 is above this server's limit of 500"):
        front.build(text="Hi", max_tokens=501)
    near_full = [5] * (FakeCore(tok).max_len - 50)
    assert front.build(token_ids=near_full).params.max_tokens == 50   # the default, cut to what the context holds


@pytest.mark.parametrize("fields, param", [
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"presence_penalty": "high"}, "presence_penalty"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 1000}, "repetition_penalty"), ({"logit_bias": {"49152": 1}}, "logit_bias"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"5": "up"}}, "logit_bias[5]"), ({"logit_bias": [5]}, "logit_bias"),
    ({"min_tokens": 5}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"), ({"min_tokens": 1.5}, "min_tokens"),
])
def test_bad_penalties_and_biases_are_a_400_naming_them(served, fields, param):
    status, body = post_json(served[0], "/v1/completions", {**COMPLETION, **fields})   # max_tokens 4
    assert status == 400, body
    assert_error(body, param)


def test_penalties_and_biases_reach_the_engine(served):
    port, core = served
    status, body = post_json(port, "/v1/chat/completions", {
        **CHAT, "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.2,
        "logit_bias": {"17": -100, "5": 2.5}, "min_tokens": 3})
    assert status == 200, body
    p = core.last.params
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.25, 1.2)
    assert p.logit_bias == ((5, 2.5), (17, -100.0)) and p.min_tokens == 3


def test_chat_logprobs_whole_and_streamed_parse_in_the_openai_client(client, tok):
    messages = [{"role": "user", "content": "Hi"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=7, logprobs=True,
                                           top_logprobs=2)
    content = whole.choices[0].logprobs.content
    ids = tok.encode(whole.choices[0].message.content)
    assert len(content) == 7 and [c.token for c in content] == [tok.decode([i]) for i in ids[:7]]
    assert all(c.logprob == -0.25 and c.bytes == list(c.token.encode()) for c in content)
    assert [t.logprob for t in content[0].top_logprobs] == [-0.25, -1.25]
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=7, logprobs=True,
                                                 stream=True))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [c.token for c in streamed] == [c.token for c in content] and streamed[0].top_logprobs == []
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_parse_in_the_openai_client(client, tok):
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp.token_logprobs == [-0.25] * 5 and len(lp.tokens) == 5 and len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    assert list(lp.top_logprobs[0].values()) == [-0.25, -1.25]


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"top_logprobs": 2}, "top_logprobs"),
])
def test_bad_logprobs_are_a_400_naming_them(served, path, fields, param):
    base = CHAT if path == "/v1/chat/completions" else COMPLETION
    status, body = post_json(served[0], path, {**base, **fields})
    assert status == 400, body
    assert_error(body, param)
