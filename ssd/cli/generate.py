"""`ssd generate PROMPT`: stream a completion from a running router through the SDK, or with `--local` from the
in-process engines; `print_stream` and `report` print a stream and its speculation figures (also for
`ssd up --demo`)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REMOTE_ONLY = ("stop", "api_key", "tls_ca_file", "tls", "timeout")
LOCAL_ONLY = ("model", "draft", "backup", "models_dir", "threads")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")


def add_parser(sub) -> None:
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


def run(args) -> int:
    return cmd_local_generate(args) if args.local else cmd_remote_generate(args)


def _misplaced(args, names: tuple[str, ...]) -> list[str]:
    """The flags among `names` that were given (not left at their default)."""
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n) not in (None, False, [])]


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


def _hint(e, args, api_key: str | None) -> str:
    """What to do about a failed call, read from the failure itself (an API key refused, a TLS handshake that
    failed and why, a plaintext connection a TLS port closed), else the question whether a router runs there."""
    tls = args.tls or args.tls_ca_file is not None
    details = e.details.lower()
    if e.code == "UNAUTHENTICATED":
        return (" (the router refused the key given by --api-key or $SSD_API_KEY)" if api_key else
                " (this router needs an API key: pass --api-key KEY or set $SSD_API_KEY)")
    if e.code != "UNAVAILABLE":
        return ""
    if "certificate_verify_failed" in details:
        return (f" (the certificate {args.address} serves is not trusted: pass the router's certificate, or the CA "
                f"that signed it, with --tls-ca-file FILE)")
    if "wrong_version_number" in details:
        return f" (the router at {args.address} does not serve TLS: drop --tls / --tls-ca-file)"
    if "handshake failed" in details:
        return f" (the TLS handshake with {args.address} failed)"
    if not tls and "socket closed" in details:
        return (f" (the router at {args.address} closed the connection at once: if it serves TLS, pass "
                f"--tls-ca-file FILE, or --tls for a certificate the system trusts)")
    return f" (is `ssd up` running at {args.address}?)"


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
            print(f"error: {e.code}: {e.details}{_hint(e, args, api_key)}", file=sys.stderr)
            return 2 if e.code == "INVALID_ARGUMENT" else 1
        report(result, result.stats.mode)
    return 0


def cmd_local_generate(args) -> int:
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
