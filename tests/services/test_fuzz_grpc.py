"""Fuzzing ssd.v1.Generation on the real stack: random GenerateRequests while a normal stream runs.

Every request either completes or fails with INVALID_ARGUMENT (or FAILED_PRECONDITION for a resumption this
router cannot serve) and a message; never INTERNAL or UNKNOWN; and the normal stream is unaffected (it equals
the in-process AR output).
"""
import threading

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssd.client import Client, Result
from ssd.pb import generation_pb2 as pb
from ssd.pb import generation_pb2_grpc as pb_grpc

ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
U32 = st.integers(0, 2**32 - 1)
OUTCOMES: dict[str, int] = {}


_text = st.text(max_size=30)
_role = st.sampled_from(["user", "system", "assistant"])
# field -> (a valid value, an odd one): a request takes valid values but for up to two odd fields
FIELDS = {
    "prompt": (st.sampled_from(["text", "token_ids", "chat"]), st.just("none")),
    "text": (st.text(st.characters(codec="ascii", min_codepoint=33), min_size=1, max_size=30), _text),
    "token_ids": (st.lists(st.integers(0, 40_000), min_size=1, max_size=12), st.lists(U32, max_size=12)),
    "chat": (st.lists(st.tuples(_role, _text), min_size=1, max_size=3),
             st.lists(st.tuples(_text | st.just(""), _text), max_size=3)),
    "temperature": (st.sampled_from([0.0, 0.7]), st.floats(width=32)),
    "top_p": (st.sampled_from([0.0, 0.9, 1.0]), st.floats(width=32)),
    "min_p": (st.sampled_from([0.0, 0.1]), st.floats(width=32)),
    "top_k": (st.integers(0, 100), U32),
    "max_tokens": (st.integers(1, 4), st.sampled_from([8193, 10**6, 2**32 - 1])),
    "stop_token_ids": (st.lists(st.integers(0, 40_000), max_size=2), st.lists(U32, min_size=1, max_size=20)),
    "stop": (st.lists(st.text(min_size=1, max_size=4), max_size=2),
             st.lists(st.sampled_from(["", "x" * 300]) | _text, min_size=1, max_size=20)),
    "request_id": (st.just(""), _text),
    "mode": (st.sampled_from(["", "ar", "sd", "ssd"]), _text),
    "k": (st.integers(0, 3), U32),
    "resume_from": (st.none(), st.integers(0, 3)),
    "n": (st.sampled_from([0, 1, 2]), st.sampled_from([17, 2**32 - 1])),
    "best_of": (st.sampled_from([0, 2]), st.sampled_from([17, 2**32 - 1])),
}


@st.composite
def requests(draw) -> pb.GenerateRequest:
    odd = draw(st.sets(st.sampled_from(sorted(FIELDS)), max_size=2))
    v = {name: draw(pair[name in odd]) for name, pair in FIELDS.items()}
    req = pb.GenerateRequest(max_tokens=v["max_tokens"], ignore_eos=draw(st.booleans()),
                             stop_token_ids=v["stop_token_ids"], stop=v["stop"], request_id=v["request_id"],
                             n=v["n"], best_of=v["best_of"])
    if v["prompt"] == "text":
        req.text = v["text"]
    elif v["prompt"] == "token_ids":
        req.token_ids.ids.extend(v["token_ids"])
    elif v["prompt"] == "chat":
        req.chat.messages.extend(pb.ChatMessage(role=r, content=c) for r, c in v["chat"])
    s = req.sampling
    s.temperature, s.top_p, s.min_p, s.top_k = v["temperature"], v["top_p"], v["min_p"], v["top_k"]
    if draw(st.booleans()):
        s.seed = draw(st.integers(0, 2**64 - 1))
    s.seed_stream = draw(st.booleans())
    req.speculation.mode, req.speculation.k, req.speculation.off = v["mode"], v["k"], draw(st.booleans())
    if v["resume_from"] is not None:
        req.resume_from = v["resume_from"]
    return req


@pytest.fixture(scope="module")
def stub(stack):
    with grpc.insecure_channel(stack.grpc_address) as channel:
        yield pb_grpc.GenerationStub(channel)


@pytest.fixture(scope="module")
def normal_stream(stack, chat_prompts):
    """One ordinary greedy stream that runs while the fuzzing does."""
    out, started = {}, threading.Event()

    def run():
        with Client(stack.grpc_address, timeout=600) as client:
            for item in client.stream(chat_prompts[0], max_tokens=32, ignore_eos=True, mode="ssd"):
                started.set()
                if isinstance(item, Result):
                    out["ids"] = item.token_ids
        started.set()

    thread = threading.Thread(target=run)
    thread.start()
    started.wait(120)   # the fuzzing starts while the stream is running
    yield out, thread
    thread.join(timeout=600)


@settings(max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(requests())
def test_random_requests_succeed_or_fail_with_invalid_argument(stub, normal_stream, req):
    try:
        responses = list(stub.Generate(req, timeout=120))
    except grpc.RpcError as e:
        assert e.code() in ALLOWED and e.details(), (e.code(), e.details(), req)
        OUTCOMES[e.code().name] = OUTCOMES.get(e.code().name, 0) + 1
        return
    OUTCOMES["OK"] = OUTCOMES.get("OK", 0) + 1
    finals = [r for r in responses if r.finish_reason != pb.FINISH_REASON_UNSPECIFIED]
    assert sorted(r.index for r in finals) == list(range(req.n or 1)), req   # each choice ends once
    assert all(r.finish_reason != pb.FINISH_REASON_ERROR for r in finals), (finals, req)


def test_the_concurrent_normal_stream_was_unaffected(normal_stream, ar_reference):
    out, thread = normal_stream
    print("fuzzed requests by outcome:", OUTCOMES)
    thread.join(timeout=600)
    assert out.get("ids") == ar_reference[0]
