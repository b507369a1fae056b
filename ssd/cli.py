"""The `ssd` command line.

    ssd models prepare                 build the embedded default model pair
    ssd up [--demo PROMPT]             router + target + draft as separate processes on loopback
    ssd generate PROMPT                stream a completion from a running router (--local: in this process)
    ssd --version                      print the installed version
    ssd keys generate --out DIR        CURVE key pairs for the data plane (router.key*, worker.key*)
    ssd target|draft|router [flags]    one service (for containers); flags, SSD_<ROLE>_* env, --config FILE
"""
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


def version() -> str:
    """The installed distribution's version (ssd.__version__ when ssd runs from a tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("ssd")
    except PackageNotFoundError:
        import ssd

        return ssd.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ssd", description="Speculative Speculative Decoding server and tools")
    parser.add_argument("--version", action="version", version=f"ssd {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

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
    dist.add_argument("--minutes", type=float, default=100.0, help="training wall-clock budget")
    dist.add_argument("--steps", type=int, default=800, help="training steps (the learning-rate schedule)")
    dist.add_argument("--lr", type=float, default=1e-3)
    dist.add_argument("--seed", type=int, default=0)
    dist.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    dist.add_argument("--no-bf16", action="store_true", help="train in float32 instead of bf16 autocast")
    dist.add_argument("--follow", action="store_true",
                      help="train alongside a running data stage: wait for its first shards, take new ones as they come")
    dist.add_argument("--export", type=Path, default=None,
                      help="after training, write the shippable weights here (e.g. ssd/models/weights/...)")
    dist.add_argument("--report", type=Path, default=Path("bench/results/draft.json"),
                      help="where the eval stage writes its figures")

    keys = sub.add_parser("keys", help="data-plane CURVE keys")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    kgen = ksub.add_parser("generate", help="write NAME.key (public) and NAME.key_secret for each name")
    kgen.add_argument("--out", type=Path, required=True, help="folder to write the key files into")
    kgen.add_argument("--names", default="router,worker",
                      help="comma-separated key pair names (default: router,worker)")

    for role in ("target", "draft", "router"):
        sub.add_parser(role, help=f"run the {role} service (see `ssd {role} --help`)", add_help=False)

    up = sub.add_parser("up", help="start router, target and draft(s) as separate processes")
    up.add_argument("--mode", choices=["ar", "sd", "ssd"], default="ssd")
    up.add_argument("--drafts", type=int, default=1, help="draft replicas")
    up.add_argument("--targets", type=int, default=1, help="target replicas")
    up.add_argument("--routers", type=int, default=1, help="routers sharing the workers (needs --state-redis-url)")
    up.add_argument("--state-redis-url", default="", help="the routers' request-state Redis (resumable streams)")
    up.add_argument("--k", type=int, default=3)
    up.add_argument("--backup", choices=["jit", "ngram", "none", "auto"], default="jit")
    up.add_argument("--port", type=int, default=50051, help="the router's gRPC port")
    up.add_argument("--http-port", type=int, default=8000, help="the router's OpenAI-compatible HTTP port")
    up.add_argument("--models-dir", type=Path, default=None)
    up.add_argument("--model", type=Path, default=None, help="target model folder (default: embedded SmolLM2)")
    up.add_argument("--draft", type=Path, default=None, help="draft model folder (default: the embedded draft)")
    up.add_argument("--device", default="", help="where the target and drafts run: cpu, cuda or cuda:N (default: cpu)")
    up.add_argument("--dtype", default="",
                    help="weights and KV cache: float32, bfloat16 or float16 (default: float32)")
    up.add_argument("--max-batch", type=int, default=16,
                    help="sequences generating at once (the router's batch, each worker's KV slots)")
    up.add_argument("--host", default="127.0.0.1",
                    help="interface the router's gRPC and HTTP bind, e.g. 0.0.0.0 (workers stay on loopback)")
    up.add_argument("--pin", action="store_true", help="pin the target to CPU 0 and drafts to CPU 1, one thread each")
    up.add_argument("--demo", default=None, metavar="PROMPT", help="run one generation, print its stats, stop")
    up.add_argument("--max-restarts", type=int, default=5,
                    help="restarts in a row of a child that keeps exiting before `ssd up` gives up (0 = never restart)")
    up.add_argument("--restart-backoff", type=float, default=0.5,
                    help="seconds before a child's first restart; doubles with each restart (at most 10 s)")
    up.add_argument("--stop-grace", type=float, default=3.0,
                    help="on SIGINT/SIGTERM: seconds children get after SIGTERM before SIGKILL")
    for role in ("router", "target", "draft"):
        up.add_argument(f"--{role}-args", default="", metavar="FLAGS",
                        help=f"more flags for every {role} process, e.g. --{role}-args='--log-level DEBUG'")

    b = sub.add_parser("bench", help="AR, SD and SSD through real processes; writes bench/results/ssd.json")
    b.add_argument("--new-tokens", type=int, default=256)
    b.add_argument("--prompts", type=int, default=16)
    b.add_argument("--batches", default="1,2,4,8")
    b.add_argument("--k", type=int, default=3)
    b.add_argument("--ks", default="", help="fixed K values for SD and SSD, e.g. 1,2,3 (default: --k)")
    b.add_argument("--models-dir", type=Path, default=None)
    b.add_argument("--draft", type=Path, default=None, help="draft model folder (default: the embedded draft)")
    b.add_argument("--out", type=Path, default=Path("bench/results/ssd.json"))
    from ssd.bench_serve import add_parser as add_serve_parser

    add_serve_parser(b.add_subparsers(dest="bench_command", required=False,
                                      description="`ssd bench serve`: load benchmark of any OpenAI endpoint"))

    gen = sub.add_parser("generate", help="generate a completion (from a running router, or --local)")
    gen.add_argument("prompt")
    gen.add_argument("--address", default="127.0.0.1:50051", help="the router's gRPC address")
    gen.add_argument("--local", action="store_true", help="run the engines in this process instead")
    gen.add_argument("--mode", choices=["ar", "sd", "ssd"], default=None,
                     help="speculation mode (default: the router's; --local: ar)")
    gen.add_argument("--k", type=int, default=None,
                     help="drafted tokens per round, sd and ssd (default: the router's per-round K; --local: 3)")
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT",
                     help="stop when the text contains TEXT (repeatable)")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    remote = gen.add_argument_group("router options (not with --local)")
    remote.add_argument("--api-key", default=None, help="the router's API key (default: $SSD_API_KEY)")
    remote.add_argument("--tls-ca-file", type=Path, default=None,
                        help="connect with TLS, trusting this PEM certificate (e.g. the router's self-signed one)")
    remote.add_argument("--tls", action="store_true", help="connect with TLS, trusting the system's certificates")
    remote.add_argument("--timeout", type=float, default=None, help="seconds for the whole request")
    local = gen.add_argument_group("--local options (`ssd up` has --model/--draft for a router)")
    local.add_argument("--model", type=Path, default=None, help="target model folder (default: embedded SmolLM2)")
    local.add_argument("--draft", type=Path, default=None, help="draft model folder (default: the embedded draft)")
    local.add_argument("--backup", choices=["jit", "ngram", "none", "auto"], default=None,
                       help="ssd miss policy (default: jit)")
    local.add_argument("--models-dir", type=Path, default=None)
    local.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    _add_sampling_args(gen)
    return parser


REMOTE_ONLY = ("stop", "api_key", "tls_ca_file", "tls", "timeout")
LOCAL_ONLY = ("model", "draft", "backup", "models_dir", "threads")


def _misplaced(args, names: tuple[str, ...]) -> list[str]:
    """The flags among `names` that were given (not left at their default)."""
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n) not in (None, False, [])]


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
        generate(paths["target"], data, DataConfig(prompts=args.prompts, seed=args.seed))
    if args.stage in ("train", "all"):
        cfg = TrainConfig(steps=args.steps, minutes=args.minutes, lr=args.lr, seed=args.seed, bf16=not args.no_bf16,
                          follow=args.follow)
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


def cmd_keys(args) -> int:
    from ssd.curve import generate

    try:
        paths = generate(args.out, [n.strip() for n in args.names.split(",") if n.strip()])
    except (FileExistsError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def print_stream(stream, out=sys.stdout) -> object:
    """Print deltas as they come; return the final result."""
    from ssd.client import Result

    for item in stream:
        if isinstance(item, Result):
            out.write("\n")
            return item
        out.write(item.text)
        out.flush()
    return None


def report(result, mode: str) -> None:
    st = result.stats
    decode = result.total_time_s - result.time_to_first_token_s
    rate = (result.completion_tokens - 1) / decode if decode > 0 and result.completion_tokens > 1 else 0.0
    print(f"[{mode}] {result.completion_tokens} tokens ({result.finish_reason}) in {result.total_time_s:.2f} s; "
          f"first token {1000 * result.time_to_first_token_s:.0f} ms; {rate:.1f} tok/s after it", file=sys.stderr)
    if st.rounds:
        acc = ", ".join(f"{a:.2f}" for a in st.acceptance_per_position)
        print(f"[{mode}] rounds {st.rounds}, tokens/round {st.tokens_per_round:.2f}, acceptance per position "
              f"[{acc}], cache hits {st.cache_hits}, misses {st.cache_misses}", file=sys.stderr)


def cmd_remote_generate(args) -> int:
    from ssd.client import Client, SSDError

    misplaced = _misplaced(args, LOCAL_ONLY)
    if misplaced:
        print(f"error: {', '.join(misplaced)} apply to `ssd generate --local` (in-process engines); a router "
              f"serves the models `ssd up --model DIR --draft DIR` (or `ssd router`/`target`/`draft`) started",
              file=sys.stderr)
        return 2
    if args.k is not None and args.k < 0:
        print(f"error: --k must be at least 0 (0 = the router's K), got {args.k}", file=sys.stderr)
        return 2
    try:
        certs = args.tls_ca_file.read_bytes() if args.tls_ca_file else None
    except OSError as e:
        print(f"error: --tls-ca-file: {e}", file=sys.stderr)
        return 2
    api_key = args.api_key if args.api_key is not None else os.environ.get("SSD_API_KEY") or None
    try:
        client = Client(args.address, args.timeout, api_key=api_key, root_certificates=certs, tls=args.tls)
    except ValueError as e:
        print(f"error: --address: {e}", file=sys.stderr)
        return 2
    with client:
        try:
            result = print_stream(client.stream(
                args.prompt, chat=not args.raw, max_tokens=args.max_tokens, temperature=args.temperature,
                top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed, ignore_eos=args.ignore_eos,
                stop=args.stop, mode=args.mode or "", k=args.k or 0))
        except SSDError as e:
            hint = f" (is `ssd up` running at {args.address}?)" if e.code == "UNAVAILABLE" else ""
            print(f"error: {e.code}: {e.details}{hint}", file=sys.stderr)
            return 2 if e.code == "INVALID_ARGUMENT" else 1
        report(result, result.stats.mode)
    return 0


def stack_config(args):
    """The StackConfig `ssd up` runs; ValueError names the flag that cannot work."""
    import shlex

    from ssd.launcher import StackConfig
    from ssd.worker.service import WorkerConfig, device_problem

    if args.routers > 1 and not args.state_redis_url:
        raise ValueError("--routers > 1 needs --state-redis-url (the routers share request state)")
    if args.max_batch < 1:
        raise ValueError(f"--max-batch must be at least 1, got {args.max_batch}")
    if not args.host.strip():
        raise ValueError("--host must name an interface, e.g. 127.0.0.1 or 0.0.0.0")
    for flag, folder in (("--model", args.model), ("--draft", args.draft)):
        if folder is not None and not (folder / "config.json").is_file():
            raise ValueError(f"{flag} {folder}: no model there (no config.json)")
    problem = device_problem(WorkerConfig(device=args.device or "cpu", dtype=args.dtype or "float32"))
    if problem:
        raise ValueError(problem)
    return StackConfig(mode=args.mode, drafts=args.drafts, targets=args.targets, routers=args.routers,
                       state_redis_url=args.state_redis_url, models_dir=args.models_dir, grpc_port=args.port,
                       http_port=args.http_port, k=args.k, target_model=args.model, draft_model=args.draft,
                       max_batch=args.max_batch, device=args.device, dtype=args.dtype, host=args.host.strip(),
                       backup=args.backup, target_cpus="0" if args.pin else "", draft_cpus="1" if args.pin else "",
                       threads=1 if args.pin else 0, restart=True, max_restarts=args.max_restarts,
                       restart_backoff=args.restart_backoff, extra={role: shlex.split(getattr(args, f"{role}_args"))
                                                                    for role in ("router", "target", "draft")})


def cmd_up(args) -> int:
    """Run the stack until SIGINT/SIGTERM (exit 0), restarting children that exit (`ssd.launcher`); exit 1 when a
    child reaches its restart limit or the stack cannot start."""
    import logging
    import signal as _signal

    from ssd.client import Client
    from ssd.launcher import Stack, Stopped
    from ssd.models.prepare import prepare_default_models

    try:
        cfg = stack_config(args)
    except ValueError as e:
        print(f"ssd up: {e}", file=sys.stderr)
        return 2
    prepare_default_models(args.models_dir, log=lambda *a: None)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ssd up: %(message)s"))
    launcher_log = logging.getLogger("ssd.launcher")
    launcher_log.addHandler(handler)
    launcher_log.setLevel(logging.INFO)
    stack = Stack(cfg)
    for sig in (_signal.SIGINT, _signal.SIGTERM):  # only sets a flag: start and supervise notice it
        _signal.signal(sig, lambda signum, _frame: stack.request_stop())
    print(f"starting router, {len(stack.target_data)} target(s), {len(stack.draft_data)} draft(s) ({args.mode})",
          file=sys.stderr)
    try:
        stack.start()
        print(f"ready: gRPC {','.join(stack.grpc_addresses)}, OpenAI HTTP http://{stack.http_address}/v1, "
              f"metrics http://{stack.http_address}/metrics", file=sys.stderr)
        if args.demo:
            with Client(stack.grpc_addresses) as client:
                result = print_stream(client.stream(args.demo, chat=True, max_tokens=128))
                report(result, args.mode)
            return 0
        stack.supervise()
        print("ssd up: stopping", file=sys.stderr)
        return 0
    except Stopped:
        print("ssd up: stopped during start-up", file=sys.stderr)
        return 0
    except RuntimeError as e:  # GaveUp, or a start-up failure
        print(f"ssd up: {e}", file=sys.stderr)
        return 1
    finally:
        stack.stop(grace=args.stop_grace)
        launcher_log.removeHandler(handler)


def cmd_generate(args) -> int:
    import torch

    from ssd.engine.ar import AREngine
    from ssd.models.loader import load_model
    from ssd.engine.speculative import SpecConfig, SpeculativeEngine
    from ssd.paths import draft_dir, target_dir
    from ssd.sampling import SamplingParams
    from ssd.tokenizer import Tokenizer

    misplaced = _misplaced(args, REMOTE_ONLY)
    if misplaced:
        print(f"error: {', '.join(misplaced)} apply to a router (`ssd generate` without --local)", file=sys.stderr)
        return 2
    mode, k, backup = args.mode or "ar", 3 if args.k is None else args.k, args.backup or "jit"
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
    eos = tuple(tok.eos_token_ids)
    if mode == "ar":
        engine = AREngine(model, max_batch=1, eos_token_ids=eos)
    else:
        draft = load_model(args.draft or draft_dir(args.models_dir))
        try:
            spec = SpecConfig(mode=mode, k=k, backup=backup)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        engine = SpeculativeEngine(model, draft, spec, max_batch=1, eos_token_ids=eos)
    seq = engine.add_request(tok.encode(text), params)
    detok = tok.detokenizer(skip_special_tokens=True)
    t0 = time.perf_counter()
    first, shown = None, 0
    while engine.has_unfinished():
        engine.step()
        if first is None:
            first = time.perf_counter()
        for tok_id in seq.output[shown:]:
            sys.stdout.write(detok.push(tok_id))
        shown = len(seq.output)
        sys.stdout.flush()
    sys.stdout.write(detok.flush() + "\n")
    end = time.perf_counter()
    n = len(seq.output)
    decode_rate = (n - 1) / (end - first) if n > 1 else 0.0
    print(f"[{mode}] {n} tokens ({seq.finish_reason.value}) in {end - t0:.2f} s; "
          f"prefill {1000 * (first - t0):.0f} ms for {len(seq.prompt)} prompt tokens; "
          f"decode {decode_rate:.1f} tok/s", file=sys.stderr)
    if seq.stats is not None:
        st = seq.stats
        print(f"[{mode}] rounds {st.rounds}, tokens/round {st.tokens_per_round:.2f}, "
              f"acceptance {st.acceptance_rate:.2f}, cache {st.cache}, backups {st.backups}", file=sys.stderr)
    return 0


def cmd_service(role: str, argv: list[str]) -> int:
    from ssd.service_config import load_config

    if role == "target":
        from services.target.service import TargetConfig as Config, run
    elif role == "draft":
        from services.draft.service import DraftConfig as Config, run
    else:
        from services.router.service import RouterConfig as Config, run
    try:
        cfg = load_config(Config, argv, role)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run(cfg)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("target", "draft", "router"):
        return cmd_service(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "models":
        if args.models_command == "download":
            from ssd.models.download import run as download

            return download(args)
        return cmd_distill(args) if args.models_command == "distill" else cmd_prepare(args)
    if args.command == "keys":
        return cmd_keys(args)
    if args.command == "up":
        return cmd_up(args)
    if args.command == "bench" and args.bench_command == "serve":
        from ssd.bench_serve import run as bench_serve

        return bench_serve(args)
    if args.command == "bench":
        from ssd.bench import bench, markdown

        result = bench(args.new_tokens, args.prompts, tuple(int(x) for x in args.batches.split(",")), args.k,
                       args.models_dir, args.draft, args.out,
                       ks=tuple(int(x) for x in args.ks.split(",")) if args.ks else None)
        print(markdown(result))
        return 0
    return cmd_generate(args) if args.local else cmd_remote_generate(args)


if __name__ == "__main__":
    sys.exit(main())
