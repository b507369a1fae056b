"""The `ssd` command line: `ssd models prepare`, `ssd generate`."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ssd", description="Speculative Speculative Decoding server and tools")
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="manage local model folders")
    msub = models.add_subparsers(dest="models_command", required=True)
    prep = msub.add_parser("prepare", help="build the embedded default model pair (SmolLM2-135M + its draft)")
    prep.add_argument("--models-dir", type=Path, default=None,
                      help="where model folders live (default: $SSD_MODELS_DIR or ~/.cache/ssd/models)")
    prep.add_argument("--force", action="store_true", help="rebuild even if already prepared")

    gen = sub.add_parser("generate", help="generate a completion in this process")
    gen.add_argument("prompt")
    gen.add_argument("--mode", choices=["ar"], default="ar")
    gen.add_argument("--model", type=Path, default=None, help="target model folder (default: embedded SmolLM2)")
    gen.add_argument("--models-dir", type=Path, default=None)
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    _add_sampling_args(gen)
    return parser


def cmd_prepare(args) -> int:
    from ssd.models.prepare import prepare_default_models
    from ssd.paths import default_models_dir

    paths = prepare_default_models(args.models_dir or default_models_dir(), force=args.force)
    for role, path in paths.items():
        print(f"{role}: {path}")
    return 0


def cmd_generate(args) -> int:
    import torch

    from ssd.engine.ar import AREngine
    from ssd.models.loader import load_model
    from ssd.paths import target_dir
    from ssd.sampling import SamplingParams
    from ssd.tokenizer import Tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = args.model or target_dir(args.models_dir)
    if not (folder / "config.json").is_file():
        print(f"error: no model at {folder}; run `ssd models prepare` first (or pass --model DIR)", file=sys.stderr)
        return 2
    try:
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                min_p=args.min_p, seed=args.seed, max_tokens=args.max_tokens,
                                ignore_eos=args.ignore_eos)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tok = Tokenizer.from_folder(folder)
    text = args.prompt if args.raw else tok.apply_chat_template([{"role": "user", "content": args.prompt}])
    model = load_model(folder)
    engine = AREngine(model, max_batch=1, eos_token_ids=tuple(tok.eos_token_ids))
    seq = engine.add_request(tok.encode(text), params)
    detok = tok.detokenizer(skip_special_tokens=True)
    t0 = time.perf_counter()
    first = None
    while engine.has_unfinished():
        engine.step()
        if first is None:
            first = time.perf_counter()
        if seq.output:
            sys.stdout.write(detok.push(seq.output[-1]))
            sys.stdout.flush()
    sys.stdout.write(detok.flush() + "\n")
    end = time.perf_counter()
    n = len(seq.output)
    decode_rate = (n - 1) / (end - first) if n > 1 else 0.0
    print(f"[{args.mode}] {n} tokens ({seq.finish_reason.value}) in {end - t0:.2f} s; "
          f"prefill {1000 * (first - t0):.0f} ms for {len(seq.prompt)} prompt tokens; "
          f"decode {decode_rate:.1f} tok/s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    if args.command == "models":
        return cmd_prepare(args)
    return cmd_generate(args)


if __name__ == "__main__":
    sys.exit(main())
