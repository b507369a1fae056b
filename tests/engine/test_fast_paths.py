"""The CPU hot paths give exactly what the plain formulations give."""
import pytest
import torch

from ssd.engine.ar import AREngine
from ssd.engine.draft import DraftParams, DraftWorker
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams


def test_paged_read_and_write_equal_advanced_indexing(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    cache = model.make_cache(3, 40, block_size=4)
    g = torch.Generator().manual_seed(1)
    fb = ForwardBatch.ragged([[1, 2, 3], [4], [5, 6, 7, 8, 9]], [0, 7, 2], [2, 0, 1])
    index = cache.index(fb.slots, fb.positions, fb.valid, fb.kv_len, fb.positions.amax(1) + 1)
    n = int(index.write.numel())
    k, v = torch.randn(n, 2, 16, generator=g), torch.randn(n, 2, 16, generator=g)
    expect_k = cache.k[1].clone()
    expect_k[index.write] = k
    valid = fb.valid if fb.valid is not None else torch.ones(fb.input_ids.shape, dtype=torch.bool)
    shaped = torch.zeros(*fb.input_ids.shape, 2, 16)
    shaped[valid] = k
    shaped_v = torch.zeros_like(shaped)
    shaped_v[valid] = v
    cache.write(1, index, shaped, shaped_v, fb.valid)
    assert torch.equal(cache.k[1], expect_k)
    keys, values = cache.read(1, index)
    assert torch.equal(keys, cache.k[1][index.read].transpose(1, 2))
    assert torch.equal(values, cache.v[1][index.read].transpose(1, 2))


def test_greedy_cache_entries_are_the_drafts_own_greedy_continuations(tiny_llama_dir):
    """Each entry (j, t*) of a round = greedy decoding of the draft from committed + s1..sj + t*."""
    model = load_model(tiny_llama_dir)
    k, fanout = 3, [2, 1, 1, 2]
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (6, 11)]
    specs = [torch.randint(3, 128, (k,), generator=g).tolist() for _ in prompts]
    worker = DraftWorker(model, 2, 64, k, fanout)
    for i, p in enumerate(prompts):
        worker.add(i, p, DraftParams())
    published = worker.speculate([(i, s) for i, s in enumerate(specs)])
    for i, (p, s) in enumerate(zip(prompts, specs)):
        assert len(published[i]) == sum(fanout)
        for entry in published[i]:
            j, t = entry.accepted, entry.token
            ar = AREngine(model, max_batch=1, max_len=64, eos_token_ids=())
            seq = ar.generate([p + s[:j] + [t]], SamplingParams(max_tokens=k, ignore_eos=True))[0]
            assert entry.tokens == seq.output, (i, j, t)


def test_batched_fork_selection_equals_select_forks():
    """Random and heavily tied scores (ties at the top-n boundary go the per-sequence way)."""
    from ssd.engine.forks import select_forks, select_forks_batch

    g = torch.Generator().manual_seed(3)
    for trial in range(60):
        V = int(torch.randint(4, 40, (1,), generator=g))
        specs = [torch.randint(0, V, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(int(torch.randint(1, 5, (1,), generator=g)))]
        # one fan-out for all, or (every third trial) one per sequence, as the router's online fan-out sends
        fanouts = [torch.randint(0, 4, (4,), generator=g).tolist()] * len(specs) if trial % 3 else \
            [torch.randint(0, 4, (4,), generator=g).tolist() for _ in specs]
        rows = sum(len(s) + 1 for s in specs)
        logits = torch.randn(rows, V, generator=g)
        if trial % 2:
            logits = logits.mul(2).round()   # many ties
        expect, at = [], 0
        for sp, fanout in zip(specs, fanouts):
            fan = fanout[:len(sp)] + [fanout[-1]]
            expect.append(select_forks(logits[at:at + len(sp) + 1], torch.tensor(sp, dtype=torch.long), fan))
            at += len(sp) + 1
        assert select_forks_batch(logits, specs, fanouts) == expect, trial


def test_a_fanout_override_sets_the_forks_per_position_and_is_checked(tiny_llama_dir):
    """The router's online fan-out: per sequence, F_j entries anticipate outcome j; a fan-out the draft cannot
    run (wrong length, negative, over its budget) is refused naming the problem."""
    model = load_model(tiny_llama_dir)
    k, fanout = 3, [2, 2, 2, 2]
    worker = DraftWorker(model, 2, 64, k, fanout)
    for i, p in enumerate(([5, 6, 7, 8], [9, 10, 11])):
        worker.add(i, p, DraftParams())
    published = worker.speculate([(0, [12, 13, 14]), (1, [15, 16, 17])], fanouts={1: [4, 1, 0, 3]})
    per_j = lambda entries: [sum(1 for e in entries if e.accepted == jj) for jj in range(k + 1)]  # noqa: E731
    assert per_j(published[0]) == fanout and per_j(published[1]) == [4, 1, 0, 3]
    for bad, message in (([1, 1, 1], "K\\+1 = 4 counts"), ([1, -1, 1, 1], "counts >= 0"),
                         ([3, 3, 3, 0], "more than this draft's budget 8")):
        with pytest.raises(ValueError, match=message):
            worker.speculate([(0, [1, 2, 3])], fanouts={0: bad})
