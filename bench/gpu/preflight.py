"""A minute's check of the GPU recipe's stages before the real run, on a tiny random-weight target that has the
default target's tokenizer (so the real model need not be there yet): teacher data from 2 generator processes
at a wide batch, training from scratch, the export installed as `ssd models prepare` would, a warm start from it,
and the evaluation (chained acceptance and the SD engine). Exit 0 and "PREFLIGHT OK" when every stage ran.

    python bench/gpu/preflight.py --files FOLDER [--device cuda]

FOLDER holds a prepared target's config.json and tokenizer files (bench/gpu/carry.sh carries them). Sized for a
GPU; `--device cpu` runs smaller (tests/distill/test_offline_target.py).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu import distill as D  # noqa: E402
from ssd.config import ModelConfig  # noqa: E402
from ssd.models.hf_layout import expected_tensors  # noqa: E402
from ssd.models.prepare import _write_eagle  # noqa: E402


def tiny_target(files: Path, out: Path, layers: int = 16, hidden: int = 64) -> Path:
    """Random weights in the Llama layout at a toy width, 16 layers (the evaluation taps layers 2 and 15)."""
    out.mkdir(parents=True)
    cfg = json.loads((files / "config.json").read_text())
    cfg.update(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
               num_key_value_heads=2, head_dim=hidden // 4)
    (out / "config.json").write_text(json.dumps(cfg))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(files / name, out / name)
    g = torch.Generator().manual_seed(0)
    tensors = {name: torch.ones(shape) if len(shape) == 1 else
               torch.randn(shape, generator=g) * (1.0 if "embed" in name else 0.1)
               for name, shape in expected_tensors(ModelConfig.from_dict(cfg)).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def stages(base: Path, target: Path, device: str, name: str, extra: list[str]) -> D.Run:
    wide = torch.device(device).type == "cuda"
    n = "256" if wide else "8"
    args = D.parse(["--device", device, "--out", str(base / name), "--work", str(base / "work"),
                    "--prompts", str((16 if wide else 4) * int(n)), "--first-shard", "2", "--shard-size", n, "--gen-batch", n,
                    "--max-new-tokens", "32" if wide else "8", "--gen-procs", "2", "--batch", "64" if wide else "4",
                    "--seq-len", "128", "--steps", "30" if wide else "4", "--checkpoint-every", "15" if wide else "2",
                    "--eval-seqs", "32", "--eval-prompts", "3", "--eval-new-tokens", "24" if wide else "8",
                    "--data-seconds", "12" if wide else "0", "--budget", "150", "--eval-seconds", "30", *extra])
    run = D.Run(args)
    data_dir, train_dir = args.work / "data", args.work / ("train-" + name)
    if "--reuse-data" in extra:
        data = D.shard_stats(data_dir) | {"seconds": 0.0, "tok_s": 0}
    else:
        data = run.stage("data", lambda: D.teacher_data(run, target, data_dir))
    if data:
        run.stage("train", lambda: D.training(run, target, data_dir, train_dir, data))
    if not run.result["errors"]:
        installed = base / ("installed-" + name)
        installed.mkdir()
        _write_eagle(target, args.out / "draft.safetensors", {}, installed)
        run.stage("eval", lambda: D.evaluation(run, {"target": target, "draft": installed}, data_dir, train_dir))
    print(D.table(run.result), flush=True)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=Path, required=True, help="a prepared target's config and tokenizer files")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = ap.parse_args(argv)
    t0 = time.time()
    base = args.work or Path(tempfile.mkdtemp(prefix="ssd-preflight-"))
    shutil.rmtree(base, ignore_errors=True)
    target = tiny_target(args.files, base / "target")
    first = stages(base, target, args.device, "scratch", [])
    errors = list(first.result["errors"])
    if not errors:
        warm = stages(base, target, args.device, "warm",
                      ["--reuse-data", "--init-from", str(first.args.out / "draft.safetensors"), "--lr", "5e-4"])
        errors += warm.result["errors"]
    for e in errors:
        print("ERROR", e.strip().splitlines()[-1])
    print(f"PREFLIGHT {'OK' if not errors else 'FAILED'} in {time.time() - t0:.0f} s on {args.device}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
