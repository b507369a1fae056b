"""Warming a worker up before it serves (`ssd.engine.warmup`): the request's calls run on a throwaway sequence,
and nothing of it stays: no sequence, no KV in use, no prefix-cache entry or lookup, the reported counters as
they were, and a request afterwards gets what it gets from a worker never warmed up."""
import pytest
import torch

from ssd.distill.train import init_from_target
from ssd.engine.draft import DraftParams, DraftWorker
from ssd.engine.target import TargetWorker
from ssd.engine.warmup import warm_up_draft, warm_up_target
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from ssd.wire.target import VerifyItem


def _counted(worker) -> list:
    calls = []
    inner = worker.forward

    def forward(*args, **kwargs):
        calls.append(tuple(args[0].input_ids.shape))
        return inner(*args, **kwargs)
    worker.forward = forward
    return calls


def _state(worker) -> tuple:
    st = worker.prefix_stats
    return (dict(worker.seqs), worker.cache.free_tokens, st.queried_tokens, st.hit_tokens, st.evictions)


@pytest.fixture(scope="module")
def target(tiny_llama_dir):
    return load_model(tiny_llama_dir)


@pytest.mark.parametrize("features", [False, True], ids=["plain-draft", "feature-draft"])
def test_draft_warm_up_runs_jit_and_speculation_and_leaves_nothing(target, features):
    torch.manual_seed(0)
    model = init_from_target(target, torch.arange(0, 128), feature_rms=3.0).eval() if features else target
    prompt = list(range(3, 30))

    def request(w):
        w.add(5, prompt, DraftParams())
        spec = w.jit([5])[0].tokens
        return spec, sorted((e.accepted, e.token, e.tokens) for e in w.speculate([(5, spec)])[5])

    fresh = DraftWorker(model, 2, 256, 3, [2, 2, 2, 2])
    expect = request(fresh)
    w = DraftWorker(model, 2, 256, 3, [2, 2, 2, 2])
    before = _state(w)
    counters = (w.last_jit_step_s, w.stepwise_glues, w.evictions, w.feature_rows_received)
    calls = _counted(w)
    warm_up_draft(w, rounds=2)
    # per round: the prompt, K - 1 JIT steps, then the glue and the K branch steps of the speculation round
    assert len(calls) >= 2 * (1 + 2 + 1 + 3)
    assert calls.count((1, 8)) == 2 * 3                  # K branch steps a round, each over all 2 x 4 forks
    assert _state(w) == before
    assert (w.last_jit_step_s, w.stepwise_glues, w.evictions, w.feature_rows_received) == counters
    assert w.prefix_caching
    assert request(w) == expect


def test_target_warm_up_runs_prefill_and_verify_and_leaves_nothing(target):
    prompt = list(range(3, 30))

    def request(t):
        first = t.prefill([(9, prompt, SamplingParams())])[0]
        out = t.verify([VerifyItem(9, [first, 4, 5], None)])[0]
        return first, out.accepted, out.token

    expect = request(TargetWorker(target, 2, 256))
    t = TargetWorker(target, 2, 256)
    before = _state(t)
    calls = []
    inner = t._run

    def run(*args, **kwargs):
        calls.append(kwargs.get("prefill", False))
        return inner(*args, **kwargs)
    t._run = run
    warm_up_target(t, k=3, rounds=2)
    assert calls.count(True) == 2 and calls.count(False) == 4   # a prefill and two verifies a round
    assert _state(t) == before and t.last_features == {} and t.prefix_caching
    assert request(t) == expect
