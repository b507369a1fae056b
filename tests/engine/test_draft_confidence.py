"""The draft's confidence stop (`DraftWorker(min_confidence=...)`, the draft service's `--min-confidence`): a chain
(a JIT's or a branch's) ends before the first token past its first at which the product of q(token) along it falls
below the threshold; what it keeps is the prefix of the full chain, and output stays the target's."""
import pytest
import torch

from ssd.engine.ar import AREngine
from ssd.engine.draft import DraftParams, DraftWorker
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from services.draft.service import DraftConfig, draft_role
from tests.engine.perturbed import feature_draft, target_features

K = 5


@pytest.fixture(scope="module")
def pair(tiny_llama_dir):
    target = load_model(tiny_llama_dir)
    return target, feature_draft(target)


def _recording(worker):
    """Each `_propose` call's `last_confidence`, in order (the worker's method wrapped)."""
    seen = []
    inner = worker._propose

    def propose(*args, **kwargs):
        out = inner(*args, **kwargs)
        seen.append(list(worker.last_confidence) if worker.last_confidence is not None else None)
        return out
    worker._propose = propose
    return seen


def _forwards(worker):
    calls = []
    inner = worker.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return inner(*args, **kwargs)
    worker.forward = counted
    return calls


def _stop_length(confidences, tau, depth):
    """The rule: keep token d (0-based) while d == 0 or the running product through d is >= tau."""
    product = 1.0
    for d, c in enumerate(confidences[:depth]):
        product *= c
        if d > 0 and product < tau:
            return d
    return min(depth, len(confidences))


def _thresholds(products):
    """Thresholds that cut after 1, 2, ... tokens of a chain whose running products are `products`."""
    return [(products[d - 1] * products[d]) ** 0.5 for d in range(1, len(products)) if products[d] < products[d - 1]]


@pytest.mark.parametrize("params", [DraftParams(), DraftParams(1.0, 16, seed=5)], ids=["greedy", "sampled"])
def test_a_jit_chain_stops_where_the_drafts_confidence_runs_out(pair, params):
    target, draft = pair
    prompt = list(range(3, 40))

    def worker(tau):
        w = DraftWorker(draft, 2, 256, K, [1] * (K + 1), min_confidence=tau)
        w.add(0, prompt, params, target_features(target, prompt))
        return w

    w = worker(1e-30)   # confidences measured, nothing cut
    seen = _recording(w)
    full = w.jit([0], K)[0]
    conf = [c[0] for c in seen]
    assert len(full.tokens) == K and w.confidence_stops == 0 and all(0 < c <= 1 for c in conf)
    products = torch.tensor(conf).cumprod(0).tolist()
    taus = _thresholds(products)
    assert taus, products
    for tau in taus:
        w = worker(tau)
        calls = _forwards(w)
        got = w.jit([0], K)[0]
        n = _stop_length(conf, tau, K)
        assert 1 <= n < K and got.tokens == full.tokens[:n], (tau, products)
        assert len(calls) == n + 1 and w.confidence_stops == 1   # the step that made the cut token, no more
        if params.temperature:
            assert got.proposal == full.proposal[:n]
        else:
            assert got.proposal is None
    # off: full chains and no confidence measured
    w = worker(0.0)
    seen = _recording(w)
    assert w.jit([0], K)[0].tokens == full.tokens and seen == [None] * K


def test_branch_chains_stop_one_by_one_and_the_steps_end_when_all_have(pair):
    target, draft = pair
    prompt = list(range(5, 45))
    fanout = [2, 2, 1, 1, 1, 1]

    def worker(tau):   # the speculation being verified is the full JIT chain; its branches stop at `tau`
        w = DraftWorker(draft, 2, 256, K, fanout)
        w.add(0, prompt, DraftParams(), target_features(target, prompt))
        spec = w.jit([0], K)[0].tokens
        w.min_confidence = tau
        return w, spec

    w, spec = worker(1e-30)
    seen = _recording(w)
    full = w.speculate([(0, spec)])[0]
    steps = seen[-K:]   # the branch steps' confidences, one per chain (in entry order) per step
    per_chain = list(zip(*steps))
    assert len(per_chain) == len(full) == sum(fanout)
    lows = sorted(torch.tensor(c).cumprod(0)[1].item() for c in per_chain)
    tau = (lows[len(lows) // 2 - 1] * lows[len(lows) // 2]) ** 0.5 if lows[0] < lows[-1] else lows[0]
    w, spec = worker(tau)
    calls = _forwards(w)
    cut = w.speculate([(0, spec)])[0]
    assert [(e.accepted, e.token) for e in cut] == [(e.accepted, e.token) for e in full]
    lengths = []
    for e, f, c in zip(cut, full, per_chain):
        n = _stop_length(list(c), tau, K)
        assert e.tokens == f.tokens[:n], (tau, c)
        lengths.append(n)
    assert min(lengths) < K and w.confidence_stops == sum(n < K for n in lengths)
    assert len(calls) == 1 + min(K, max(lengths) + 1)   # the glue, then steps until every chain has stopped

    # a threshold every second token falls below: one branch step past the first, then none
    w, spec = worker(0.999999)
    calls = _forwards(w)
    assert {len(e.tokens) for e in w.speculate([(0, spec)])[0]} == {1} and len(calls) == 1 + 2


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_output_with_the_confidence_stop_is_the_targets(pair, mode):
    target, draft = pair
    prompts = [list(range(3, 30)), list(range(50, 70)), [7, 9, 11, 13]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    ref = [s.output for s in AREngine(target, max_batch=3).generate(prompts, params)]
    engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=K, min_confidence=0.05), max_batch=3)
    assert [s.output for s in engine.generate(prompts, params)] == ref
    stats = engine.stats
    assert engine.draft.confidence_stops > 0 and stats.rounds > 0
    assert stats.acceptance_rate > 0   # speculation happened: drafted tokens were accepted
    if mode == "ssd":
        assert stats.cache.get("hit", 0) > 0   # and rounds ran from the speculation cache
    assert sum(stats.offered) < K * stats.offered[0]   # chains did stop short of K


def test_a_threshold_outside_0_1_is_refused(pair, tiny_llama_dir):
    _, draft = pair
    for bad in (-0.1, 1.0, 2.0):
        with pytest.raises(ValueError, match=r"min_confidence must be in \[0, 1\)"):
            DraftWorker(draft, 2, 256, 3, [1] * 4, min_confidence=bad)
        role = draft_role(DraftConfig(min_confidence=bad), tiny_llama_dir)
        assert "--min-confidence must be in [0, 1)" in role.check()
    assert draft_role(DraftConfig(min_confidence=0.2), tiny_llama_dir).check() is None
