"""Target features for a feature-reading draft: the target's final pre-norm hidden state per position.

A `FeatureBlock` holds consecutive positions' features, `rows[i]` being the feature at `start + i`. On the
data plane a block travels as `(start, data)`, data being the rows as little-endian float16, row-major.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class FeatureBlock:
    start: int
    rows: torch.Tensor   # [n, hidden], float16

    @property
    def end(self) -> int:
        return self.start + self.rows.shape[0]


def to_wire(block: FeatureBlock) -> tuple[int, bytes]:
    return block.start, block.rows.to(torch.float16).contiguous().cpu().numpy().astype("<f2", copy=False).tobytes()


def from_wire(start: int, data: bytes, dim: int) -> FeatureBlock:
    if dim <= 0 or len(data) % (2 * dim):
        raise ValueError(f"feature data of {len(data)} bytes is not a whole number of float16 rows of {dim}")
    rows = torch.from_numpy(np.frombuffer(data, dtype="<f2").astype(np.float16).reshape(-1, dim).copy())
    if not torch.isfinite(rows).all():
        raise ValueError("feature rows must be finite")
    return FeatureBlock(int(start), rows)
