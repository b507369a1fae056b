"""The static decode step behind the CUDA graph equals the ordinary forward; the graph equals its eager run."""
import pytest
import torch

from ssd.models.cuda_graph import DecodeGraph
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _decode_both(model, batch_size, n_rows, graph, device="cpu"):
    """Prefill n_rows prompts in two caches, then decode 6 greedy steps: ordinary forward vs DecodeGraph."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (4, 9, 2, 13)[:n_rows]]
    ref_cache, static_cache = model.make_cache(4, 64), model.make_cache(4, 64)
    dg = DecodeGraph(model, static_cache, batch_size)
    if graph:
        dg.capture()
    slots = list(range(n_rows))
    out_ref, out_static = [], []
    with torch.inference_mode():
        for cache in (ref_cache, static_cache):
            h = model(ForwardBatch.ragged(prompts, [0] * n_rows, slots, device), cache)
        last = [model.logits(h[b, len(p) - 1]).argmax().item() for b, p in enumerate(prompts)]
        tok_ref, tok_static, pos = list(last), list(last), [len(p) for p in prompts]
        for _ in range(6):
            fb = ForwardBatch.ragged([[t] for t in tok_ref], pos, slots, device)
            ref = model.logits(model(fb, ref_cache)[:, -1])
            static = dg.step(tok_static, pos, slots, graph=graph)
            out_ref.append(ref.clone()), out_static.append(static.clone())
            tok_ref, tok_static = ref.argmax(-1).tolist(), static.argmax(-1).tolist()
            pos = [p + 1 for p in pos]
    return out_ref, out_static


@pytest.mark.parametrize("batch_size,n_rows", [(4, 4), (4, 3), (1, 1)])
def test_static_decode_step_equals_ordinary_forward(tiny_llama_dir, batch_size, n_rows):
    model = load_model(tiny_llama_dir)
    ref, static = _decode_both(model, batch_size, n_rows, graph=False)
    for r, s in zip(ref, static):
        assert torch.equal(r.argmax(-1), s.argmax(-1))
        torch.testing.assert_close(s, r, atol=1e-5, rtol=1e-5)


def test_padding_rows_write_only_the_reserved_block(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    cache = model.make_cache(2, 32)
    dg = DecodeGraph(model, cache, 2)
    assert dg.pad_block not in cache.blocks.free
    dg.step([5], [0], [0], graph=False)
    assert dg.pad_block not in cache.tables[0]


@pytest.mark.gpu
@cuda
def test_graph_replay_equals_eager_on_cuda(tiny_llama_dir):
    model = load_model(tiny_llama_dir, device="cuda")
    ref, graphed = _decode_both(model, 4, 3, graph=True, device="cuda")
    for r, s in zip(ref, graphed):
        assert torch.equal(r.argmax(-1), s.argmax(-1))
        torch.testing.assert_close(s, r, atol=1e-4, rtol=1e-4)
