"""Tests for ssd.sampling: parameter validation, the exact distributions, and draws."""

import math

import pytest
import torch

from ssd.sampling import (
    SamplingParams,
    is_stop,
    make_generator,
    probs_from_logits,
    sample,
    sample_sparse,
    to_dense,
    to_sparse,
)

CHI2_DF5_P999 = 20.515  # chi-square 0.999 quantile, 5 degrees of freedom


def _logits_with_probs(probs):
    return torch.tensor(probs, dtype=torch.float64).log().float()[None, :]


def _support(row):
    return set(torch.nonzero(row).flatten().tolist())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf),
        ("top_k", -1), ("top_k", 2.5), ("top_k", True),
        ("top_p", 0.0), ("top_p", 1.1), ("top_p", -0.5),
        ("min_p", -0.1), ("min_p", 1.0),
        ("seed", -1), ("seed", 2**64), ("seed", 1.5),
        ("max_tokens", 0), ("max_tokens", -3),
        ("stop_token_ids", [-1]), ("stop_token_ids", "ab"),
        ("ignore_eos", "yes"), ("seed_stream", 1),
    ],
)
def test_invalid_field_raises_value_error_naming_field_and_value(field, value):
    with pytest.raises(ValueError) as info:
        SamplingParams(**{field: value})
    assert field in str(info.value)
    assert repr(value) in str(info.value)


def test_list_stop_ids_become_tuple_and_default_is_greedy():
    params = SamplingParams(stop_token_ids=[3, 5])
    assert params.stop_token_ids == (3, 5)
    assert params.greedy
    assert not SamplingParams(temperature=0.5).greedy


def test_greedy_is_one_hot_on_torch_argmax_including_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0], [-2.0, -1.0, -1.0, -3.0]])
    logits = torch.cat([logits, torch.randn(5, 4, generator=make_generator(0))])
    probs = probs_from_logits(logits, SamplingParams())
    assert probs.dtype == torch.float32
    assert torch.equal(probs.argmax(dim=-1), torch.argmax(logits, dim=-1))
    assert torch.equal(probs.sum(dim=-1), torch.ones(8))
    assert probs[:3].argmax(dim=-1).tolist() == [1, 0, 1]


def test_all_greedy_batch_never_computes_softmax(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("softmax called on the greedy fast path")

    monkeypatch.setattr(torch, "softmax", boom)
    probs = probs_from_logits(torch.randn(3, 11), [SamplingParams(), SamplingParams(top_k=3), SamplingParams()])
    assert torch.equal(probs.sum(dim=-1), torch.ones(3))


def test_temperature_alone_is_softmax_of_scaled_logits():
    logits = torch.randn(2, 40, generator=make_generator(1))
    probs = probs_from_logits(logits, SamplingParams(temperature=0.7))
    torch.testing.assert_close(probs, torch.softmax(logits / 0.7, dim=-1))


def test_top_k_keeps_exactly_k_and_renormalises_softmax_over_them():
    logits = torch.randn(1, 50, generator=make_generator(2))
    probs = probs_from_logits(logits, SamplingParams(temperature=0.7, top_k=7))[0]
    full = torch.softmax(logits[0] / 0.7, dim=-1)
    keep = torch.topk(full, 7).indices
    expected = torch.zeros(50)
    expected[keep] = full[keep] / full[keep].sum()
    assert _support(probs) == set(keep.tolist())
    torch.testing.assert_close(probs, expected)


def test_top_k_ties_are_broken_toward_lower_token_ids():
    probs = probs_from_logits(torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]]), SamplingParams(temperature=1.0, top_k=2))
    assert _support(probs[0]) == {1, 2}
    torch.testing.assert_close(probs[0, 1:3], torch.tensor([0.5, 0.5]))


def test_top_k_at_least_vocab_size_is_off():
    logits = torch.randn(1, 6, generator=make_generator(3))
    torch.testing.assert_close(
        probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=6)),
        probs_from_logits(logits, SamplingParams(temperature=1.0)),
    )


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.8, {1, 3}), (0.81, {1, 3, 2}), (0.5, {1}), (0.49, {1}), (0.95, {1, 3, 2}), (0.951, {0, 1, 2, 3}),
     (1.0, {0, 1, 2, 3}), (1e-9, {1})],
)
def test_top_p_keeps_the_minimal_most_probable_prefix(top_p, kept):
    base = [0.05, 0.5, 0.15, 0.3]
    probs = probs_from_logits(_logits_with_probs(base), SamplingParams(temperature=1.0, top_p=top_p))[0]
    assert _support(probs) == kept
    mass = sum(base[i] for i in kept)
    expected = torch.tensor([base[i] / mass if i in kept else 0.0 for i in range(4)])
    torch.testing.assert_close(probs, expected)


def test_min_p_keeps_exactly_tokens_at_least_min_p_times_max():
    logits = torch.randn(4, 64, generator=make_generator(4)) * 2
    probs = probs_from_logits(logits, SamplingParams(temperature=0.9, min_p=0.1))
    full = torch.softmax(logits / 0.9, dim=-1)
    mask = full >= 0.1 * full.max(dim=-1, keepdim=True).values
    assert torch.equal(probs > 0, mask)
    torch.testing.assert_close(probs, full * mask / (full * mask).sum(dim=-1, keepdim=True))
    four = _logits_with_probs([0.4, 0.3, 0.2, 0.1])
    assert _support(probs_from_logits(four, SamplingParams(temperature=1.0, min_p=0.6))[0]) == {0, 1}
    assert _support(probs_from_logits(four, SamplingParams(temperature=1.0, min_p=0.3))[0]) == {0, 1, 2}


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    logits = _logits_with_probs([0.4, 0.3, 0.2, 0.1])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.75))
    assert _support(probs[0]) == {0, 1}  # 0.4 + 0.3 < 0.75, but 4/9 + 3/9 >= 0.75


