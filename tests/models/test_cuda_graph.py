"""The static step behind the CUDA graphs computes what the ordinary forward does, for decode, verify and branch
steps; padding writes only the runner's reserved block; the engines give the same tokens through it; on a
CUDA device, the graph replays its eager run."""
import pytest
import torch

from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.cuda_graph import GraphRunner, graphed_forward, resolve_graphs
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _prompts(n, seed=5, lengths=(4, 9, 2, 13, 7)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (m,), generator=g).tolist() for m in lengths[:n]]


def _pair(model, runner_cache, ref_cache, prompts, device):
    """Prefill the prompts into both caches with the ordinary forward."""
    slots = list(range(len(prompts)))
    with torch.inference_mode():
        for cache in (ref_cache, runner_cache):
            h = model(ForwardBatch.ragged(prompts, [0] * len(prompts), slots, device), cache)
    return [model.logits(h[b, len(p) - 1]).argmax().item() for b, p in enumerate(prompts)]


def _assert_same(out, ref):
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("max_rows,n_rows", [(4, 4), (4, 3), (1, 1), (8, 5)])
def test_decode_and_verify_steps_equal_the_ordinary_forward(tiny_llama_dir, max_rows, n_rows):
    model = load_model(tiny_llama_dir)
    prompts = _prompts(n_rows)
    ref_cache, cache = model.make_cache(8, 64), model.make_cache(8, 64)
    runner = GraphRunner(model, cache, max_rows, graphs=False)
    first = _pair(model, cache, ref_cache, prompts, "cpu")
    slots, pos, toks = list(range(n_rows)), [len(p) for p in prompts], first
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for step in range(6):
            # decode steps, then verify-shaped steps of uneven length (a ragged batch with `valid`)
            rows = [[t] for t in toks] if step < 3 else \
                [[t] + torch.randint(3, 128, (1 + (b + step) % 3,), generator=g).tolist() for b, t in enumerate(toks)]
            fb = ForwardBatch.ragged(rows, pos, slots)
            ref = model(fb, ref_cache)
            out = runner(fb, cache)
            valid = fb.valid if fb.valid is not None else torch.ones(ref.shape[:2], dtype=torch.bool)
            _assert_same(out[valid], ref[valid])
            last = torch.tensor([len(r) - 1 for r in rows])
            toks = model.logits(ref[torch.arange(n_rows), last]).argmax(-1).tolist()
            pos = [p + len(r) for p, r in zip(pos, rows)]
    assert runner.stats.replays == 6 and runner.stats.fallbacks == 0
    live = [b for s in slots for b in cache.tables[s]]
    rows_of = lambda blocks: torch.cat([torch.arange(b * 16, (b + 1) * 16) for b in blocks])  # noqa: E731
    torch.testing.assert_close(cache.k[:, rows_of(live)], ref_cache.k[:, rows_of([b for s in slots
                                                                                  for b in ref_cache.tables[s]])])


def test_branch_step_with_mask_and_columns_equals_the_ordinary_forward(tiny_llama_dir):
    """A draft-style step: per row several queries at scratch columns, each attending the prefix and its own
    chain through an explicit mask, one padded query marked invalid."""
    model = load_model(tiny_llama_dir)
    prompts = _prompts(2, lengths=(6, 10))
    ref_cache, cache = model.make_cache(2, 32, scratch=16), model.make_cache(2, 32, scratch=16)
    runner = GraphRunner(model, cache, 2, graphs=False)
    _pair(model, cache, ref_cache, prompts, "cpu")
    for c in (cache, ref_cache):
        for s, p in enumerate(prompts):
            c.ensure(s, 40)
    L = [len(p) for p in prompts]
    cols = torch.tensor([[34, 36, 38], [35, 37, 39]])
    kv_len = 40
    col = torch.arange(kv_len)[None, None, :]
    prefix = torch.tensor([[L[0], L[0] - 1, L[0]], [L[1], L[1] - 2, L[1] - 1]])
    valid = torch.tensor([[True, True, False], [True, True, True]])
    mask = (col < prefix[:, :, None]) | (col == cols[:, :, None]) | (~valid[:, :, None] & (col == 0))
    fb = ForwardBatch(torch.tensor([[5, 6, 0], [7, 8, 9]]), prefix, torch.tensor([0, 1]), kv_len, valid, cols, mask)
    with torch.inference_mode():
        ref = model(fb, ref_cache)
        out = runner(fb, cache)
    _assert_same(out[valid], ref[valid])


