"""The client-facing gRPC API through the SDK against a real stack: streaming, aborts, deadlines, stop strings,
bad requests."""
import threading
import time

import grpc
import pytest

from ssd.client import Client, Result
from ssd.control import describe
from ssd.engine.ar import AREngine
from ssd.models.loader import load_model
from ssd.pb import generation_pb2 as pb
from ssd.pb import generation_pb2_grpc as pb_grpc
from ssd.sampling import SamplingParams


def test_stream_concatenates_to_generate_and_equals_ar(stack, chat_prompts, ar_reference, assert_speculated):
    with Client(stack.grpc_address, timeout=300) as client:
        items = list(client.stream(chat_prompts[1], max_tokens=32, ignore_eos=True, mode="ssd"))
        final = items[-1]
        assert isinstance(final, Result)
        streamed_text = "".join(i.text for i in items[:-1])
        whole = client.generate(chat_prompts[1], max_tokens=32, ignore_eos=True, mode="ssd")
        # more rounds for the cache check: before the fan-out policy's short first window, this prompt's two
        # requests alone hit the cache in 0-4 of ~33 rounds on a fresh stack (its first entries arrived late)
        others = [client.generate(chat_prompts[i], max_tokens=32, ignore_eos=True, mode="ssd") for i in (2, 3, 4, 5)]
    assert final.token_ids == whole.token_ids == ar_reference[1]
    assert [r.token_ids for r in others] == ar_reference[2:6]
    assert streamed_text == whole.text == final.text
    assert final.finish_reason == "length" and final.completion_tokens == 32
    assert final.time_to_first_token_s <= final.total_time_s
    assert_speculated([final, whole, *others], "ssd")


def _workers_idle(stack):
    return (describe(stack.target_control[0]).active_sequences, describe(stack.draft_control[0]).active_sequences)


def test_hundred_aborted_streams_leak_nothing(stack, chat_prompts):
    channel = grpc.insecure_channel(stack.grpc_address)
    stub = pb_grpc.GenerationStub(channel)

    def one(i):
        req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=chat_prompts[i % len(chat_prompts)][-8:]), max_tokens=200,
                                 ignore_eos=True, speculation=pb.SpeculationOverrides(mode="ssd"))
        call = stub.Generate(req)
        next(call)  # the first token arrived: the request holds KV on every service
        call.cancel()

    for start in range(0, 100, 10):
        threads = [threading.Thread(target=one, args=(i,)) for i in range(start, start + 10)]
        [t.start() for t in threads]
        [t.join(timeout=120) for t in threads]
    deadline = time.monotonic() + 30
    with Client(stack.grpc_address) as client:
        while time.monotonic() < deadline:
            info = client.server_info()
            if info.active_requests == 0 and info.queued_requests == 0 and _workers_idle(stack) == (0, 0):
                break
            time.sleep(0.2)
        assert (info.active_requests, info.queued_requests) == (0, 0)
    assert _workers_idle(stack) == (0, 0)
    channel.close()


def test_deadline_ends_with_time_limit(stack, chat_prompts):
    with Client(stack.grpc_address) as client:
        t0 = time.monotonic()
        result = client.generate(chat_prompts[0], max_tokens=2000, ignore_eos=True, mode="ssd", timeout=2.0)
        elapsed = time.monotonic() - t0
    assert result.finish_reason == "time_limit"
    assert 0 < result.completion_tokens < 2000   # cut short: 2000 tokens take minutes on this CPU
    assert elapsed < 2.0 + 20.0   # the deadline plus rounds on a loaded machine, far short of the whole request


def test_stop_string_across_token_boundaries_is_never_emitted(stack, chat_prompts, ar_reference, default_models):
    from ssd.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(default_models["target"])
    full = tok.decode(ar_reference[2], skip_special_tokens=True)
    stop = full[len(full) // 2: len(full) // 2 + 5]  # 5 characters from the middle, likely spanning tokens
    assert stop.strip()
    with Client(stack.grpc_address) as client:
        items = list(client.stream(chat_prompts[2], max_tokens=32, ignore_eos=True, stop=[stop]))
    final = items[-1]
    assert final.finish_reason == "stop_string"
    assert final.text == full[:full.index(stop)]
    assert stop not in "".join(d.text for d in items[:-1])


def test_abort_rpc_ends_the_stream(stack, chat_prompts):
    with Client(stack.grpc_address) as client:
        stream = client.stream(chat_prompts[3], max_tokens=500, ignore_eos=True, request_id="abort-me")
        next(stream)
        assert client.abort("abort-me") is True
        final = [x for x in stream][-1]
        assert final.finish_reason == "abort"
        assert client.abort("abort-me") is False


def request(text=None, token_ids=None, messages=None, max_tokens=8, temperature=0.0, top_p=0.0, stop=(), mode=""):
    req = pb.GenerateRequest(max_tokens=max_tokens, stop=list(stop), sampling=pb.Sampling(temperature=temperature,
                             top_p=top_p), speculation=pb.SpeculationOverrides(mode=mode))
    if text is not None:
        req.text = text
    if token_ids is not None:
        req.token_ids.ids.extend(token_ids)
    for m in messages or []:
        req.chat.messages.add(**m)
    return req


BAD = [
    (dict(text=""), "prompt"),
    (dict(text="hi", max_tokens=100000), "max_tokens"),
    (dict(text="hi", temperature=-1.0), "temperature"),
    (dict(text="hi", top_p=1.5), "top_p"),
    (dict(token_ids=[10**6]), "prompt"),
    (dict(text="x " * 9000), "prompt"),   # past the 8192-token context
    (dict(messages=[{"role": "user", "content": "hi"}, {"role": "", "content": "x"}]), "messages"),
    (dict(text="hi", stop=["s"] * 17), "stop"),
    (dict(text="hi", mode="fast"), "speculation.mode"),
]


@pytest.mark.parametrize("kwargs,field", BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_bad_requests_get_invalid_argument_naming_the_field(stack, kwargs, field):
    channel = grpc.insecure_channel(stack.grpc_address)
    stub = pb_grpc.GenerationStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(request(**kwargs), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    ok = list(stub.Generate(request(text="Hello", max_tokens=2), timeout=60))  # and the server keeps serving
    assert ok[-1].usage.completion_tokens == 2
    channel.close()


def test_openai_package_against_the_real_stack(stack, chat_prompts, ar_reference, default_models):
    import urllib.request

    import openai

    from ssd.tokenizer import Tokenizer

    client = openai.OpenAI(base_url=f"http://{stack.http_address}/v1", api_key="unused")
    model = client.models.list().data[0].id

    def requests_total():
        text = urllib.request.urlopen(f"http://{stack.http_address}/metrics", timeout=10).read().decode()
        lines = [line for line in text.splitlines() if line.startswith("ssd_requests_total{")]
        assert lines and all(f'model_name="{model}"' in line for line in lines)   # request series name the model
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    before = requests_total()
    done = client.completions.create(model=model, prompt=chat_prompts[0], max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 16
    tok = Tokenizer.from_folder(default_models["target"])
    assert done.choices[0].text == tok.decode(ar_reference[0][:16], skip_special_tokens=True)
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}],
                                          max_tokens=8, temperature=0)
    chunks = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}],
                                            max_tokens=8, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    say_hi = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Say hi"}]))
    reference = AREngine(load_model(default_models["target"])).generate([say_hi], SamplingParams(max_tokens=8))[0]
    assert streamed == chat.choices[0].message.content == tok.decode(reference.output, skip_special_tokens=True)
    assert requests_total() - before == 3  # the metrics counted exactly this workload
