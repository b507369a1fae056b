"""The SDK in ssd.client against an in-process fake Generation servicer on 127.0.0.1 (no model, no router).

The fake streams a scripted completion, can fail its first N calls or fail after the first streamed response,
and records every request and its metadata, so each test checks one promise of the client's contract.
"""
import asyncio
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest

from ssd.client import (AsyncClient, AuthenticationError, Client, DeadlineExceededError, Delta,
                        InvalidRequestError, ResourceExhaustedError, Result, SSDError, UnavailableError,
                        build_request)
from ssd.pb import generation_pb2 as pb
from ssd.pb import generation_pb2_grpc as pb_grpc

SCRIPT = [pb.GenerateResponse(request_id="r1", token_ids=[5, 6], text="Hel"),
          pb.GenerateResponse(request_id="r1", token_ids=[7], text="lo"),
          pb.GenerateResponse(request_id="r1", token_ids=[8], text="!", finish_reason=pb.FINISH_REASON_LENGTH,
                              usage=pb.Usage(prompt_tokens=3, completion_tokens=4),
                              stats=pb.SpeculationStats(rounds=2, tokens_per_round=1.5, mode="ssd"),
                              time_to_first_token_s=0.25, total_time_s=1.0)]


class FakeServicer(pb_grpc.GenerationServicer):
    def __init__(self):
        self.requests, self.metadata, self.aborts = [], [], []
        self.calls = 0
        self.fail_first, self.fail_code, self.fail_details = 0, grpc.StatusCode.UNAVAILABLE, "router starting"
        self.fail_after_first = False  # True: every call fails after its first response; an int n: the first n
        self.resumable = False         # whether it honours resume_from (a router with request state)
        self.script, self.stall_s = SCRIPT, 0.0

    def _record(self, request, context) -> None:
        self.calls += 1
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        if self.calls <= self.fail_first:
            context.abort(self.fail_code, self.fail_details)

    def Generate(self, request, context):
        self._record(request, context)
        end = time.monotonic() + self.stall_s
        while context.is_active() and time.monotonic() < end:
            time.sleep(0.01)
        script, skip = self.script, request.resume_from if request.HasField("resume_from") else 0
        if skip:
            if not self.resumable:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this router keeps no request state")
            counts = [0]
            for resp in script:
                counts.append(counts[-1] + len(resp.token_ids))
            script = script[counts.index(skip):]  # the fake resumes at response boundaries only
        fail = self.fail_after_first is True or self.calls <= int(self.fail_after_first)
        for i, resp in enumerate(script):
            if i == 1 and fail:
                context.abort(grpc.StatusCode.UNAVAILABLE, "worker lost")
            yield resp

    def GetModelInfo(self, request, context):
        self._record(request, context)
        return pb.ModelInfo(model_id="fake-target", mode="ssd", k=4)

    def GetServerInfo(self, request, context):
        self._record(request, context)
        return pb.ServerInfo(active_requests=2, targets=["127.0.0.1:1"])

    def Abort(self, request, context):
        self._record(request, context)
        self.aborts.append(request.request_id)
        return pb.AbortResponse(found=request.request_id == "running")


@pytest.fixture
def fake():
    servicer = FakeServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_GenerationServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.address = f"127.0.0.1:{port}"
    yield servicer
    server.stop(None).wait()


def client(fake, **kw) -> Client:
    return Client(fake.address, backoff_base=0.01, **kw)


def test_generate_folds_the_stream_into_one_result(fake):
    with client(fake) as c:
        r = c.generate("hi", max_tokens=4)
    assert (r.text, r.token_ids, r.finish_reason, r.request_id) == ("Hello!", [5, 6, 7, 8], "length", "r1")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 4) == (r.prompt_tokens, r.completion_tokens)
    assert (r.stats.rounds, r.stats.mode, r.time_to_first_token_s, r.total_time_s) == (2, "ssd", 0.25, 1.0)


def test_stream_yields_deltas_then_the_result(fake):
    with client(fake) as c:
        items = list(c.stream("hi"))
    assert items[:-1] == [Delta([5, 6], "Hel"), Delta([7], "lo"), Delta([8], "!")]
    assert isinstance(items[-1], Result) and items[-1].deltas == items[:-1]


