"""`ssd up`: router, target and draft(s) as separate processes on loopback (ssd.cli.launcher), supervised until
SIGINT/SIGTERM; `stack_config` turns the flags into the launcher's StackConfig, naming a flag that cannot work."""
from __future__ import annotations

import sys
from pathlib import Path

from ssd.cli.generate import print_stream, report


def add_parser(sub) -> None:
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
                    help="weights and KV cache of the target and drafts: auto, float32, bfloat16 or float16 "
                         "(default: auto: float32 for the target, bfloat16 for the drafts where the device "
                         "computes it natively)")
    up.add_argument("--max-batch", type=int, default=16,
                    help="sequences generating at once (the router's batch, each worker's KV slots)")
    up.add_argument("--host", default="127.0.0.1",
                    help="interface the router's gRPC and HTTP bind, e.g. 0.0.0.0 (workers stay on loopback)")
    up.add_argument("--pin", action="store_true",
                    help="pin the target to CPU 0, the drafts and the router to CPU 1, one torch thread each")
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


def stack_config(args):
    """The StackConfig `ssd up` runs; ValueError names the flag that cannot work."""
    import shlex

    from ssd.cli.launcher import StackConfig
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
                       router_cpus="1" if args.pin else "", threads=1 if args.pin else 0, restart=True,
                       max_restarts=args.max_restarts,
                       restart_backoff=args.restart_backoff, extra={role: shlex.split(getattr(args, f"{role}_args"))
                                                                    for role in ("router", "target", "draft")})


def run(args) -> int:
    """Run the stack until SIGINT/SIGTERM (exit 0), restarting children that exit (`ssd.cli.launcher`); exit 1
    when a child reaches its restart limit or the stack cannot start."""
    import logging
    import signal as _signal

    from ssd.cli.launcher import Stack, Stopped
    from ssd.client import Client
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
