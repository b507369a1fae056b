"""`ssd models prepare|download|distill`: local model folders (the embedded default pair, a Hugging Face
download, retraining the default draft)."""
from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    models = sub.add_parser("models", help="manage local model folders")
    msub = models.add_subparsers(dest="models_command", required=True)
    prep = msub.add_parser("prepare", help="build the embedded default model pair (SmolLM2-135M + its draft)")
    prep.add_argument("--models-dir", type=Path, default=None,
                      help="where model folders live (default: $SSD_MODELS_DIR or ~/.cache/ssd/models)")
    prep.add_argument("--force", action="store_true", help="rebuild even if already prepared")

    from ssd.models.download import add_parser as add_download_parser

    add_download_parser(msub)
    dist = msub.add_parser("distill", help="train the embedded default's feature-reading draft (hours of CPU)",
                           description="Teacher data (the target answers synthesised prompts, keeping its "
                           "features), then training, then evaluation on the held-out prompts. Every stage is "
                           "resumable: run the same command again after an interruption.")
    dist.add_argument("--stage", choices=("data", "train", "eval", "all"), default="all")
    dist.add_argument("--models-dir", type=Path, default=None)
    dist.add_argument("--work-dir", type=Path, default=Path("distill-work"),
                      help="teacher data (work-dir/data) and training state (work-dir/train)")
    dist.add_argument("--prompts", type=int, default=4000, help="training prompts to answer")
    dist.add_argument("--first-shard", type=int, default=0,
                      help="data stage: start at this shard of the prompt set (later prompts than an earlier run's)")
    dist.add_argument("--minutes", type=float, default=100.0, help="training wall-clock budget")
    dist.add_argument("--steps", type=int, default=800, help="training steps (the learning-rate schedule)")
    dist.add_argument("--schedule", choices=("steps", "minutes"), default="steps",
                      help="the learning rate's cosine runs over --steps, or over the --minutes budget")
    dist.add_argument("--correction-weight", type=float, default=0.0,
                      help="extra loss weight of chains starting right after a draft error (where rounds start)")
    dist.add_argument("--depth", type=int, default=3,
                      help="unroll depth: the draft trains on its own outputs this many positions deep (an ssd cache "
                           "entry after a full acceptance at K = 3 runs up to 7 past the last target feature)")
    dist.add_argument("--depth-decay", type=float, default=0.8, help="loss weight of depth k: decay^(k-1)")
    dist.add_argument("--lr", type=float, default=1e-3)
    dist.add_argument("--seed", type=int, default=0)
    dist.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    dist.add_argument("--no-bf16", action="store_true", help="train in float32 instead of bf16 autocast")
    dist.add_argument("--layers", type=int, default=1,
                      help="draft decoder layers (with --init-from a draft of fewer: it grows, the new ones "
                           "starting as identities)")
    dist.add_argument("--init-from", type=Path, default=None,
                      help="start training from a trained draft's tensors (e.g. the packaged draft) instead of the target's last layer")
    dist.add_argument("--train", choices=("all", "grown"), default="all", dest="train_only",
                      help="grown: with --init-from and more --layers than it has, train only the new layers (the "
                           "trained draft underneath stays as it is)")
    dist.add_argument("--follow", action="store_true",
                      help="train alongside a running data stage: wait for its first shards, take new ones as they come")
    dist.add_argument("--export", type=Path, default=None,
                      help="after training, write the shippable weights here (e.g. ssd/models/weights/...)")
    dist.add_argument("--report", type=Path, default=Path("bench/results/draft.json"),
                      help="where the eval stage writes its figures")


def run(args) -> int:
    if args.models_command == "download":
        from ssd.models.download import run as download

        return download(args)
    return cmd_distill(args) if args.models_command == "distill" else cmd_prepare(args)


def cmd_prepare(args) -> int:
    from ssd.models.prepare import prepare_default_models
    from ssd.paths import default_models_dir

    paths = prepare_default_models(args.models_dir or default_models_dir(), force=args.force)
    for role, path in paths.items():
        print(f"{role}: {path}")
    return 0


def cmd_distill(args) -> int:
    import json

    import torch

    from ssd.distill.data import DataConfig, generate
    from ssd.distill.train import TrainConfig, export, train
    from ssd.models.loader import load_model
    from ssd.models.prepare import prepare_default_models
    from ssd.paths import default_models_dir

    if args.threads:
        torch.set_num_threads(args.threads)
    paths = prepare_default_models(args.models_dir or default_models_dir())
    data, run = args.work_dir / "data", args.work_dir / "train"
    target = load_model(paths["target"])
    if args.stage in ("data", "all"):
        generate(paths["target"], data, DataConfig(prompts=args.prompts, seed=args.seed, first_shard=args.first_shard))
    if args.stage in ("train", "all"):
        cfg = TrainConfig(steps=args.steps, minutes=args.minutes, lr=args.lr, seed=args.seed, bf16=not args.no_bf16,
                          follow=args.follow, init_from=str(args.init_from or ""),
                          layers=args.layers, train_only=args.train_only, schedule=args.schedule, correction_weight=args.correction_weight,
                          depth=args.depth, depth_decay=args.depth_decay)
        train(target, data, run, cfg)
        if args.export:
            export(run, args.export, {"command": "ssd " + " ".join(sys.argv[1:]) if sys.argv[1:] else "ssd models distill",
                                      "seed": str(args.seed)})
            print(f"exported {args.export}")
    if args.stage in ("eval", "all"):
        from ssd.distill.evaluate import evaluate_draft
        from ssd.distill.train import load_trained
        from ssd.tokenizer import Tokenizer

        draft = load_trained(target, run)
        history = json.loads((run / "history.json").read_text())
        result = evaluate_draft(target, draft, Tokenizer.from_folder(paths["target"]), history)
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v for k, v in result.items() if not isinstance(v, (dict, list))}, indent=1))
    return 0