def test_options_map_to_request_fields_and_api_key_to_metadata(fake):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    with client(fake, api_key="sk-test") as c:
        c.generate(messages=messages, max_tokens=9, temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=123,
                   ignore_eos=True, stop_token_ids=[2], stop=["\n\n", "END"], request_id="req-7", mode="sd", k=3,
                   speculation_off=True)
    req = fake.requests[0]
    assert req.WhichOneof("prompt") == "chat"
    assert [(m.role, m.content) for m in req.chat.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert (req.max_tokens, req.ignore_eos, list(req.stop_token_ids), list(req.stop)) == (9, True, [2], ["\n\n", "END"])
    s = req.sampling
    assert (s.top_k, s.seed, s.HasField("seed")) == (40, 123, True)
    assert s.temperature == pytest.approx(0.7) and s.top_p == pytest.approx(0.9) and s.min_p == pytest.approx(0.05)
    assert (req.request_id, req.speculation.mode, req.speculation.k, req.speculation.off) == ("req-7", "sd", 3, True)
    assert fake.metadata[0]["authorization"] == "Bearer sk-test"


def test_prompt_forms():
    assert build_request("hi").text == "hi"
    assert [(m.role, m.content) for m in build_request("hi", chat=True).chat.messages] == [("user", "hi")]
    assert list(build_request([1, 2, 3]).token_ids.ids) == [1, 2, 3]
    assert build_request([{"role": "user", "content": "x"}]).WhichOneof("prompt") == "chat"
    assert not build_request("hi").sampling.HasField("seed")


@pytest.mark.parametrize("kwargs, field", [({"max_tokens": -1}, "max_tokens"), ({"seed": -5}, "sampling.seed"),
                                           ({"messages": [{"role": "user"}]}, "messages[0]"),
                                           ({"prompt": 3.5}, "prompt")])
def test_malformed_request_is_refused_before_sending_naming_the_field(kwargs, field):
    kwargs.setdefault("prompt", None if "messages" in kwargs else "hi")
    with pytest.raises(InvalidRequestError, match=r"^INVALID_ARGUMENT: " + field.replace("[", r"\[")):
        build_request(**kwargs)


def test_unavailable_before_the_first_response_is_retried(fake):
    fake.fail_first = 2
    with client(fake) as c:
        r = c.generate("hi")
    assert fake.calls == 3 and r.token_ids == [5, 6, 7, 8] and r.text == "Hello!"


def test_retries_stop_after_max_retries(fake):
    fake.fail_first = 100
    with client(fake, max_retries=3) as c, pytest.raises(UnavailableError) as err:
        c.generate("hi")
    assert fake.calls == 4 and err.value.code == "UNAVAILABLE" and err.value.details == "router starting"


def test_invalid_argument_is_not_retried(fake):
    fake.fail_first, fake.fail_code, fake.fail_details = 1, grpc.StatusCode.INVALID_ARGUMENT, "max_tokens: too big"
    with client(fake) as c, pytest.raises(InvalidRequestError) as err:
        c.generate("hi")
    assert fake.calls == 1
    assert (err.value.code, err.value.details) == ("INVALID_ARGUMENT", "max_tokens: too big")


def test_unavailable_after_the_first_response_resumes_only_where_the_router_keeps_state(fake):
    fake.fail_after_first = True
    seen = []
    with client(fake) as c, pytest.raises(UnavailableError, match="worker lost.*cannot be resumed") as err:
        for item in c.stream("hi"):
            seen.append(item)
    assert fake.calls == 2 and seen == [Delta([5, 6], "Hel")] and "after 2 tokens" in err.value.details
    first, second = fake.requests
    assert first.request_id and second.request_id == first.request_id  # the SDK named the stream
    assert not first.HasField("resume_from") and second.resume_from == 2


def test_a_broken_stream_is_resumed_without_repeating_a_token(fake):
    fake.fail_after_first, fake.resumable = 2, True  # the first two calls break after their first response
    with client(fake) as c:
        items = list(c.stream("hi"))
    assert [i.token_ids for i in items[:-1]] == [[5, 6], [7], [8]] and items[-1].text == "Hello!"
    assert [r.resume_from for r in fake.requests[1:]] == [2, 3] and fake.calls == 3


def test_resuming_a_stream_that_keeps_breaking_stops_after_max_resumes(fake):
    fake.fail_after_first, fake.script = True, [pb.GenerateResponse(token_ids=[i]) for i in range(20)]
    fake.resumable = True
    with client(fake, max_resumes=3) as c, pytest.raises(UnavailableError, match="worker lost"):
        c.generate("hi")
    assert fake.calls == 4


def test_several_addresses_fail_over_to_the_next_router():
    servers, fakes = [], []
    for _ in range(2):
        f = FakeServicer()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_GenerationServicer_to_server(f, server)
        f.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        server.start()
        servers.append(server)
        fakes.append(f)
    fakes[0].fail_after_first, fakes[1].resumable = True, True
    try:
        with Client(f"{fakes[0].address},{fakes[1].address}", backoff_base=0.01) as c:
            r = c.generate("hi")
        assert r.token_ids == [5, 6, 7, 8] and r.text == "Hello!"
        assert fakes[0].calls == 1 and fakes[1].calls == 1 and fakes[1].requests[0].resume_from == 2
    finally:
        for server in servers:
            server.stop(None).wait()


@pytest.mark.parametrize("code, error", [(grpc.StatusCode.UNAUTHENTICATED, AuthenticationError),
                                         (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhaustedError),
                                         (grpc.StatusCode.INTERNAL, SSDError)])
def test_status_codes_map_to_typed_errors(fake, code, error):
    fake.fail_first, fake.fail_code = 1, code
    with client(fake) as c, pytest.raises(error) as err:
        c.model_info()
    assert type(err.value) is error and err.value.code == code.name and fake.calls == 1


def test_timeout_raises_deadline_exceeded(fake):
    fake.stall_s = 5.0
    with client(fake, timeout=30) as c, pytest.raises(DeadlineExceededError):
        c.generate("hi", timeout=0.2)


def test_stream_ending_without_final_response_is_an_error(fake):
    fake.script = SCRIPT[:1]
    with client(fake) as c, pytest.raises(SSDError, match="without its final response"):
        c.generate("hi")


def test_unary_rpcs_retry_and_abort_returns_the_servicers_answer(fake):
    fake.fail_first = 1
    with client(fake, api_key="k") as c:
        assert c.model_info().model_id == "fake-target"
        assert c.server_info().active_requests == 2
        assert c.abort("running") is True
        assert c.abort("finished-long-ago") is False
    assert fake.calls == 5 and fake.aborts == ["running", "finished-long-ago"]
    assert all(md["authorization"] == "Bearer k" for md in fake.metadata)


def test_async_client_has_the_same_behaviour(fake):
    async def main():
        async with AsyncClient(fake.address, api_key="sk-a", backoff_base=0.01) as c:
            items = [item async for item in c.stream("hi", chat=True, seed=7, stop=["x"], mode="ar")]
            result = await c.generate([1, 2], request_id="a-1")
            info = await c.model_info()
            found = await c.abort("running"), await c.abort("nope")
            await c.server_info()
        return items, result, info, found

    fake.fail_first = 1
    items, result, info, found = asyncio.run(main())
    assert items[:-1] == [Delta([5, 6], "Hel"), Delta([7], "lo"), Delta([8], "!")]
    assert items[-1].finish_reason == "length" and result.text == "Hello!" and result.request_id == "r1"
    assert info.model_id == "fake-target" and found == (True, False)
    first, second = fake.requests[1], fake.requests[2]  # requests[0] failed with UNAVAILABLE and was retried
    assert first.HasField("resume_from") and first.resume_from == 0  # a retry is a resumption from 0 tokens
    first.ClearField("resume_from")
    assert first == fake.requests[0] and first.chat.messages[0].content == "hi" and first.sampling.seed == 7
    assert (list(first.stop), first.speculation.mode) == (["x"], "ar")
    assert list(second.token_ids.ids) == [1, 2] and second.request_id == "a-1"
    assert all(md["authorization"] == "Bearer sk-a" for md in fake.metadata)


def test_async_client_errors_and_retry_safety(fake):
    async def expect(error, **options):
        async with AsyncClient(fake.address, backoff_base=0.01) as c:
            with pytest.raises(error) as err:
                async for _ in c.stream("hi", **options):
                    pass
        return err.value

    fake.fail_after_first = True
    assert "worker lost" in asyncio.run(expect(UnavailableError)).details and fake.calls == 2
    fake.fail_after_first, fake.resumable, fake.calls, fake.requests = 1, True, 0, []

    async def resumed():
        async with AsyncClient(fake.address, backoff_base=0.01) as c:
            return await c.generate("hi")
    assert asyncio.run(resumed()).token_ids == [5, 6, 7, 8] and fake.requests[1].resume_from == 2
    fake.resumable = False
    fake.fail_after_first, fake.calls, fake.fail_first = False, 0, 100
    asyncio.run(expect(UnavailableError))
    assert fake.calls == 4
    fake.calls, fake.fail_first, fake.fail_code = 0, 1, grpc.StatusCode.INVALID_ARGUMENT
    assert asyncio.run(expect(InvalidRequestError)).code == "INVALID_ARGUMENT" and fake.calls == 1
    fake.calls, fake.fail_first, fake.stall_s = 0, 0, 5.0
    asyncio.run(expect(DeadlineExceededError, timeout=0.2))


def test_client_module_does_not_import_torch():
    code = "import sys, ssd.client; assert 'torch' not in sys.modules, 'ssd.client imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
