"""Several choices over the OpenAI HTTP API's wire, through the real aiohttp app and Frontend over the fake core
(tests/services/http_fakes.py): each choice's index, role chunk and finish, usage counting the prompt once,
completions' text_offset per choice, per-choice `ssd` and the merged one, a failing choice failing the request,
and an abort before the first token ending every choice; the SDK's checks. The real stack's behaviour is
tests/services/test_choices.py."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from services.router.choices import Fanout, choice_seed
from ssd.client import InvalidRequestError, build_request
from services.router.frontend import Final, Frontend
from ssd.params import FinishReason
from tests.services.http_fakes import MODEL, FakeCore, post_json, request, served, tok  # noqa: F401 (fixtures)


def events(raw: bytes) -> list[dict]:
    parts = raw.decode().split("\n\n")
    assert parts[-2:] == ["data: [DONE]", ""]
    return [json.loads(p[len("data: "):]) for p in parts[:-2]]


def test_whole_choices_have_their_index_usage_offsets_and_stats(served, tok):
    status, body = post_json(served.port, "/v1/completions",
                             {"model": MODEL, "prompt": "Hi", "max_tokens": 5, "n": 3, "logprobs": 0})
    assert status == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"] == {"prompt_tokens": len(tok.encode("Hi")), "completion_tokens": 15,
                             "total_tokens": len(tok.encode("Hi")) + 15}
    for c in body["choices"]:
        assert c["logprobs"]["text_offset"][0] == 0 and len(c["logprobs"]["tokens"]) == 5   # each from its start
        assert c["ssd"]["finish_reason"] == "length" and c["ssd"]["rounds"] == 2
    assert body["ssd"]["choices"] == 3 and body["ssd"]["rounds"] == 6 and "finish_reason" not in body["ssd"]


def test_chat_stream_sends_a_role_chunk_and_a_finish_per_choice(served):
    status, _, raw = request(served.port, "POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 7, "n": 2, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200
    chunks = events(raw)
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("role")]
    assert roles == [0, 1]
    finishes = [(c["choices"][0]["index"], c["ssd"]["finish_reason"]) for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [(0, "length"), (1, "length")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 14


def test_a_failing_choice_fails_the_request(served):
    served.core.fail = "target: boom"
    try:
        status, body = post_json(served.port, "/v1/completions", {"model": MODEL, "prompt": "Hi", "n": 2})
    finally:
        served.core.fail = None
    assert status == 503 and body["error"]["message"] == "target: boom"


def test_seeds_of_the_choices_and_an_abort_before_the_first_token(tok):
    assert [choice_seed(7, i) for i in range(3)] == [7, 8, 9]
    assert choice_seed(2 ** 64 - 1, 1) == 0 and choice_seed(None, 3) is None
    core = FakeCore(tok)
    core.delay = 60.0   # the first chunk never comes before the abort
    front = Frontend(core, tok)
    g = front.build(text="Hi", max_tokens=4, temperature=1.0, seed=5, n=3, request_id="r")
    got = []
    fan = Fanout(front, g, lambda i: SimpleNamespace(put=lambda event, i=i: got.append((i, event))))
    fan.start()
    assert [s.request_id for s in fan.subs] == ["r", "r/1", "r/2"] and [s.params.seed for s in fan.subs] == [5, 6, 7]
    fan.abort()
    out = [item for i, event in got for item in fan.on_event(i, event)]
    assert core.aborted == {"r": FinishReason.ABORT} and fan.done
    assert [(i, f.reason, f.completion_tokens) for i, f in out] == [(j, FinishReason.ABORT, 0) for j in range(3)]
    assert all(isinstance(f, Final) for _, f in out)


def test_choice_0_aborted_after_its_first_tokens_ends_the_unstarted_others(tok):
    core = FakeCore(tok)
    core.delay = 60.0   # the fake's own chunks never come: the test feeds candidate 0's events itself
    front = Frontend(core, tok)
    g = front.build(text="Hi", max_tokens=4, n=2, request_id="q")
    fan = Fanout(front, g, lambda i: SimpleNamespace(put=lambda event: None))
    fan.start()
    delta = fan.on_event(0, ("tokens", tok.encode(" The")))   # prefilled; ssd waits for its first round too
    assert [i for i, _ in delta] == [0] and core.last.rid == "q"
    out = fan.on_event(0, ("done", FinishReason.ABORT))
    assert [(i, f.reason) for i, f in out] == [(0, FinishReason.ABORT), (1, FinishReason.ABORT)] and fan.done
    assert core.last.rid == "q"   # choice 1 was never submitted


@pytest.mark.parametrize("fields, field", [({"n": 0}, "n"), ({"n": 17}, "n"), ({"n": 3, "best_of": 2}, "best_of"),
                                           ({"best_of": 17}, "best_of"), ({"n": True}, "n")])
def test_the_sdk_refuses_bad_choice_counts_before_sending(fields, field):
    with pytest.raises(InvalidRequestError) as e:
        build_request("Hi", **fields)
    assert e.value.details.startswith(f"{field}: ")
    assert build_request("Hi", n=3, best_of=5).best_of == 5
