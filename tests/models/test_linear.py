"""`ssd.models.linear.linear`: the CPU small-row formulation gives F.linear's values, on the path its rule names."""
import pytest
import torch
import torch.nn.functional as F

from ssd.models.linear import linear, uses_weight_major


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8, 9, 17])
@pytest.mark.parametrize("shape", [(96, 32), (32, 96), (48, 48)])
def test_matches_f_linear(rows, shape):
    g = torch.Generator().manual_seed(rows * 100 + shape[0])
    w = torch.randn(*shape, generator=g)
    b = torch.randn(shape[0], generator=g)
    x = torch.randn(rows, shape[1], generator=g)
    for bias in (None, b):
        out = linear(x, w, bias)
        assert out.shape == (rows, shape[0]) and out.is_contiguous()
        torch.testing.assert_close(out, F.linear(x, w, bias), rtol=1e-5, atol=1e-5)


def test_leading_dimensions_are_rows():
    w = torch.randn(40, 24)
    x = torch.randn(1, 3, 24)   # a [batch, tokens, hidden] activation: 3 rows
    assert uses_weight_major(3, w)
    out = linear(x, w)
    assert out.shape == (1, 3, 40)
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_rule():
    wide, narrow = torch.randn(64, 16), torch.randn(16, 64)
    assert uses_weight_major(1, narrow) and uses_weight_major(2, narrow)   # 1-2 rows: always
    assert not uses_weight_major(3, narrow)                                # a down projection from 3 rows on
    assert uses_weight_major(8, wide) and not uses_weight_major(9, wide)
    assert not uses_weight_major(0, wide)
    assert not uses_weight_major(1, wide.to(torch.bfloat16))               # fp32 only


def test_other_dtypes_fall_through():
    w = torch.randn(32, 16, dtype=torch.bfloat16)
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    assert torch.equal(linear(x, w), F.linear(x, w))


def assert_gradients_match_f_linear(x, w):
    linear(x, w).square().sum().backward()
    gw, gx = w.grad.clone(), x.grad.clone()
    w.grad = x.grad = None
    F.linear(x, w).square().sum().backward()
    torch.testing.assert_close(gw, w.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, x.grad, rtol=1e-5, atol=1e-5)


def test_gradients_match():
    assert_gradients_match_f_linear(torch.randn(2, 10, requires_grad=True), torch.randn(30, 10, requires_grad=True))


# --- packed weights -------------------------------------------------------------------------------------------

import ssd.models.linear as linear_mod  # noqa: E402
from ssd.models.linear import pack, pack_model, packed, packing_enabled, unpacked_linear  # noqa: E402

needs_packing = pytest.mark.skipif(not packing_enabled(), reason="this torch has no oneDNN packed inner product")


@pytest.fixture
def packed_calls(monkeypatch):
    """How many products `linear` sent to the packed kernel."""
    calls = []
    real = linear_mod._packed_product

    def spy(x2d, copy, bias):
        calls.append(x2d.shape[0])
        return real(x2d, copy, bias)
    monkeypatch.setattr(linear_mod, "_packed_product", spy)
    return calls


def _bf16_packable() -> bool:
    """Whether this CPU's oneDNN lays out bfloat16 weights (it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 8, dtype=torch.bfloat16), 4)
        return True
    except (AttributeError, RuntimeError):
        return False


@needs_packing
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 6, 16, 40])
@pytest.mark.parametrize("shape", [(96, 32), (32, 96)])
def test_a_packed_weight_gives_f_linears_values_on_the_packed_path(rows, shape, dtype, packed_calls):
    g = torch.Generator().manual_seed(rows * 7 + shape[0])
    w = torch.randn(*shape, generator=g).to(dtype)
    b = torch.randn(shape[0], generator=g).to(dtype)
    x = torch.randn(2, rows, shape[1], generator=g).to(dtype)[:1]   # leading dimensions are rows
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    if dtype == torch.bfloat16 and not _bf16_packable():
        # a CPU whose oneDNN cannot lay out bfloat16 (an AVX2 host): nothing is packed, F.linear runs
        assert not pack(w) and packed(w) is None
        for bias in (None, b):
            torch.testing.assert_close(linear(x, w, bias), F.linear(x, w, bias), rtol=tol, atol=tol)
        assert packed_calls == []
        return
    assert pack(w) and packed(w) is not None
    for bias in (None, b):
        out = linear(x, w, bias)
        assert out.shape == (1, rows, shape[0]) and out.dtype == dtype
        torch.testing.assert_close(out, F.linear(x, w, bias), rtol=tol, atol=tol)
    # packed at every row count, in both dtypes; float32 with fewer rows than the layout's hint, padded to it
    sent = max(rows, linear_mod.PACK_HINT_ROWS) if dtype == torch.float32 else rows
    assert packed_calls == [sent, sent]


@needs_packing
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_a_float32_row_has_the_same_value_alone_as_beside_other_rows(rows, packed_calls):
    """A product's row has the same value whatever rows share it (an AR step computes one row, a verify K + 1):
    oneDNN's one-row float32 kernel sums a long row in another order than its kernel for more rows (this shape
    differs in the last bits unpadded), and fewer rows than the layout's hint run padded to it."""
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(64, 1536, generator=g)
    b = torch.randn(64, generator=g)
    x = torch.randn(9, 1536, generator=g)
    assert pack(w)
    with torch.no_grad():
        for bias in (None, b):
            few = linear(x[:rows], w, bias)
            assert few.shape == (rows, 64) and few.is_contiguous()
            for m in (4, 5, 9):
                assert torch.equal(few, linear(x[:m], w, bias)[:rows])
            torch.testing.assert_close(few, F.linear(x[:rows], w, bias), rtol=1e-4, atol=1e-4)   # 1536-long sums
    assert packed_calls[0] == linear_mod.PACK_HINT_ROWS


