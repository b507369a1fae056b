"""Batched multi-token forwards over ragged sequences equal one-sequence-at-a-time forwards."""
import torch

from ssd.engine.ar import AREngine
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams


def test_ragged_verify_forward_equals_single_sequence(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (5, 17, 9)]
    extra = [torch.randint(3, 128, (k,), generator=g).tolist() for k in (4, 1, 3)]  # K+1 tokens each
    with torch.inference_mode():
        batched = model.make_cache(3, 64)
        model(ForwardBatch.ragged(prompts, [0, 0, 0], [0, 1, 2]), batched)
        starts = [len(p) for p in prompts]
        h = model(ForwardBatch.ragged(extra, starts, [0, 1, 2]), batched)
        for b, (p, e) in enumerate(zip(prompts, extra)):
            single = model.make_cache(1, 64)
            ref = model(ForwardBatch.ragged([p + e], [0], [0]), single)[0, len(p):]
            torch.testing.assert_close(h[b, :len(e)], ref, atol=1e-5, rtol=1e-5)


def test_batched_generation_equals_one_at_a_time(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (3, 11, 6, 20, 1)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    together = [s.output for s in AREngine(model, max_batch=3).generate(prompts, params)]
    alone = [AREngine(model, max_batch=1).generate([p], params)[0].output for p in prompts]
    assert together == alone
    assert all(len(o) == 24 for o in together)


def test_seeded_sampling_reproducible_in_any_batch(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=16, ignore_eos=True)
    other = SamplingParams(temperature=0.7, seed=5, max_tokens=16, ignore_eos=True)
    alone = AREngine(model).generate([[5, 6, 7]], p)[0].output
    mixed = AREngine(model).generate([[9, 9], [5, 6, 7], [4]], [other, p, other])[1].output
    assert alone == mixed
