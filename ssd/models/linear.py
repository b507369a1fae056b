"""`linear(x, weight, bias)`: `F.linear`, with the formulation that is fastest on CPU for a few rows.

Contract
--------
* Same result as ``F.linear(x, weight, bias)`` up to floating-point summation order (each output is still the
  dot product of one input row with one weight row); the same shapes, dtype and device; differentiable.
* On CPU in float32 with few rows (all leading dimensions multiplied together), it computes
  ``(weight @ x^T)^T`` instead of ``x @ weight^T``. With MKL's sgemm, a 2..8-row product in the second form
  packs the whole weight matrix on every call and runs 1.5-4x slower than the first form (measured for every
  matrix of SmolLM2-135M, 1 and 2 threads: `bench/matmul.py`). One row is padded to two: the one-row kernel
  is slower than the two-row one.
* Where it pays is fixed by shape, never timed at run time, so a given shape always takes the same path and
  results are reproducible run to run: up to 2 rows always; up to 8 rows when the matrix has at least as many
  outputs as inputs (a down projection's long input rows favour the ordinary form from 4 rows on). Everything
  else (CUDA, bf16, many rows) is ``F.linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["linear", "uses_weight_major"]

PAIR_ROWS = 2       # at most this many rows: always weight-major
WIDE_ROWS = 8       # at most this many rows: weight-major when out_features >= in_features


def uses_weight_major(rows: int, weight: torch.Tensor) -> bool:
    """Whether `linear` computes `rows` rows against `weight` as (weight @ x^T)^T."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2:
        return False
    out_features, in_features = weight.shape
    return 0 < rows and (rows <= PAIR_ROWS or (rows <= WIDE_ROWS and out_features >= in_features))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
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
