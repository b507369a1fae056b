"""What the in-process benchmarks of the default pair share: their model arguments and loading them.

`add_pair_args(ap, results)` adds --target, --draft, --k, --threads and --out (default `results`);
`load_pair(args)` sets the threads and returns (target, draft, tokenizer); `run_each(engine, prompts, params_for)`
generates the prompts one at a time and returns the merged statistics, the outputs and the wall time. The models
are the prepared default pair in $SSD_TEST_MODELS_DIR (the test suite's folder, /tmp/ssd-test-models unless set).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from ssd.engine.stats import SpecStats
from ssd.models.loader import load_model
from ssd.tokenizer import Tokenizer

MODELS = Path(os.environ.get("SSD_TEST_MODELS_DIR", "/tmp/ssd-test-models"))


def add_pair_args(ap: argparse.ArgumentParser, results: Path) -> None:
    ap.add_argument("--target", type=Path, default=MODELS / "smollm2-135m-instruct")
    ap.add_argument("--draft", type=Path, default=MODELS / "smollm2-135m-eagle")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=results)


def load_pair(args):
    torch.set_num_threads(args.threads)
    return load_model(args.target), load_model(args.draft), Tokenizer.from_folder(args.target)


def run_each(engine, prompts, params_for) -> tuple[SpecStats, list[list[int]], float]:
    """Each prompt alone (batch 1), `params_for(i)` its SamplingParams."""
    stats, outputs = SpecStats(), []
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        seq = engine.generate([p], params_for(i))[0]
        if seq.stats is not None:
            stats.merge(seq.stats)
        outputs.append(list(seq.output))
    return stats, outputs, time.perf_counter() - t0
