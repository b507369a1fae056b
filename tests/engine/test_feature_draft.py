"""The draft worker with a feature-reading draft: proposals follow the training-time chain exactly, KV
computed from the draft's own estimates is recomputed once the target's features arrive, and SD/SSD outputs
stay the target's."""
import pytest
import torch

from ssd.distill.train import init_from_target
from ssd.distill.unroll import unrolled_logits
from ssd.engine.ar import AREngine
from ssd.engine.draft import DraftParams, DraftWorker
from ssd.engine.features import FeatureBlock, from_wire, to_wire
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from tests.engine.perturbed import feature_draft, target_features


@pytest.fixture(scope="module", params=[1, 2], ids=["1-layer", "2-layer"])
def pair(tiny_llama_dir, request):
    target = load_model(tiny_llama_dir)
    return target, feature_draft(target, request.param)


def test_wire_form_round_trips():
    blk = FeatureBlock(7, torch.randn(3, 16).to(torch.float16))
    back = from_wire(*to_wire(blk), 16)
    assert back.start == 7 and torch.equal(back.rows, blk.rows)
    with pytest.raises(ValueError, match="float16 rows"):
        from_wire(0, b"\x00" * 30, 16)


def test_jit_follows_the_unrolled_chain(pair):
    target, draft = pair
    tokens = list(range(3, 40))
    feats = target_features(target, tokens)
    assert feats.start == 0 and feats.rows.shape == (len(tokens), 64)
    w = DraftWorker(draft, 2, 256, 4, [1] * 5)
    w.add(0, tokens, DraftParams(), feats)
    drafted = w.jit([0], 4)[0].tokens
    toks = torch.tensor(tokens + drafted)
    f = torch.zeros(len(toks), 64)
    f[:len(tokens)] = feats.rows.float()
    logits = unrolled_logits(draft, toks[None], f[None], 4)
    expect = [int(draft.vocab_ids[logits[k][0, len(tokens) - 1 + k].argmax()]) for k in range(4)]
    assert drafted == expect


def test_estimated_kv_is_recomputed_when_features_arrive(pair):
    target, draft = pair
    tokens = list(range(5, 30))
    w = DraftWorker(draft, 2, 256, 3, [1] * 4)
    w.add(0, tokens, DraftParams(), target_features(target, tokens))
    spec = w.jit([0], 3)[0].tokens               # KV of spec[0..1] is written from the draft's estimates
    committed = tokens + spec[:2] + [77]
    full = target_features(target, committed)
    w.commit(0, spec[:2] + [77], FeatureBlock(len(tokens) - 1, full.rows[len(tokens) - 1:len(committed) - 1]))
    assert w.seqs[0].fresh < len(tokens) + 2     # the accepted tokens' KV is stale ...
    again = w.jit([0], 3)[0].tokens
    fresh = DraftWorker(draft, 2, 256, 3, [1] * 4, prefix_caching=False)
    fresh.add(0, committed, DraftParams(), FeatureBlock(0, full.rows[:len(committed) - 1]))
    assert again == fresh.jit([0], 3)[0].tokens  # ... and recomputed: same as a draft built from scratch
    assert w.seqs[0].fresh == len(committed)


def test_features_arrive_after_a_forward_grew_the_buffer(pair):
    """The feature buffer may first be made (or grown) inside a forward's inference mode; features that arrive
    later, outside it, still land (a draft service crashed on this once)."""
    target, draft = pair
    tokens = list(range(3, 30))
    w = DraftWorker(draft, 2, 256, 3, [1] * 4)
    w.add(0, tokens, DraftParams())                 # no features: the forward below makes the buffer (64 rows)
    spec = w.jit([0], 3)[0].tokens
    full = target_features(target, tokens + spec[:1] + [5])
    w.commit(0, spec[:1] + [5], FeatureBlock(0, full.rows[:len(tokens) + 1]))
    assert w.seqs[0].nfeat == len(tokens) + 1 and len(w.jit([0], 3)[0].tokens) == 3


