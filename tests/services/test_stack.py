"""Router, target and draft as real processes over gRPC + ZeroMQ: exact output, failures, bad frames."""
import signal
from concurrent.futures import ThreadPoolExecutor
import threading
import time

import pytest
import zmq

from ssd import wire
from ssd.client import Client
from ssd.control import describe



def generate_all(address, prompts, mode, max_tokens=32):
    """Run every prompt concurrently through the router; returns (token lists, results)."""
    with Client(address, timeout=300) as client, ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: client.generate(p, max_tokens=max_tokens, ignore_eos=True, mode=mode),
                                prompts))
    return [r.token_ids for r in results], results


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_greedy_output_through_stack_equals_in_process_ar(stack, chat_prompts, ar_reference, mode,
                                                           assert_speculated):
    outputs, results = generate_all(stack.grpc_address, chat_prompts, mode=mode)
    assert outputs == ar_reference
    if mode == "ar":
        assert all(r.stats.mode == "ar" for r in results)
    else:
        assert_speculated(results, mode)   # drafts were accepted (and, in ssd, taken from the cache)


def test_the_draft_runs_in_the_dtype_auto_resolves_to_and_the_target_in_float32(stack, default_models):
    """The stack above is the default settings' (no --dtype): its greedy outputs equal float32 AR (the test before),
    whatever the draft's dtype; its draft's KV takes the bytes per element of `resolve_dtype("auto", ...)` (bfloat16
    on a CPU with native bfloat16), the target's four (a draft's capacity also holds its branches' scratch rows:
    within half again its tokens, where the other element size would be off by twice)."""
    from ssd.config import ModelConfig
    from ssd.worker.service import resolve_dtype

    for control, folder, size in ((stack.draft_control[0], default_models["draft"],
                                   2 if resolve_dtype("auto", "cpu", "draft") == "bfloat16" else 4),
                                  (stack.target_control[0], default_models["target"], 4)):
        info, m = describe(control), ModelConfig.from_folder(folder)
        rows, tokens = info.kv_capacity_bytes / (2 * m.num_layers * m.num_kv_heads * m.head_dim * size), \
            info.kv_capacity_tokens + 1                                 # K and V; + the cache's pad row
        assert rows == int(rows) and tokens <= rows < 1.5 * tokens, (folder, size, rows, tokens)


def test_draft_killed_mid_generation_output_unchanged_and_restart_picked_up(stack, chat_prompts, ar_reference,
                                                                             assert_speculated):
    client = Client(stack.grpc_address)
    outputs: dict[int, list[int]] = {}

    def run(i):
        outputs[i] = client.generate(chat_prompts[i], max_tokens=32, ignore_eos=True, mode="ssd").token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60   # kill it while it holds sequences mid-generation
    while describe(stack.draft_control[0]).active_sequences == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    held = describe(stack.draft_control[0]).active_sequences
    stack.kill("draft0", signal.SIGKILL)
    for t in threads:
        t.join(timeout=240)
    assert held > 0   # the kill caught sequences on the draft
    assert [outputs[i] for i in range(4)] == ar_reference[:4]
    deadline = time.monotonic() + 10   # the router marks a worker dead 2 s after its last message
    while client.server_info().drafts and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.server_info().drafts == []

    stack.procs["draft0"].wait()
    stack.start_draft(0)
    deadline = time.monotonic() + 120
    while not client.server_info().drafts and time.monotonic() < deadline:
        time.sleep(0.5)
    assert client.server_info().drafts == [stack.draft_data[0]]
    again = client.generate(chat_prompts[0], max_tokens=16, ignore_eos=True, mode="sd")
    assert again.token_ids == ar_reference[0][:16]
    assert again.stats.cache_misses == 0  # sd: JIT drafts came from the new draft
    assert_speculated([again], "sd")


BAD_FRAMES = {
    "garbage": [b"\x00\xff\xfe", b"not msgpack at all"],
    "unknown type": [bytes([0x66]), b"\x90"],
    "single frame": [b"\x10"],
    "truncated msgpack": [bytes([0x10]), b"\x92\x01\x81\xa5items"],
    "wrong version": None,  # built below from a valid message
}
OVERSIZED = [bytes([0x10]), b"\x00" * (wire.MAX_FRAME_BYTES + 1)]  # ZeroMQ drops the peer (MAXMSGSIZE): no reply


def test_malformed_frames_are_rejected_logged_and_service_keeps_serving(stack, chat_prompts, ar_reference):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(stack.target_data[0])
    valid = wire.encode(wire.Free([12345]))
    frames = dict(BAD_FRAMES)
    frames["wrong version"] = [valid[0], valid[1].replace(bytes([wire.PROTOCOL_VERSION]), b"\x09", 1)]
    big = ctx.socket(zmq.DEALER)
    big.connect(stack.target_data[0])
    try:
        for name, f in frames.items():
            sock.send_multipart(f)
            assert sock.poll(5000), f"no reply to the {name} frame"
            reply = wire.decode(sock.recv_multipart())
            assert isinstance(reply, wire.Error) and reply.code == "bad_frame", name
        big.send_multipart(OVERSIZED)
        assert not big.poll(1000), "an oversized frame must not be read, let alone answered"
    finally:
        sock.close(0)
        big.close(0)
        ctx.term()
    outputs, _ = generate_all(stack.grpc_address, chat_prompts[:2], mode="ssd", max_tokens=16)
    assert outputs == [r[:16] for r in ar_reference[:2]]
    log_text = (stack.logs / "target.log").read_text()
    assert log_text.count("rejected a frame") >= len(frames)


def test_the_only_target_stalling_past_the_liveness_limit_loses_nothing(stack, chat_prompts, ar_reference):
    """SIGSTOP the target while it holds sequences until the router marks it dead (2 s of silence): its sequences
    wait for a live target, are restored from their committed tokens when it answers again, and finish with
    unchanged output."""
    from concurrent.futures import ThreadPoolExecutor as Pool

    marked = f"target {stack.target_data[0]} stopped answering"
    seen = (stack.logs / "router.log").read_text().count(marked)
    with Pool(1) as pool:
        future = pool.submit(generate_all, stack.grpc_address, chat_prompts[:3], "ssd")
        deadline = time.monotonic() + 120
        while describe(stack.target_control[0]).active_sequences == 0:
            assert time.monotonic() < deadline, "the target never held the sequences"
            time.sleep(0.02)
        stack.kill("target", signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 30
            while (stack.logs / "router.log").read_text().count(marked) == seen:
                assert time.monotonic() < deadline, "the router never marked the stopped target dead"
                time.sleep(0.05)
        finally:
            stack.kill("target", signal.SIGCONT)
        outputs, _ = future.result(timeout=300)
    assert outputs == ar_reference[:3]
