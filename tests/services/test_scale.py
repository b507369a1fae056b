"""Scale-out on real processes: a pool of drafts and several targets; failures move sequences, output unchanged."""
import signal
import threading
import time

import pytest

from ssd.cli.launcher import Stack, StackConfig
from ssd.client import Client
from ssd.control import describe


@pytest.fixture(scope="module")
def pool(default_models, tmp_path_factory):
    cfg = StackConfig(mode="ssd", drafts=2, targets=2, log_dir=tmp_path_factory.mktemp("pool-logs"), max_batch=16,
                      threads=1)
    with Stack(cfg) as s:
        yield s


def run_streams(address, prompts, n, max_tokens, during=None):
    outputs = {}
    with Client(address, timeout=600) as client:
        def one(i):
            outputs[i] = client.generate(prompts[i], max_tokens=max_tokens, ignore_eos=True, mode="ssd").token_ids

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        [t.start() for t in threads]
        if during is not None:
            during()
        [t.join(timeout=600) for t in threads]
    return [outputs.get(i) for i in range(n)]


def active(address):
    return describe(address).active_sequences


def wait_active(addresses, timeout=60.0) -> list[int]:
    """Active sequences on each worker, polled while streams run until every one holds some (or `timeout`
    passes): a fixed delay can come after short streams have finished."""
    deadline = time.monotonic() + timeout
    while True:
        counts = [active(a) for a in addresses]
        if all(counts) or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def test_sequences_spread_over_both_targets_and_drafts(pool, chat_prompts, ar_reference):
    seen = {}

    def sample_load():
        seen["t"] = wait_active(pool.target_control)
        seen["d"] = wait_active(pool.draft_control)

    assert run_streams(pool.grpc_address, chat_prompts, 8, 32, sample_load) == ar_reference[:8]
    assert all(n > 0 for n in seen["t"]) and all(n > 0 for n in seen["d"]), seen


def test_draft_replica_killed_while_8_streams_run(pool, chat_prompts, ar_reference):
    held = {}

    def kill():
        held["at_kill"], = wait_active([pool.draft_control[1]])
        pool.kill("draft1", signal.SIGKILL)

    assert run_streams(pool.grpc_address, chat_prompts, 8, 32, kill) == ar_reference[:8]
    assert held["at_kill"] > 0   # the kill caught sequences on draft1
    with Client(pool.grpc_address) as client:
        deadline = time.monotonic() + 10   # the router marks a worker dead 2 s after its last message
        while len(client.server_info().drafts) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.server_info().drafts == [pool.draft_data[0]]


def test_added_draft_receives_sequences(pool, chat_prompts, ar_reference):
    pool.procs["draft1"].wait()
    pool.start_draft(1)
    with Client(pool.grpc_address) as client:
        deadline = time.monotonic() + 120
        while len(client.server_info().drafts) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(client.server_info().drafts) == 2
    seen = {}

    def sample():
        seen["d1"], = wait_active([pool.draft_control[1]])

    assert run_streams(pool.grpc_address, chat_prompts, 6, 32, sample) == ar_reference[:6]
    assert seen["d1"] > 0


def test_target_killed_requests_complete_on_the_other(pool, chat_prompts, ar_reference):
    held = {}

    def kill():   # as soon as target1 holds sequences mid-generation
        held["at_kill"], = wait_active([pool.target_control[1]])
        pool.kill("target1", signal.SIGKILL)

    assert run_streams(pool.grpc_address, chat_prompts, 8, 32, kill) == ar_reference[:8]
    with Client(pool.grpc_address) as client:
        deadline = time.monotonic() + 10   # the streams can finish before the 2 s liveness limit runs out
        while len(client.server_info().targets) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.server_info().targets == [pool.target_data[0]]
    assert held["at_kill"] > 0   # the kill did catch sequences on target1
