"""`linear(x, weight, bias)`: `F.linear`, with the formulation that is fastest on CPU for the rows it is given.

Contract
--------
* Same result as ``F.linear(x, weight, bias)`` up to floating-point summation order (each output is still the
  dot product of one input row with one weight row); the same shapes, dtype and device; differentiable (a product
  that needs a gradient is always ``F.linear``).
* **Packed weights** (`pack`, which `pack_model` applies to every matrix a loaded model multiplies on CPU): a copy of
  the weight laid out once, at load time, for oneDNN's inner-product kernel. ``F.linear`` on CPU lays the weight out
  again on every call (MKL's sgemm packs the whole matrix for 2..16 rows; oneDNN's bfloat16 path reorders it): on
  SmolLM2-135M's float32 matrices a product of 3-8 rows cost 1.5-2.2x one of a single row, 16 rows 3.1x, even in the
  weight-major form below (`bench/matmul.py`). With the packed copy 3-6 rows cost what one row does (the weights are
  read from memory once either way), 8 rows 1.3x, 16 rows 1.8x. The packed kernel is used for every row count in
  both dtypes: in bfloat16 it takes 0.6-0.9x the time of ``F.linear``'s, with the same values on the draft's
  matrices; in float32 one or two rows took what the weight-major form below takes on the host these figures come
  from, and 0.69x of it on an AMD Zen 5 host (16.0 against 23.1 ms over the target's matrices), where keeping the
  weight-major form for them had made a batch-1 AR step cost more than a 4-row verify. The copy costs the weight's
  memory again. Setting ``SSD_PACKED_WEIGHTS=0`` turns packing off (for a memory-tight host, or to compare).
* A packed copy is used only while it matches its weight: the weight's storage and version counter are recorded
  when packing, so a weight replaced or changed in place (training) falls back to the unpacked path, never to a
  stale copy (a write through ``.data`` bypasses the version counter and is not seen: pack again after one). `pack`
  checks its copy against ``F.linear`` once and attaches nothing where the kernel is missing or
  disagrees.
* **Few rows run padded** (float32, packed): a product of fewer than ``PACK_HINT_ROWS`` rows is computed as that
  many, the extra rows zeros, and cut back. On the packed float32 copy oneDNN's kernel for one or two rows was the
  slow one: over the default target's matrices (30 layers and the output layer, 513 MiB, cold, one thread) one row
  took 41.0 ms and two 48.6, against 34.2 for four (and padded: 34.2 and 35.3); the output layer alone 7.95 and 9.67
  against 6.38 (2026-12-06, AMD Zen 4 host). So a batch-1 decode step, and every verify of one or two positions,
  now runs the four-row kernel. It also makes a product's row independent of the rows beside it: the one-row
  kernel summed a long row (the down projection's 1536 inputs) in another order than the kernel of two or more
  rows; every row count from 2 up gave the same values, and with the padding so does one. The forward as a whole
  still rounds a position differently in an AR step and in a verify (its logits differed by up to 3e-5 at 1, 2 and
  4 rows, padded or not), so exactness never rests on it. Both are this host's measurements (oneDNN picks its
  kernels by CPU): on the Zen 5 host of 2026-12-05 the target's AR step took 0.86x a verify of four rows (22.3
  against 25.9 ms: docs/benchmarks.md), and the padding would cost there. `bench/matmul.py` measures both
  (`unpadded_linear`). bfloat16 is left as it is: on the draft's cache-resident matrices a padded row cost more
  (1.04 against 0.84 ms a step), and on the target's it gained 7-16%.
* Unpacked, on CPU in float32 with few rows (all leading dimensions multiplied together), it computes
  ``(weight @ x^T)^T`` instead of ``x @ weight^T``. With MKL's sgemm, a 2..8-row product in the second form
  packs the whole weight matrix on every call and runs 1.5-4x slower than the first form (measured for every
  matrix of SmolLM2-135M, 1 and 2 threads: `bench/matmul.py`). One row is padded to two: the one-row kernel
  is slower than the two-row one.
* Which path a product takes is fixed by its shape, its dtype and whether its weight is packed, never timed at run
  time, so a given shape always takes the same path and results are reproducible run to run: weight-major up to 2
  rows always; up to 8 rows when the matrix has at least as many outputs as inputs (a down projection's long input
  rows favour the ordinary form from 4 rows on), unless packed. Everything else (CUDA, many rows unpacked) is
  ``F.linear``.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

__all__ = ["linear", "pack", "pack_model", "packed", "packing_enabled", "unpacked_linear", "unpadded_linear",
           "uses_weight_major"]

PAIR_ROWS = 2       # at most this many rows: always weight-major (float32, unpacked)
WIDE_ROWS = 8       # at most this many rows: weight-major when out_features >= in_features (unpacked)
PACK_HINT_ROWS = 4  # the row count oneDNN lays the copy out for (its layout served 1..512 rows alike)
PACKED_DTYPES = (torch.float32, torch.bfloat16)
PADDED_DTYPES = (torch.float32,)   # packed products of fewer rows than PACK_HINT_ROWS run padded to it


def packing_enabled() -> bool:
    """Whether `pack_model` packs (``SSD_PACKED_WEIGHTS`` unset or not ``0``) and this torch has the kernel."""
    if os.environ.get("SSD_PACKED_WEIGHTS", "1").strip() == "0":
        return False
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise"))


def _packed_product(x2d: torch.Tensor, copy: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2d, copy, bias, "none", [], "")


def pack(weight: torch.Tensor) -> bool:
    """Attach to `weight` a copy laid out for oneDNN's inner product, which `linear` then uses (see the module's
    contract). Only a 2-D CPU weight in float32 or bfloat16; returns whether a copy was attached."""
    if weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES or weight.dim() != 2 or not weight.numel():
        return False
    w = weight.detach()
    try:
        copy = torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT_ROWS)
        probe = torch.randn(PACK_HINT_ROWS, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.dtype)
        got = torch.ops.mkldnn._linear_pointwise(probe, copy, None, "none", [], "").float()
        want = F.linear(probe, w).float()
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    tol = 1e-4 if w.dtype == torch.float32 else 2e-2
    if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max()) + tol):
        return False
    weight._ssd_packed = (copy, w.data_ptr(), _version(weight))
    return True


def _version(t: torch.Tensor) -> int | None:
    """`t`'s in-place version counter (None for an inference tensor, which keeps none: made under
    `torch.inference_mode`, it cannot be changed in place outside it)."""
    return None if t.is_inference() else t._version


def packed(weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy `linear` would use for `weight` now (None: none attached, or the weight changed since)."""
    entry = getattr(weight, "_ssd_packed", None)
    if entry is None:
        return None
    copy, ptr, version = entry
    return copy if weight.data_ptr() == ptr and _version(weight) == version else None