@needs_packing
def test_a_weight_changed_or_replaced_after_packing_is_never_multiplied_by_its_stale_copy(packed_calls):
    layer = torch.nn.Linear(24, 40, bias=False)
    w = layer.weight
    with torch.no_grad():
        assert pack(w)
        x = torch.randn(5, 24)
        w.mul_(-2.0)                                   # changed in place: the version counter moves
        assert packed(w) is None
        torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
        assert pack(w)
        w.data = torch.randn(40, 24)                   # replaced: the storage moves
        assert packed(w) is None
        torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert packed_calls == []


@needs_packing
def test_a_product_that_needs_a_gradient_does_not_use_the_packed_copy(packed_calls):
    w = torch.randn(30, 10)
    assert pack(w)
    w.requires_grad_(True)
    x = torch.randn(4, 10, requires_grad=True)
    assert_gradients_match_f_linear(x, w)
    assert packed_calls == []
    with torch.no_grad():
        linear(x, w)
    assert packed_calls == [4]


def test_only_cpu_float32_and_bfloat16_matrices_are_packed():
    assert not pack(torch.randn(8, 4, dtype=torch.float16))
    assert not pack(torch.randn(8))
    assert not pack(torch.randn(0, 4))


@needs_packing
def test_a_loaded_model_has_every_matrix_packed_and_the_same_greedy_logits(tiny_llama_dir, monkeypatch):
    from ssd.models.decoder import ForwardBatch
    from ssd.models.loader import load_model

    model = load_model(tiny_llama_dir)
    mats = model.linear_weights()
    assert mats and all(packed(w) is not None for w in mats)
    monkeypatch.setenv("SSD_PACKED_WEIGHTS", "0")
    plain = load_model(tiny_llama_dir)
    assert not packing_enabled() and pack_model(plain) == 0
    assert all(packed(w) is None for w in plain.linear_weights())
    with torch.inference_mode():
        outs = []
        for m in (model, plain):
            cache = m.make_cache(2, 64)
            batch = ForwardBatch.ragged([[3, 9, 4, 11, 7], [5, 2, 8, 1, 6]], [0, 0], [0, 1])
            outs.append(m.logits(m(batch, cache)))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    assert torch.equal(outs[0].argmax(-1), outs[1].argmax(-1))


def test_unpacked_linear_ignores_a_packed_copy(packed_calls):
    w = torch.randn(48, 16)
    pack(w)
    x = torch.randn(6, 16)
    torch.testing.assert_close(unpacked_linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert packed_calls == []


@needs_packing
def test_unpadded_linear_sends_the_rows_as_given(packed_calls):
    w = torch.randn(48, 16)
    assert pack(w)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(linear_mod.unpadded_linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
        linear(x, w)
    assert packed_calls == [2, linear_mod.PACK_HINT_ROWS]


@needs_packing
def test_greedy_tokens_are_the_same_with_the_few_rows_padding_and_without(tiny_llama_dir, monkeypatch, packed_calls):
    """The padding is a speed change: a batch-1 greedy run (every decode step one row) gives the tokens it gave
    unpadded."""
    import ssd.models.decoder as decoder
    from ssd.engine.ar import AREngine
    from ssd.models.loader import load_model
    from ssd.sampling import SamplingParams

    model = load_model(tiny_llama_dir)
    prompts = [[1, 5, 9, 13], list(range(1, 30))]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    padded = [s.output for p in prompts for s in AREngine(model, max_batch=1).generate([p], params)]
    assert linear_mod.PACK_HINT_ROWS in packed_calls and 1 not in packed_calls
    monkeypatch.setattr(decoder, "linear", linear_mod.unpadded_linear)
    packed_calls.clear()
    unpadded = [s.output for p in prompts for s in AREngine(model, max_batch=1).generate([p], params)]
    assert 1 in packed_calls
    assert padded == unpadded and all(len(o) == 24 for o in padded)
