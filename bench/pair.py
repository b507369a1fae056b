"""What the in-process benchmarks of the default pair share: their model arguments and loading them.

`add_pair_args(ap, results)` adds --target, --draft, --k, --threads and --out (default `results`);
`load_pair(args)` sets the threads and returns (target, draft, tokenizer). The models are the prepared default
pair in $SSD_TEST_MODELS_DIR (the test suite's folder, /tmp/ssd-test-models unless set).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

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
