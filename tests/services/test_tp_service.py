"""One target service over two tensor-parallel ranks (gloo, both on one core): greedy output through a real
stack equals the in-process AR reference, prompt logprobs and a constrained output too; a dead follower takes
the target down with a clear log line, and followers go with their leader."""
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from ssd.cli.launcher import Stack, StackConfig
from ssd.client import Client
from ssd.constraints import Constraint, grammar_for
from ssd.control import describe, wait_serving
from ssd.engine.ar import AREngine
from ssd.models.loader import load_model
from ssd.models.parallel import free_port
from ssd.sampling import SamplingParams
from ssd.tokenizer import Tokenizer

N_PROMPTS, N_TOKENS = 2, 16


@pytest.fixture(scope="module")
def reference(default_models, chat_prompts):
    engine = AREngine(load_model(default_models["target"]), max_batch=N_PROMPTS)
    params = SamplingParams(max_tokens=N_TOKENS, ignore_eos=True)
    return [s.output for s in engine.generate(chat_prompts[:N_PROMPTS], params)]


@pytest.fixture(scope="module")
def tp_stack(default_models, tmp_path_factory):
    logs = tmp_path_factory.mktemp("tp-logs")
    cfg = StackConfig(mode="ssd", target_cpus="0", draft_cpus="1", threads=1, log_dir=logs,
                      extra={"target": ["--tp-size", "2"]})
    with Stack(cfg) as s:
        s.logs = logs
        yield s


def test_greedy_output_through_a_tp2_target_equals_in_process_ar(tp_stack, chat_prompts, reference):
    with Client(tp_stack.grpc_address, timeout=300) as client:
        for mode in ("ssd", "ar"):
            outputs = [client.generate(p, max_tokens=N_TOKENS, ignore_eos=True, mode=mode).token_ids
                       for p in chat_prompts[:N_PROMPTS]]
            assert outputs == reference, mode


def test_prompt_logprobs_through_a_tp2_target_equal_the_in_process_ones(tp_stack, default_models, chat_prompts,
                                                                        reference):
    """Every rank skips the prefix cache for such a prefill alike (a mismatch would hang the collectives)."""
    engine = AREngine(load_model(default_models["target"]), max_batch=1)
    (want,) = engine.generate(chat_prompts[:1], SamplingParams(max_tokens=1, ignore_eos=True, prompt_logprobs=2))
    with Client(tp_stack.grpc_address, timeout=300) as client:
        client.generate(chat_prompts[0], max_tokens=2, ignore_eos=True)   # the prompt is in the prefix cache
        got = client.generate(chat_prompts[0], max_tokens=N_TOKENS, ignore_eos=True, prompt_logprobs=2)
    assert got.token_ids == reference[0]
    assert [lp.token_id for lp in got.prompt_logprobs] == chat_prompts[0][1:]
    assert [lp.logprob for lp in got.prompt_logprobs] == pytest.approx([w.logprob for w in want.prompt_logprobs[1:]],
                                                                       abs=1e-4)
    same = [lp.rank == w.rank and [t.token_id for t in lp.top] == [t for t, _ in w.top]
            for lp, w in zip(got.prompt_logprobs, want.prompt_logprobs[1:])]
    assert sum(same) >= 0.9 * len(same)   # a rank or order may move at a near-tie: the shards sum in another order


def test_a_constrained_request_through_a_tp2_target_equals_constrained_ar(tp_stack, default_models):
    """Every rank masks its verify with the same grammar (the constraint rides the leader's broadcast)."""
    tok = Tokenizer.from_folder(default_models["target"])
    target = load_model(default_models["target"])
    grammar = grammar_for(default_models["target"], target.cfg.vocab_size)()
    pattern = "[0-9]{3}-[A-Z]{3}-[0-9]{3}"
    messages = [{"role": "user", "content": "Give me a product code."}]
    (want,) = AREngine(target, max_batch=1, grammar_tokenizer=grammar).generate(
        [tok.encode(tok.apply_chat_template(messages))],
        SamplingParams(max_tokens=N_TOKENS, constraint=Constraint("regex", pattern)))
    with Client(tp_stack.grpc_address, timeout=300) as client:
        got = client.generate(messages, max_tokens=N_TOKENS, mode="ssd", constraint=("regex", pattern))
    assert got.token_ids == want.output and re.fullmatch(pattern, got.text)
    assert got.completion_tokens - 1 - got.stats.rounds > 0 and got.stats.cache_hits > 0   # it speculated


def test_sampled_requests_without_a_seed_run_on_every_rank_alike(tp_stack, chat_prompts):
    """Unseeded sampling: the leader picks the seed, so the ranks stay in step (a divergence would hang)."""
    with Client(tp_stack.grpc_address, timeout=120) as client:
        out = client.generate(chat_prompts[0], max_tokens=N_TOKENS, ignore_eos=True, temperature=0.8, mode="ssd")
    assert len(out.token_ids) == N_TOKENS


@pytest.fixture(scope="module")
def tiny_dir(tiny_llama_dir, default_models, tmp_path_factory):
    """The tiny random Llama with a tokenizer.json (a worker needs one; its vocabulary does not matter here)."""
    folder = tmp_path_factory.mktemp("tiny-tp") / "tiny"
    shutil.copytree(tiny_llama_dir, folder)
    shutil.copy(default_models["target"] / "tokenizer.json", folder)
    return folder


def start_tiny_target(folder, log_path):
    """`ssd target --tp-size 2` on a tiny model, SERVING; returns (process, its follower)."""
    control = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "ssd.cli", "target", "--model", str(folder), "--tp-size", "2", "--threads", "1",
           "--control-address", control, "--data-address", f"tcp://127.0.0.1:{free_port()}"]
    proc = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not wait_serving(control, timeout=2):
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
    assert describe(control).preemptions == 0
    follower, = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    return proc, follower


def test_a_dead_follower_makes_the_target_exit_nonzero(tiny_dir, tmp_path):
    proc, follower = start_tiny_target(tiny_dir, tmp_path / "target.log")
    follower.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == 1
    assert "tensor-parallel rank 1 exited with code -9" in (tmp_path / "target.log").read_text()


def test_followers_exit_when_the_leader_dies(tiny_dir, tmp_path):
    proc, follower = start_tiny_target(tiny_dir, tmp_path / "target.log")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    follower.wait(timeout=10)   # raises psutil.TimeoutExpired while it still runs


def test_the_target_stops_its_followers_on_sigterm(tiny_dir, tmp_path):
    proc, follower = start_tiny_target(tiny_dir, tmp_path / "target.log")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    follower.wait(timeout=10)