def test_features_with_gaps_and_bad_shapes(pair):
    _, draft = pair
    w = DraftWorker(draft, 2, 256, 3, [1] * 4)
    w.add(0, list(range(10)), DraftParams(), FeatureBlock(4, torch.ones(3, 64, dtype=torch.float16)))
    s = w.seqs[0]
    assert s.nfeat == 7 and s.feats[1:5].abs().sum() == 0 and s.feats[5:8].eq(1).all()
    with pytest.raises(ValueError, match=r"\[n, 64\]"):
        w.commit(0, [1], FeatureBlock(7, torch.ones(1, 32, dtype=torch.float16)))
    assert len(w.jit([0], 3)[0].tokens) == 3


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_greedy_and_seeded_outputs_are_the_targets(pair, mode):
    target, draft = pair
    prompts = [[1, 5, 9, 13], [1, 7, 7, 7, 7, 7, 2, 40], list(range(1, 30))]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ref = [s.output for s in AREngine(target, max_batch=4).generate(prompts, params)]
    engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=3), max_batch=4)
    assert [s.output for s in engine.generate(prompts, params)] == ref
    # every prompt row, then j + 1 rows per verify (a finished sequence's last round is not passed on)
    last_rounds = len(prompts) * (3 + 1)
    assert engine.draft.feature_rows_received >= sum(len(p) for p in prompts) + engine.stats.tokens - last_rounds


def _forwards(worker):
    """Counts the worker's forwards (its `forward` attribute, wrapped)."""
    calls = []
    inner = worker.forward

    def counted(*args, **kwargs):
        calls.append(args[0].input_ids.shape)
        return inner(*args, **kwargs)
    worker.forward = counted
    return calls


def _entries(published):
    return [(e.accepted, e.token, e.tokens) for e in published]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_glue_after_a_jit_is_one_forward_with_the_same_entries(pair, temperature):
    """After a JIT, the glue over [last committed token, s1..sK] reads the outputs the JIT computed: one forward
    instead of K + 1, and the cache entries are those of the step-by-step glue."""
    target, draft = pair
    tokens = list(range(3, 35))
    feats = target_features(target, tokens)
    params = DraftParams(temperature, 16 if temperature else 0, seed=5)
    out = {}
    for reuse in (True, False):
        w = DraftWorker(draft, 2, 256, 3, [3, 2, 2, 2])
        w.add(0, tokens, params, feats)
        spec = w.jit([0], 3)[0].tokens
        if not reuse:
            w.seqs[0].chains = None       # what a speculation the draft did not make gets: the stepwise glue
        calls = _forwards(w)
        out[reuse] = _entries(w.speculate([(0, spec)])[0]), len(calls)
    (reused, n_reused), (stepwise, n_stepwise) = out[True], out[False]
    assert reused == stepwise and len(reused) == 9
    assert (n_reused, n_stepwise) == (1 + 3, 1 + 3 + 3)   # glue (+ K steps), then K branch steps


def test_glue_after_a_hit_reads_the_branch_that_made_the_speculation(pair):
    """A round whose speculation is the cache entry of the outcome that came: the glue is one forward, its
    inputs the outputs that branch computed; what follows stays consistent (its next entries are proposals
    from the same draft, and engine outputs stay the target's: test_greedy_and_seeded_outputs_are_the_targets)."""
    target, draft = pair
    tokens = list(range(3, 35))
    w = DraftWorker(draft, 2, 256, 3, [2, 2, 2, 2])
    w.add(0, tokens, DraftParams(), target_features(target, tokens))
    spec = w.jit([0], 3)[0].tokens
    entries = w.speculate([(0, spec)])[0]
    e = next(x for x in entries if x.accepted == 1)   # outcome: s1 accepted, then t* = the fork's token
    committed = tokens + spec[:1] + [e.token]
    full = target_features(target, committed)
    w.commit(0, spec[:1] + [e.token], FeatureBlock(len(tokens) - 1, full.rows[len(tokens) - 1:len(committed) - 1]))
    calls = _forwards(w)
    again = w.speculate([(0, e.tokens)])[0]
    assert len(calls) == 1 + 3 and len(again) == 8
    assert all(x.token != e.tokens[x.accepted] for x in again if x.accepted < 3)   # forks exclude the drafted token
    # outcome (0, t*) of a fork the draft made, but then a speculation it never made (say an n-gram backup's):
    # the stepwise glue
    t = next(x.token for x in again if x.accepted == 0)
    w.commit(0, [t], FeatureBlock(len(committed) - 1, target_features(target, committed + [t]).rows[-2:-1]))
    calls.clear()
    w.speculate([(0, [7, 8, 9])])
    assert len(calls) == 1 + 3 + 3