def test_per_row_params_in_one_batch_equal_rows_computed_separately():
    logits = torch.randn(6, 100, generator=make_generator(5)) * 3
    rows = [
        SamplingParams(temperature=0.8, top_k=10),
        SamplingParams(),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=0.5, min_p=0.05),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.02),
    ]
    batched = probs_from_logits(logits, rows)
    for i, params in enumerate(rows):
        alone = probs_from_logits(logits[i : i + 1], params)[0]
        torch.testing.assert_close(batched[i], alone, rtol=0, atol=1e-7)
        assert _support(batched[i]) == _support(alone)
    assert batched[1].max() == 1.0 and int(batched[1].argmax()) == int(logits[1].argmax())


def test_low_precision_logits_give_float32_rows_summing_to_one():
    logits = (torch.randn(3, 30, generator=make_generator(6)) * 4).to(torch.bfloat16)
    probs = probs_from_logits(logits, [SamplingParams(temperature=t, top_p=0.9) for t in (0.01, 1.0, 5.0)])
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(dim=-1), torch.ones(3))


def test_params_count_must_match_batch():
    with pytest.raises(ValueError, match="2 SamplingParams"):
        probs_from_logits(torch.zeros(3, 4), [SamplingParams(), SamplingParams()])


def test_make_generator_is_none_without_seed_and_seeded_otherwise():
    assert make_generator(None) is None
    a, b = make_generator(123), make_generator(123)
    assert a.device.type == "cpu"
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))


def test_seeded_sampling_is_reproducible_and_independent_of_batch_composition():
    params = SamplingParams(temperature=1.0, top_k=20, seed=7)
    steps = torch.randn(12, 32, generator=make_generator(99))
    gen = make_generator(params.seed)
    alone = [int(sample(probs_from_logits(x[None], params), [gen])[0]) for x in steps]
    gen = make_generator(params.seed)
    again = [int(sample(probs_from_logits(x[None], params), [gen])[0]) for x in steps]
    assert alone == again

    rows = [SamplingParams(temperature=1.2, seed=1), SamplingParams(), params, SamplingParams(temperature=0.7)]
    gens = [make_generator(1), None, make_generator(params.seed), None]
    batched = []
    for x in steps:
        logits = torch.randn(4, 32)
        logits[2] = x
        batched.append(int(sample(probs_from_logits(logits, rows), gens)[2]))
    assert batched == alone


def test_one_hot_rows_return_argmax_without_consuming_randomness():
    gen = make_generator(11)
    state = gen.get_state()
    probs = probs_from_logits(torch.randn(2, 9), [SamplingParams(), SamplingParams(temperature=1.0, top_k=1)])
    tokens = sample(probs, [gen, gen])
    assert torch.equal(tokens, probs.argmax(dim=-1))
    assert torch.equal(gen.get_state(), state)


def _chi_square(counts, probs, n):
    expected = probs * n
    support = probs > 0
    return float((((counts - expected) ** 2)[support] / expected[support]).sum())


@pytest.mark.parametrize("source", ["own_generator", "global_rng"])
def test_empirical_distribution_of_sample_matches_probs(source):
    logits = torch.randn(1, 10, generator=make_generator(12))
    probs = probs_from_logits(logits, SamplingParams(temperature=0.8, top_k=6))[0]
    n = 20_000
    batch = probs.expand(n, -1)
    if source == "own_generator":
        tokens = sample(batch, [make_generator(2024)] * n)
    else:
        with torch.random.fork_rng():
            torch.manual_seed(2024)
            tokens = sample(batch)
    counts = torch.bincount(tokens, minlength=10).double()
    assert counts[probs == 0].sum() == 0
    assert _chi_square(counts, probs.double(), n) < CHI2_DF5_P999
    wrong = (probs > 0).double() / int((probs > 0).sum())
    assert _chi_square(counts, wrong, n) > 10 * CHI2_DF5_P999


def test_sample_sparse_draws_what_dense_sample_draws_for_the_same_seed():
    logits = torch.randn(1, 40, generator=make_generator(13))
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.9))
    ids, p = to_sparse(probs[0])
    for seed in range(200):
        dense = int(sample(probs, [make_generator(seed)])[0])
        assert sample_sparse(ids, p, make_generator(seed)) == dense


def test_to_sparse_to_dense_round_trip_keeps_the_support_sorted_by_id():
    logits = torch.randn(1, 50, generator=make_generator(14))
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=9))[0]
    ids, p = to_sparse(probs)
    assert ids.dtype == torch.int64 and p.dtype == torch.float32
    assert ids.tolist() == sorted(_support(probs))
    assert bool((p > 0).all())
    assert torch.equal(to_dense(ids, p, 50), probs)


def test_to_dense_rejects_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match="token ids"):
        to_dense(torch.tensor([0, 50]), torch.tensor([0.5, 0.5]), 50)


def test_sample_rejects_rows_without_mass_and_wrong_generator_count():
    with pytest.raises(ValueError, match="positive total mass"):
        sample(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="generators"):
        sample(torch.full((2, 4), 0.25), [None])


def test_stop_ids_always_stop_and_eos_stops_unless_ignored():
    params = SamplingParams(stop_token_ids=(7,))
    ignoring = SamplingParams(stop_token_ids=(7,), ignore_eos=True)
    assert is_stop(7, params, {2}) and is_stop(7, ignoring, {2})
    assert is_stop(2, params, {2}) and is_stop(2, params, 2)
    assert not is_stop(2, ignoring, {2})
    assert not is_stop(5, params, {2})
