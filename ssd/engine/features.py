"""Target features for a feature-reading draft: the target's final pre-norm hidden state per position.

A `FeatureBlock` holds consecutive positions' features, `rows[i]` being the feature at `start + i`. On the
data plane a block travels as `(start, data)`, the layout the wire module defines (`ssd/wire/features.py`: rows of
`wire.FEATURE_DTYPE` values, row-major, `wire.feature_row_bytes(dim)` each); this module only converts
between that layout and tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ssd import wire


@dataclass(slots=True)
class FeatureBlock:
    start: int
    rows: torch.Tensor   # [n, hidden], float16

    @property
    def end(self) -> int:
        return self.start + self.rows.shape[0]


def to_wire(block: FeatureBlock) -> tuple[int, bytes]:
    rows = block.rows.to(torch.float16).contiguous().cpu().numpy()
    return block.start, rows.astype(wire.FEATURE_DTYPE, copy=False).tobytes()


def from_wire(start: int, data: bytes, dim: int) -> FeatureBlock:
    """The block of `(start, data)` with rows of `dim`; ValueError (a WireError) if data is not whole finite rows."""
    n = wire.feature_rows(data, dim)
    rows = torch.from_numpy(np.frombuffer(data, dtype=wire.FEATURE_DTYPE).astype(np.float16).reshape(n, dim).copy())
    if not torch.isfinite(rows).all():
        raise ValueError("feature rows must be finite")
    return FeatureBlock(int(start), rows)