def test_sampled_ssd_with_a_feature_draft_follows_the_targets_distribution(tmp_path):
    """Temperature 1 through SSD with a feature draft (its glue reading the chain outputs it kept, its forks and
    branches drawn from q, cache hits): 4-token outputs follow the target's exactly computed distribution."""
    from tests.engine.test_sampling_exactness import PARAMS, PROMPT, chi_square_p, exact_ar, tiny

    target = tiny(tmp_path / "t", 0)
    torch.manual_seed(3)
    draft = init_from_target(target, torch.arange(target.cfg.vocab_size), feature_rms=3.0)
    with torch.no_grad():
        draft.fc_weight.add_(torch.randn_like(draft.fc_weight) * 0.3)
    engine = SpeculativeEngine(target, draft.eval().requires_grad_(False),
                               SpecConfig(mode="ssd", k=2, budget=6, draft_top_k=0), max_batch=512, max_len=32)
    n = 8000
    seqs = engine.generate([PROMPT] * n, [SamplingParams(seed=i, **PARAMS) for i in range(n)])
    assert chi_square_p([tuple(s.output) for s in seqs], exact_ar(target, SamplingParams(**PARAMS))) > 1e-3
    stats = engine.stats
    assert 0 < stats.acceptance_rate < 1 and stats.cache.get("hit", 0) > 0
    assert engine.draft.stepwise_glues == 0   # every speculation was the draft's own: the one-forward glue


def test_a_round_depth_grows_shorter_chains_in_fewer_steps_and_a_hit_on_one_reads_its_outputs(pair):
    """`depths` (the K the next round runs): the chains grow only that many tokens, in that many branch steps, and
    are the prefixes of the full-depth ones; one group may mix depths (the longest sets the steps). After a hit on
    a short entry the glue still reads the outputs its branch computed (one forward). A depth past K is refused."""
    target, draft = pair
    prompts = [list(range(3, 35)), list(range(40, 70))]
    params = DraftParams(1.0, 16, seed=5)   # sampled: the proposals are cut with the chains

    def worker():
        w = DraftWorker(draft, 2, 256, 3, [2, 2, 2, 2])
        for i, p in enumerate(prompts):
            w.add(i, p, params, target_features(target, p))
        return w, [w.jit([i], 3)[0].tokens for i in range(2)]

    w, specs = worker()
    full = w.speculate([(0, specs[0]), (1, specs[1])])
    for depths, steps in (({0: 1, 1: 1}, 1), ({0: 1, 1: 3}, 3), ({0: 2, 1: 0}, 3)):
        w, specs = worker()
        calls = _forwards(w)
        short = w.speculate([(0, specs[0]), (1, specs[1])], depths=depths)
        assert len(calls) == 1 + steps, depths
        for i in (0, 1):
            d = depths[i] or 3
            assert [(e.accepted, e.token) for e in short[i]] == [(e.accepted, e.token) for e in full[i]]
            assert [e.tokens for e in short[i]] == [e.tokens[:d] for e in full[i]], (depths, i)
            assert all(len(e.proposal) == d for e in short[i])

    w, specs = worker()
    entries = w.speculate([(0, specs[0])], depths={0: 1})[0]
    e = next(x for x in entries if x.accepted == 1)
    committed = prompts[0] + specs[0][:1] + [e.token]
    full_feats = target_features(target, committed)
    n = len(prompts[0])
    w.commit(0, specs[0][:1] + [e.token], FeatureBlock(n - 1, full_feats.rows[n - 1:len(committed) - 1]))
    calls = _forwards(w)
    again = w.speculate([(0, e.tokens)], depths={0: 1})[0]
    assert len(calls) == 1 + 1 and {len(x.tokens) for x in again} == {1}
    for bad in (4, -1):
        with pytest.raises(ValueError, match="depth must be 0"):
            w.speculate([(0, e.tokens)], depths={0: bad})
