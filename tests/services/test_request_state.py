"""Request state in Redis with two routers sharing one target and one draft: a router killed mid-stream (the
SDK resumes on the other and the concatenated stream equals the uninterrupted output), a resumption that
fences a live router, a finished stream fetched again, a Redis restart mid-run, and the clear errors."""
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
import redis as redis_lib

from ssd.cli.launcher import Stack, StackConfig, free_port
from ssd.client import Client, Delta, build_request
from ssd.pb import generation_pb2_grpc as pb_grpc
from tests.redis_server import RedisServer, needs_redis

pytestmark = needs_redis
N = 32  # = conftest N_TOKENS: the ar_reference length


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"), persist=True).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def routers(default_models, redis, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    cfg = StackConfig(mode="ssd", routers=2, state_redis_url=redis.url, log_dir=logs, target_cpus="0",
                      draft_cpus="1", threads=1, extra={"router": ["--drain-timeout", "0.05"]})
    with Stack(cfg) as stack:
        stack.logs = logs
        yield stack


def stub(address: str) -> pb_grpc.GenerationStub:
    return pb_grpc.GenerationStub(grpc.insecure_channel(address))


def test_a_finished_stream_can_be_fetched_again_from_any_router(routers, chat_prompts, ar_reference):
    a, b = routers.grpc_addresses
    with Client(a, timeout=300) as client:
        full = client.generate(chat_prompts[1], max_tokens=N, ignore_eos=True, request_id="done-1")
    assert full.token_ids == ar_reference[1]
    request = build_request(chat_prompts[1], max_tokens=N, ignore_eos=True, request_id="done-1")
    request.resume_from = 10  # the client got 10 tokens and lost the rest, final response included
    responses = list(stub(b).Generate(request, timeout=60))
    assert [t for r in responses for t in r.token_ids] == ar_reference[1][10:]
    assert responses[-1].finish_reason and responses[-1].usage.completion_tokens == N
    assert full.text.endswith("".join(r.text for r in responses))


def test_a_resumed_stream_replays_the_logprobs_of_its_journaled_tokens(routers, chat_prompts):
    a, b = routers.grpc_addresses
    with Client(a, timeout=300) as client:
        full = client.generate(chat_prompts[2], max_tokens=16, ignore_eos=True, logprobs=2, request_id="lp-1")
    assert len(full.logprobs) == 16
    request = build_request(chat_prompts[2], max_tokens=16, ignore_eos=True, logprobs=2, request_id="lp-1")
    request.resume_from = 6
    responses = list(stub(b).Generate(request, timeout=60))
    replayed = [lp for r in responses for lp in r.logprobs]
    assert [t for r in responses for t in r.token_ids] == full.token_ids[6:]
    assert [(lp.token_id, lp.logprob, [t.token_id for t in lp.top]) for lp in replayed] == \
        [(lp.token_id, lp.logprob, [t.token_id for t in lp.top]) for lp in full.logprobs[6:]]


def test_resuming_needs_the_same_request(routers, chat_prompts):
    request = build_request(chat_prompts[1], max_tokens=N - 1, ignore_eos=True, request_id="done-1")
    request.resume_from = 3
    with pytest.raises(grpc.RpcError) as err:
        list(stub(routers.grpc_addresses[1]).Generate(request, timeout=60))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "differs from the journaled" in err.value.details()
    request = build_request(chat_prompts[1], max_tokens=4, request_id="never-seen")
    request.resume_from = 2
    with pytest.raises(grpc.RpcError) as err:
        list(stub(routers.grpc_addresses[0]).Generate(request, timeout=60))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "never-seen" in err.value.details()


def test_a_resumption_fences_the_router_that_was_streaming(routers, chat_prompts, ar_reference):
    """The client's connection to A broke but A lives on: B takes the stream over and A stops extending it."""
    a, b = routers.grpc_addresses
    first = stub(a).Generate(build_request(chat_prompts[2], max_tokens=N, ignore_eos=True, request_id="fence-1"),
                             timeout=120)
    got = list(next(first).token_ids)
    resume = build_request(chat_prompts[2], max_tokens=N, ignore_eos=True, request_id="fence-1")
    resume.resume_from = len(got)
    rest = [t for r in stub(b).Generate(resume, timeout=120) for t in r.token_ids]
    assert got + rest == ar_reference[2]
    with pytest.raises(grpc.RpcError) as err:  # A's stream ends (fenced) instead of racing B
        for _ in first:
            pass
    assert err.value.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED)


