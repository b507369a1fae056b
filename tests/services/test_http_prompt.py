"""`echo` and `prompt_logprobs` on the HTTP API, through the real aiohttp app over a fake core
(tests/services/http_fakes.py: its prompt logprobs are -0.25 with rank 1 + id % 3): the echoed text is the prompt
followed by the completion, in the first chunk when streaming; the logprobs cover the prompt first (the first
token's entries null) with text offsets into the echoed text; vLLM's prompt_logprobs shape, per choice on
completions and at the top level on chat; the target is asked for prompt logprobs only when they are shown. The
real numbers through the real stack: tests/services/test_prompt_logprobs_stack.py."""
from __future__ import annotations

import json

import pytest

from tests.services.http_fakes import MODEL, TEXT, openai_client, post_json, request, served, tok  # noqa: F401

PROMPT = "Say something about foxes."


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served.port)


def completion(tok, n: int) -> str:
    return tok.decode(tok.encode(TEXT * 2)[:n])


def assert_echoed_logprobs(tok, text: str, lp, prompt_ids: list[int], top: int, generated: int):
    assert lp.tokens == [tok.decode([t]) for t in prompt_ids] + [tok.decode([t]) for t in tok.encode(TEXT)[:generated]]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == [-0.25] * (len(prompt_ids) - 1 + generated)
    assert lp.top_logprobs[1:len(prompt_ids)] == [{tok.decode([t + i]): -0.25 - i for i in range(top)}
                                                  for t in prompt_ids[1:]]   # cut to logprobs' N
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[len(prompt_ids)] == len(PROMPT)
    for token, at in zip(lp.tokens, lp.text_offset):   # every token's text is where its offset says
        assert text[at:at + len(token)] == token


def test_echo_returns_the_prompt_then_the_completion_and_asks_no_logprobs_unless_shown(client, served, tok):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, echo=True)
    assert out.choices[0].text == PROMPT + completion(tok, 5)
    assert served[1].last.params.prompt_logprobs is None and out.choices[0].logprobs is None
    ids = tok.encode(PROMPT)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, echo=True, n=2)
    assert [c.text for c in by_ids.choices] == [tok.decode(ids) + completion(tok, 5)] * 2


def test_echo_with_logprobs_covers_the_prompt_first_with_offsets_into_the_echoed_text(client, served, tok):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, echo=True, logprobs=2)
    choice = out.choices[0]
    assert served[1].last.params.prompt_logprobs == 2 and served[1].last.params.logprobs == 2
    assert choice.text == PROMPT + completion(tok, 4)
    assert_echoed_logprobs(tok, choice.text, choice.logprobs, tok.encode(PROMPT), 2, 4)
    assert "prompt_logprobs" not in choice.model_extra   # not asked for
    both = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, echo=True, logprobs=2,
                                     extra_body={"prompt_logprobs": 3})
    assert served[1].last.params.prompt_logprobs == 3   # the larger N, each shape cut to its own
    assert_echoed_logprobs(tok, both.choices[0].text, both.choices[0].logprobs, tok.encode(PROMPT), 2, 4)
    rows = both.choices[0].model_extra["prompt_logprobs"][1:]
    assert [len(row) for row in rows] == [3] * (len(tok.encode(PROMPT)) - 1)


def test_prompt_logprobs_have_vllms_shape_per_choice_on_completions_and_on_top_on_chat(served, tok):
    port, core = served
    status, body = post_json(port, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 3,
                                                       "prompt_logprobs": 2, "logprobs": 1, "n": 2})
    assert status == 200, body
    assert core.last.params.prompt_logprobs == 2 and core.last.params.logprobs == 1
    ids = tok.encode(PROMPT)
    for choice in body["choices"]:
        rows = choice["prompt_logprobs"]
        assert rows[0] is None and len(rows) == len(ids)
        for t, row in zip(ids[1:], rows[1:]):
            assert row[str(t)] == {"logprob": -0.25, "rank": 1 + t % 3, "decoded_token": tok.decode([t])}
            assert set(row) == {str(t), str(t + 1)}   # the token itself (also the top one) and the alternatives
            assert row[str(t + 1)] == {"logprob": -1.25, "rank": 2, "decoded_token": tok.decode([t + 1])}
        assert choice["text"] == completion(tok, 3) and len(choice["logprobs"]["tokens"]) == 3   # no echo
    messages = [{"role": "user", "content": PROMPT}]
    status, chat = post_json(port, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 2,
                                                            "prompt_logprobs": 0})
    assert status == 200, chat
    chat_ids = core.last.prompt
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) == len(chat_ids)
    assert [list(row) for row in chat["prompt_logprobs"][1:]] == [[str(t)] for t in chat_ids[1:]]
    assert "prompt_logprobs" not in chat["choices"][0] and chat["choices"][0]["logprobs"] is None


def test_a_streamed_echo_comes_in_each_choices_first_chunk(client, served, tok):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=7, echo=True, logprobs=1,
                                            n=2, stream=True))
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert mine[0].text.startswith(PROMPT) and "".join(c.text for c in mine) == PROMPT + completion(tok, 7)
        assert mine[0].logprobs.token_logprobs[0] is None
        tokens = [t for c in mine if c.logprobs for t in c.logprobs.tokens]
        offsets = [o for c in mine if c.logprobs for o in c.logprobs.text_offset]
        text = PROMPT + completion(tok, 7)
        assert len(tokens) == len(tok.encode(PROMPT)) + 7
        assert all(text[at:at + len(t)] == t for t, at in zip(tokens, offsets))
    plain = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, echo=True, stream=True))
    assert plain[0].choices[0].text.startswith(PROMPT) and plain[0].choices[0].logprobs is None


def test_stream_with_prompt_logprobs_is_refused_but_chat_echo_false_is_accepted(served):
    port, _ = served
    status, body = post_json(port, "/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "echo": False,
                                                            "messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200, body
    status, _, raw = request(port, "POST", "/v1/chat/completions", json.dumps(
        {"model": MODEL, "max_tokens": 2, "stream": True, "prompt_logprobs": 1,
         "messages": [{"role": "user", "content": "Hi"}]}).encode())
    assert status == 400 and json.loads(raw)["error"]["param"] == "prompt_logprobs"