def pack_model(model: torch.nn.Module) -> int:
    """Pack every matrix `model.linear_weights()` names (a loaded model, for inference); returns how many were
    packed: none when `packing_enabled()` is false or the model is not on CPU in float32 or bfloat16."""
    if not packing_enabled():
        return 0
    return sum(pack(w) for w in model.linear_weights())


def uses_weight_major(rows: int, weight: torch.Tensor) -> bool:
    """Whether `linear` computes `rows` rows against `weight` (unpacked) as (weight @ x^T)^T."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2:
        return False
    out_features, in_features = weight.shape
    return 0 < rows and (rows <= PAIR_ROWS or (rows <= WIDE_ROWS and out_features >= in_features))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _linear(x, weight, bias, True)


def unpadded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`linear` without the few-rows padding (benchmarks compare the two)."""
    return _linear(x, weight, bias, False)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pad: bool) -> torch.Tensor:
    in_features = weight.shape[-1]
    rows = x.numel() // in_features if in_features else 0
    copy = packed(weight) if x.dtype == weight.dtype and rows else None
    if (copy is not None
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None and bias.requires_grad)))):
        flat = x.reshape(rows, in_features)
        if pad and rows < PACK_HINT_ROWS and x.dtype in PADDED_DTYPES:   # see the contract: faster, and row-independent
            flat = torch.cat((flat, flat.new_zeros(PACK_HINT_ROWS - rows, in_features)))
            return _packed_product(flat, copy, bias)[:rows].reshape(*x.shape[:-1], weight.shape[0])
        return _packed_product(flat, copy, bias).reshape(*x.shape[:-1], weight.shape[0])
    return unpacked_linear(x, weight, bias)


def unpacked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`linear` as if `weight` had no packed copy (benchmarks compare the two)."""
    in_features = weight.shape[-1]
    rows = x.numel() // in_features if in_features else 0
    if x.dtype != weight.dtype or not uses_weight_major(rows, weight):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, in_features)
    if rows == 1:
        flat = torch.cat((flat, flat))
    out = torch.mm(weight, flat.t()).t()[:rows].contiguous()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])
