"""The paged KV cache: block accounting, prefix-cache bookkeeping, and forwards through block tables that equal
forwards through one contiguous block per sequence."""
import pytest
import torch

from ssd.models.blocks import BlockManager
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model


def test_blocks_are_reference_counted_and_returned():
    bm = BlockManager(4, 2)
    a = bm.allocate(3)
    assert bm.num_free == 1 and not bm.can_allocate(2)
    bm.release(a[:2])
    assert bm.num_free == 3
    with pytest.raises(MemoryError):
        bm.allocate(4)
    with pytest.raises(ValueError):
        bm.release(a[:1])


def test_reserved_blocks_serve_only_scratch():
    bm = BlockManager(4, 2, reserved=2)
    bm.allocate(2)
    assert not bm.can_allocate(1) and bm.can_allocate(2, scratch=True)
    with pytest.raises(MemoryError):
        bm.allocate(1)
    bm.allocate(2, scratch=True)


def test_prefix_match_is_chained_shared_and_evicted_least_recently_used():
    bm = BlockManager(6, 2)
    tokens = [1, 2, 3, 4, 5, 6]
    a = bm.allocate(3)
    bm.register(a, tokens, 0, 3, 0)
    b, _ = bm.match(tokens, 5)                 # only full blocks within the limit
    assert b == a[:2] and bm.ref[a[0]] == 2
    assert bm.match([9, 9, 3, 4], 4)[0] == []  # same second block after another first block: no hit
    bm.release(b)
    bm.release(a)                              # unreferenced, still cached
    assert bm.num_free == 6 and bm.match(tokens, 6)[0] == a
    bm.release(a)
    bm.match([1, 2], 2)                        # touch the first block: the others are older
    fresh = bm.allocate(4)                     # 3 free + 1 evicted: the LRU cached block (a[1])
    assert a[1] in fresh and a[0] not in fresh and bm.stats.evictions == 1
    assert bm.match(tokens, 6)[0] == [a[0]]


def _forward_two_ways(model, prompts, extra, block_size):
    with torch.inference_mode():
        cache = model.make_cache(3, 64, block_size=block_size)
        # interleave allocation so each sequence's blocks are scattered over the pool
        for n in range(64 // block_size):
            for s in range(3):
                cache.ensure(s, (n + 1) * block_size)
        model(ForwardBatch.ragged(prompts, [0] * 3, [2, 0, 1]), cache)
        return model(ForwardBatch.ragged(extra, [len(p) for p in prompts], [2, 0, 1]), cache)


def test_scattered_small_blocks_equal_one_block_per_sequence(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (5, 17, 9)]
    extra = [torch.randint(3, 128, (k,), generator=g).tolist() for k in (4, 1, 3)]
    paged = _forward_two_ways(model, prompts, extra, 4)
    whole = _forward_two_ways(model, prompts, extra, 64)
    assert torch.equal(paged, whole)


def test_prefix_hit_forward_equals_full_prefill(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(3, 128, (20,), generator=g).tolist()
    tail = torch.randint(3, 128, (6,), generator=g).tolist()
    with torch.inference_mode():
        cache = model.make_cache(2, 64, block_size=8)
        a = cache.allocate()
        model(ForwardBatch.ragged([shared + [7]], [0], [a]), cache)
        cache.register(a, shared + [7], 21)
        b = cache.allocate()
        hit = cache.match_prefix(b, shared + tail)
        assert hit == 16 and cache.tables[b][:2] == cache.tables[a][:2]
        h = model(ForwardBatch.ragged([(shared + tail)[hit:]], [hit], [b]), cache)[0, -1]
        ref_cache = model.make_cache(1, 64, block_size=8)
        ref = model(ForwardBatch.ragged([shared + tail], [0], [0]), ref_cache)[0, -1]
    torch.testing.assert_close(h, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_attention_on_cpu_runs_in_float32_for_a_bfloat16_model(tiny_llama_dir, monkeypatch, dtype):
    """torch's CPU SDPA in bfloat16 was 5x slower than on float32 copies at decode shapes (`UPCAST_ON_CPU`): a
    bfloat16 model's attention gets float32 q, k and v, and its layers still return bfloat16."""
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, **kw)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model = load_model(tiny_llama_dir, dtype=dtype)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (6, 11)]
    with torch.inference_mode():
        cache = model.make_cache(2, 64)
        h = model(ForwardBatch.ragged(prompts, [0, 0], [0, 1]), cache)
        step = model(ForwardBatch.ragged([[5], [9]], [6, 11], [0, 1]), cache)
    assert seen and all(d == (torch.float32,) * 3 for d in seen)
    assert h.dtype == step.dtype == dtype and bool(torch.isfinite(step).all())
