"""Several choices of one request (`n`, `best_of`) through the real stack (router, target and draft processes with
the default pair), over the OpenAI HTTP API (parsed by the openai client) and gRPC (the SDK): greedy choices equal
the single request, seeded choices differ and reproduce, best_of returns the candidates of the highest cumulative
logprob, streams carry each choice's index, the choices share the prompt's KV through the target's prefix cache,
one Abort ends them all, and bad values are refused naming the field."""
from __future__ import annotations

import uuid

import grpc
import openai
import pytest

from ssd.client import Client, Delta, Result
from ssd.control import describe
from ssd.pb import generation_pb2 as pb
from ssd.pb import generation_pb2_grpc as pb_grpc

TOKENS = 8
GREEDY = {"temperature": 0, "max_tokens": TOKENS, "extra_body": {"ignore_eos": True}}
WORDS = "Here is a list of random words:"   # a prompt whose continuations vary when sampled
SEED = 1234


@pytest.fixture(scope="module")
def http(stack):
    client = openai.OpenAI(base_url=f"http://{stack.http_address}/v1", api_key="unused", max_retries=0, timeout=300)
    return client, client.models.list().data[0].id


@pytest.fixture(scope="module")
def grpc_client(stack):
    with Client(stack.grpc_address, timeout=300) as client:
        yield client


def sampled(client, model, **fields):
    return client.completions.create(model=model, prompt=WORDS, max_tokens=TOKENS, temperature=1.0, seed=SEED,
                                     **fields)


def test_greedy_choices_all_equal_the_single_request(http, grpc_client):
    client, model = http
    messages = [{"role": "user", "content": "Name a colour."}]
    single = grpc_client.generate(messages=messages, max_tokens=TOKENS, ignore_eos=True)
    chat = client.chat.completions.create(model=model, messages=messages, n=3, **GREEDY)
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert [c.message.content for c in chat.choices] == [single.text] * 3
    assert chat.usage.prompt_tokens == single.prompt_tokens and chat.usage.completion_tokens == 3 * TOKENS
    assert [c.model_extra["ssd"]["finish_reason"] for c in chat.choices] == ["length"] * 3
    assert chat.model_extra["ssd"]["choices"] == 3 and chat.model_extra["ssd"]["rounds"] > 0
    results = grpc_client.generate(messages=messages, max_tokens=TOKENS, ignore_eos=True, n=2)
    assert [r.index for r in results] == [0, 1]
    assert [r.token_ids for r in results] == [single.token_ids] * 2
    assert all(r.finish_reason == "length" and r.completion_tokens == TOKENS for r in results)


def test_seeded_choices_differ_and_reproduce(http):
    client, model = http
    first, again = sampled(client, model, n=3), sampled(client, model, n=3)
    texts = [c.text for c in first.choices]
    assert len(set(texts)) == 3, texts                 # choice i samples with seed + i
    assert [c.text for c in again.choices] == texts    # the whole request reproduces
    single = sampled(client, model)
    assert single.choices[0].text == texts[0]          # choice 0 is the request's own seed


def test_best_of_returns_the_candidates_of_the_highest_cumulative_logprob(http, grpc_client):
    client, model = http
    every = sampled(client, model, n=3, logprobs=0)    # the same seeds, with each token's logprob
    scores = [sum(c.logprobs.token_logprobs) for c in every.choices]
    ranked = sorted(range(3), key=lambda i: -scores[i])
    one = sampled(client, model, n=1, best_of=3)
    assert [c.text for c in one.choices] == [every.choices[ranked[0]].text] and one.choices[0].index == 0
    assert one.choices[0].logprobs is None             # ranked by logprobs the request did not ask for
    assert one.usage.completion_tokens == len(every.choices[ranked[0]].logprobs.tokens)   # returned choices only
    two = sampled(client, model, n=2, best_of=3, logprobs=1)
    assert [c.text for c in two.choices] == [every.choices[i].text for i in ranked[:2]]
    assert [sum(c.logprobs.token_logprobs) for c in two.choices] == pytest.approx([scores[i] for i in ranked[:2]])
    best = grpc_client.generate(WORDS, max_tokens=TOKENS, temperature=1.0, seed=SEED, best_of=3)
    assert isinstance(best, Result) and best.text == one.choices[0].text


def test_streamed_choices_carry_their_index(http, grpc_client):
    client, model = http
    prompt = "The capital of France is"
    whole = client.completions.create(model=model, prompt=prompt, n=2, **GREEDY)
    chunks = list(client.completions.create(model=model, prompt=prompt, n=2, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    for i in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert "".join(c.text for c in mine) == whole.choices[i].text
        assert [c.finish_reason for c in mine if c.finish_reason] == ["length"]
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2 * TOKENS
    items = list(grpc_client.stream(prompt, max_tokens=TOKENS, ignore_eos=True, n=2))
    deltas, results = [x for x in items if isinstance(x, Delta)], items[-2:]
    assert {d.index for d in deltas} == {0, 1} and [r.index for r in results] == [0, 1]
    assert [r.text for r in results] == [c.text for c in whole.choices]
    assert all(isinstance(x, Delta) for x in items[:-2])


def test_choices_share_the_prompts_kv_through_the_targets_prefix_cache(stack, http):
    client, model = http
    prompt = f"Request {uuid.uuid4().hex}: " + "the quick brown fox jumps over the lazy dog " * 4  # never cached
    before = describe(stack.target_control[0])
    out = client.completions.create(model=model, prompt=prompt, n=3, max_tokens=2, temperature=0)
    after = describe(stack.target_control[0])
    length = out.usage.prompt_tokens
    shared = (length - 1) // 16 * 16   # the full blocks of all but the last prompt token (block size 16)
    assert shared >= 32
    assert after.prefix_cache_queried_tokens - before.prefix_cache_queried_tokens >= 3 * shared
    # choices 1 and 2 took the prompt's blocks that choice 0 registered, instead of computing them again
    assert after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens >= 2 * shared


def test_one_abort_ends_every_choice(grpc_client):
    rid = f"choices-{uuid.uuid4().hex}"
    stream = grpc_client.stream("Count to a thousand:", max_tokens=512, ignore_eos=True, n=2, request_id=rid)
    assert isinstance(next(stream), Delta)
    assert grpc_client.abort(rid)
    results = [x for x in stream if isinstance(x, Result)]
    assert [r.finish_reason for r in results] == ["abort", "abort"]
    assert all(len(r.token_ids) < 512 for r in results)


@pytest.mark.parametrize("fields, param", [
    ({"n": 0}, "n"), ({"n": 17}, "n"), ({"n": 2, "best_of": 1}, "best_of"), ({"best_of": 17}, "best_of"),
    ({"best_of": 2, "stream": True}, "best_of"),
])
def test_bad_choice_counts_are_a_400_naming_the_field(http, fields, param):
    client, model = http
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="Hi", max_tokens=2, **fields)
    assert e.value.param == param


@pytest.mark.parametrize("fields, field", [
    ({"n": 17}, "n"), ({"n": 3, "best_of": 2}, "best_of"), ({"n": 2, "resume_from": 3}, "resume_from")])
def test_bad_choice_counts_are_invalid_argument_over_grpc(stack, fields, field):
    with grpc.insecure_channel(stack.grpc_address) as channel:
        call = pb_grpc.GenerationStub(channel).Generate(pb.GenerateRequest(text="Hi", max_tokens=2, **fields),
                                                        timeout=60)
        with pytest.raises(grpc.RpcError) as e:
            list(call)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and e.value.details().startswith(f"{field}:")