def test_padding_writes_only_the_pad_row(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    cache = model.make_cache(3, 32)
    assert cache.pad_row == cache.blocks.num_blocks * cache.block_size == cache.k.shape[1] - 1
    runner = GraphRunner(model, cache, 4, graphs=False)
    before = cache.k.clone()
    with torch.inference_mode():
        runner(ForwardBatch.ragged([[5, 6]], [0], [0]), cache)
        # three rows (a bucket of four: one padding row), two of them one token short (marked invalid)
        runner(ForwardBatch.ragged([[7, 8], [5], [9]], [2, 0, 0], [0, 1, 2]), cache)
    assert runner.steps and all(k[0] in (1, 4) for k in runner.steps)
    changed = set((cache.k != before).any(dim=(0, 2, 3)).nonzero().flatten().tolist())
    own = {cache.tables[0][0] * 16 + c for c in range(4)} | {cache.tables[s][0] * 16 for s in (1, 2)}
    assert changed == own | {cache.pad_row}   # the padding tokens wrote the pad row, and nothing else


def test_shapes_outside_the_buckets_take_the_ordinary_forward(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    cache = model.make_cache(2, 64)
    runner = GraphRunner(model, cache, 2, max_tokens=8, graphs=False)
    with torch.inference_mode():
        runner(ForwardBatch.ragged([list(range(3, 23))], [0], [0]), cache)   # a 20-token prefill
        runner(ForwardBatch.ragged([[5]], [20], [0]), cache)
    assert (runner.stats.fallbacks, runner.stats.replays) == (1, 1)
    assert runner.key(ForwardBatch.ragged([[1]] * 3, [0] * 3, [0, 1, 0]), False) is None   # more rows than max


def test_resolve_graphs():
    assert resolve_graphs("auto", "cpu") == "off"
    assert resolve_graphs(None, "cpu") == "off"
    assert resolve_graphs("static", "cpu") == "static"
    assert resolve_graphs("off", "cpu") == "off"
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        resolve_graphs("on", "cpu")
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        resolve_graphs("sometimes", "cpu")


def test_engines_on_the_cpu_keep_the_ordinary_forward(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    assert AREngine(model, max_batch=2).forward is model
    assert isinstance(graphed_forward(model, model.make_cache(1, 16), 1, mode="static"), GraphRunner)
    with pytest.raises(ValueError, match="cuda_graphs"):
        AREngine(model, max_batch=2, cuda_graphs="bogus")


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_engines_through_the_static_steps_give_the_same_tokens(default_models, mode):
    """The default pair (a feature-reading draft), greedy and seeded sampling: the engines' tokens through the
    static steps equal the ordinary engines'."""
    target, draft = load_model(default_models["target"]), load_model(default_models["draft"])
    prompts = [list(range(100, 100 + n)) for n in (5, 17, 9)]
    params = [SamplingParams(max_tokens=20, ignore_eos=True),
              SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.8, seed=3),
              SamplingParams(max_tokens=20, ignore_eos=True)]

    def outputs(graphs):
        if mode == "ar":
            engine = AREngine(target, max_batch=3, max_len=128, cuda_graphs=graphs)
        else:
            engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=2), max_batch=3, max_len=128,
                                       cuda_graphs=graphs)
        return [s.output for s in engine.generate(prompts, params)], engine

    ref, _ = outputs("off")
    out, engine = outputs("static")
    assert out == ref
    runners = [engine.forward] if mode == "ar" else [engine.target.forward, engine.draft.forward]
    assert all(r.stats.replays > 0 for r in runners)


@pytest.mark.gpu
@cuda
def test_graph_replay_equals_the_static_step_on_cuda(tiny_llama_dir):
    model = load_model(tiny_llama_dir, device="cuda")
    prompts = _prompts(3)
    eager_cache, graph_cache = model.make_cache(4, 64), model.make_cache(4, 64)
    eager = GraphRunner(model, eager_cache, 4, graphs=False)
    graphed = GraphRunner(model, graph_cache, 4, graphs=True)
    toks = _pair(model, graph_cache, eager_cache, prompts, "cuda")
    pos, slots = [len(p) for p in prompts], [0, 1, 2]
    with torch.inference_mode():
        for step in range(5):
            rows = [[t] * (1 + step % 3) for t in toks]
            fb = ForwardBatch.ragged(rows, pos, slots, "cuda")
            a, b = eager(fb, eager_cache), graphed(fb, graph_cache)
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
            toks = model.logits(a[:, -1]).argmax(-1).tolist()
            pos = [p + len(r) for p, r in zip(pos, rows)]
    assert graphed.stats.captured >= 3 and graphed.stats.fallbacks == 0
