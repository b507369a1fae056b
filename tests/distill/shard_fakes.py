"""A teacher-data shard of the right shape for `n` prompts (3 tokens each), for tests that fake the target."""
import torch


def shard_tensors(n: int) -> dict:
    return {"tokens": torch.arange(3 * n, dtype=torch.int32),
            "offsets": torch.arange(0, 3 * n + 1, 3, dtype=torch.int64),
            "prompt_lens": torch.ones(n, dtype=torch.int32), "kinds": torch.zeros(n, dtype=torch.uint8),
            "features": torch.zeros(2 * n, 4, dtype=torch.float16)}