def test_streams_ride_out_a_redis_restart(routers, redis, chat_prompts, ar_reference):
    results, errors = {}, []

    def run(i):
        try:
            with Client(routers.grpc_addresses, timeout=300, max_retries=6) as client:
                results[i] = client.generate(chat_prompts[i], max_tokens=N, ignore_eos=True,
                                             request_id=f"restart{i}").token_ids
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3, 7)]
    for t in threads:
        t.start()
    journal = redis_lib.Redis.from_url(redis.url)
    deadline = time.monotonic() + 120   # Redis goes away once every stream has journaled tokens (mid-stream)
    while not all(journal.strlen(f"ssd:req:restart{i}:tok") for i in range(3, 7)):
        assert time.monotonic() < deadline and not errors, f"the streams never journaled tokens: {errors}"
        time.sleep(0.02)
    journal.close()
    redis.kill()
    time.sleep(1.0)   # the outage's length, not a wait for a state
    redis.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and all(results[i] == ar_reference[i] for i in range(3, 7))
    with Client(routers.grpc_addresses[1], timeout=300) as client:  # and new requests are journaled again
        assert client.generate(chat_prompts[7], max_tokens=8, ignore_eos=True).token_ids == ar_reference[7][:8]


def test_a_router_killed_mid_stream_the_sdk_resumes_on_the_other(routers, chat_prompts, ar_reference):
    deltas = []
    with Client(routers.grpc_addresses, timeout=300) as client:
        for item in client.stream(chat_prompts[0], max_tokens=N, ignore_eos=True):
            if isinstance(item, Delta):
                deltas.append(item)
                if len(deltas) == 2:
                    routers.kill("router")  # SIGKILL the router this stream runs on
            else:
                result = item
    assert result.token_ids == ar_reference[0] and result.finish_reason == "length"
    assert [t for d in deltas for t in d.token_ids] == ar_reference[0]  # nothing lost, nothing repeated
    assert routers.procs["router"].wait(timeout=10) != 0
    log = (routers.logs / "router1.log").read_text()
    assert "resuming" in log
    with Client(routers.grpc_addresses[1], timeout=300) as client:  # the same text as an uninterrupted stream
        again = client.generate(chat_prompts[0], max_tokens=N, ignore_eos=True)
    assert again.text == result.text


def test_a_drain_cut_short_hands_the_stream_to_another_router(routers, chat_prompts, ar_reference):
    """SIGTERM with a 0.05 s grace: the running stream ends with UNAVAILABLE and the SDK resumes it elsewhere. (With
    0.5 s the 31 tokens left finished inside the grace on a faster host, and nothing was cut short.)"""
    routers.start_router(0)  # the previous test killed it
    from ssd.control import wait_serving

    assert wait_serving(routers.grpc_addresses[0], timeout=120)
    deltas = []
    with Client(list(reversed(routers.grpc_addresses)), timeout=300) as client:
        for item in client.stream(chat_prompts[8], max_tokens=N, ignore_eos=True):
            if isinstance(item, Delta):
                deltas.append(item)
                if len(deltas) == 1:
                    routers.kill("router1", signal.SIGTERM)
            else:
                result = item
    assert result.token_ids == ar_reference[8] and [t for d in deltas for t in d.token_ids] == ar_reference[8]
    assert routers.procs["router1"].wait(timeout=30) == 0
    assert "drain timeout: ending 1 requests" in (routers.logs / "router1.log").read_text()
    deadline = time.monotonic() + 30  # the workers free the sequences of the router killed before
    while "freed 1 sequences of the departed router" not in (routers.logs / "target.log").read_text():
        assert time.monotonic() < deadline, "the target kept the dead router's sequence"
        time.sleep(0.5)


def test_a_router_without_state_refuses_to_resume(stack, chat_prompts):
    request = build_request(chat_prompts[0], max_tokens=4, request_id="x")
    request.resume_from = 2
    with pytest.raises(grpc.RpcError) as err:
        list(stub(stack.grpc_address).Generate(request, timeout=60))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "keeps no request state" in err.value.details()


def test_unreachable_state_redis_at_start_is_a_clear_error(default_models):
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "ssd.cli", "router", "--state-redis-url",
                          f"redis://127.0.0.1:{port}/0", "--grpc-address", "127.0.0.1:0", "--http-address", ""],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert f"cannot reach the request-state Redis at redis://127.0.0.1:{port}" in out.stderr
