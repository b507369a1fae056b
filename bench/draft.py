"""The installed default draft against its target: acceptance, cost and tokens per round, in one run.

Loads the pair `ssd models prepare` installs (the shipped weights, not a training run's) and writes
bench/results/draft.json: greedy and temperature-1 acceptance on the held-out prompts of `ssd.prompts` (by
kind and by depth), tokens per round for K = 1..6, the draft's cost per token against the target's (batch 1
and 8), the in-process SD engine's own tokens per round at K = 3, and the training record from the weights'
provenance (the curve comes from the run's history when `--history` names it).

    python bench/draft.py [--threads 1] [--new-tokens 192] [--history distill-work/train/history.json]
                          [--draft-dtype auto]

The draft runs in the dtype the draft service loads (`--draft-dtype auto`: bfloat16 where the CPU computes it
natively, `ssd.worker.service.resolve_dtype`), the target in float32, as the services run them.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from ssd.distill.evaluate import evaluate_draft  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import EAGLE_WEIGHTS, prepare_default_models  # noqa: E402
from ssd.paths import default_models_dir  # noqa: E402
from ssd.tokenizer import Tokenizer  # noqa: E402
from ssd.worker.service import resolve_dtype  # noqa: E402


def provenance_minutes(value) -> float:
    """The provenance's training minutes as a number: a run of several stages records them as "3.8 + 1.6"."""
    return round(sum(float(part) for part in str(value).split("+")), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--history", type=Path, default=None, help="the training run's history.json (for the curve)")
    ap.add_argument("--draft-dtype", default="auto", help="auto (the draft service's default), float32, bfloat16")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "draft.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    paths = prepare_default_models(default_models_dir())
    dtype = resolve_dtype(args.draft_dtype, "cpu", "draft")
    target, draft = load_model(paths["target"]), load_model(paths["draft"], dtype=getattr(torch, dtype))
    history = json.loads(args.history.read_text()) if args.history else None
    result = evaluate_draft(target, draft, Tokenizer.from_folder(paths["target"]), history, args.new_tokens)
    provenance = json.loads(EAGLE_WEIGHTS.with_suffix(".json").read_text())
    result["weights"] = {"file": f"ssd/models/weights/{EAGLE_WEIGHTS.name}", **provenance}
    result["train_minutes"] = result.get("train_minutes") or provenance_minutes(provenance.get("train_minutes", 0))
    result["machine"] = {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                         "torch": torch.__version__}
    result["draft_dtype"] = dtype
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    keys = ("acceptance_greedy", "first_token_acceptance", "acceptance_t1", "cost_ratio", "params", "train_minutes")
    print(json.dumps({k: result.get(k) for k in keys}, indent=1))
    print("tokens per round (K: tokens):", result["tokens_per_round"])
    print("by kind:", {k: v["acceptance_greedy"] for k, v in result["by_kind"].items()})


if __name__ == "__main__":
    main()
