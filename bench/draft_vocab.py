"""Does a larger draft vocabulary pay? The shipped draft's output layer over more of the target's vocabulary.

The default draft proposes only its vocabulary (8192 of the target's 49152 tokens); its output rows are the target's
own tied embedding rows (`ssd.models.eagle`), so a larger vocabulary needs no training: the same trained layer, with
more of the target's rows in the output layer. A token outside the vocabulary can never be drafted (6.4% of the
training answers' tokens), but every extra row also competes for the argmax, and the output layer is about half of
the draft's cost per step on a CPU. This measures both, for the shipped vocabulary, one twice its size (the extra
tokens ranked by how often the target generates them answering training prompts, never the held-out ones), and the
whole vocabulary:

- chained greedy acceptance on the held-out prompts (`ssd.distill.evaluate.chain_acceptance`): first drafted token,
  tokens per round at K = 3 (along the target's answers), first token by kind;
- the in-process SD engine's tokens per round at K = 3 on the same prompts (the product's path);
- the draft's cost per step against the target's at batch 1 and 8 (`measure_cost`: one step, the logits included).

    PYTHONPATH=. python bench/draft_vocab.py [--rank-prompts 96] [--out bench/results/draft_vocab.json]

Writes the JSON and prints a markdown table. One thread, the draft in bfloat16 as the draft service runs it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from ssd.distill.data import DataConfig, generate_shard  # noqa: E402
from ssd.distill.evaluate import (_head, chain_acceptance, engine_tokens_per_round,  # noqa: E402
                                  held_out_sequences, measure_cost)
from ssd.distill.prompts import training_prompts  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402
from ssd.paths import default_models_dir  # noqa: E402
from ssd.tokenizer import Tokenizer  # noqa: E402


def ranked_extras(target, tok, shipped: torch.Tensor, prompts: int, seed: int) -> list[int]:
    """Token ids outside `shipped`, most generated first (the target's greedy answers to `prompts` training prompts),
    then the rest by id."""
    items = [(i, kind, text) for i, (kind, text) in enumerate(training_prompts(prompts, seed=seed))]
    shard = generate_shard(target, tok, items, DataConfig(max_new_tokens=128, batch=32, sampled_every=0))
    counts = torch.zeros(target.cfg.vocab_size, dtype=torch.long)
    offsets, tokens = shard["offsets"].tolist(), shard["tokens"].long()
    for i, plen in enumerate(shard["prompt_lens"].tolist()):
        answer = tokens[offsets[i] + plen:offsets[i + 1]]
        counts += torch.bincount(answer, minlength=counts.numel())[:counts.numel()]
    counts[shipped] = -1
    order = torch.argsort(counts, descending=True, stable=True)
    return [i for i in order.tolist() if counts[i] >= 0]


def variant(src: Path, base: dict, embed: torch.Tensor, ids: torch.Tensor, folder: Path) -> Path:
    """A copy of the draft folder `src` whose vocabulary is `ids` (output rows: the target's embedding rows)."""
    shutil.copytree(src, folder, dirs_exist_ok=True)
    tensors = dict(base)
    tensors["vocab_ids"] = ids
    tensors["lm_head.weight"] = embed[ids].to(base["lm_head.weight"].dtype).contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["ssd_feature_draft"]["draft_vocab_size"] = int(ids.numel())
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank-prompts", type=int, default=96, help="training prompts whose answers rank the extra tokens")
    ap.add_argument("--seed", type=int, default=7, help="the training prompts' seed (not the packaged draft's data)")
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "draft_vocab.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    paths = prepare_default_models(default_models_dir())
    target, tok = load_model(paths["target"]), Tokenizer.from_folder(paths["target"])
    src = Path(paths["draft"])
    base = load_file(str(src / "model.safetensors"))
    shipped = base["vocab_ids"].long()
    t0 = time.time()
    extras = ranked_extras(target, tok, shipped, args.rank_prompts, args.seed)
    print(f"ranked the extra tokens in {time.time() - t0:.0f} s", flush=True)
    seqs = held_out_sequences(target, tok, args.new_tokens)
    prompts = [list(t[:plen]) for t, _, plen, _ in seqs]
    sizes = [int(shipped.numel()), 2 * int(shipped.numel()), target.cfg.vocab_size]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            if n == shipped.numel():
                folder = src
            else:
                ids = torch.sort(torch.cat([shipped, torch.tensor(extras[:n - shipped.numel()])])).values
                folder = variant(src, base, target.embed.detach(), ids, Path(tmp) / f"v{n}")
            draft = load_model(folder, dtype=torch.bfloat16)
            acc = chain_acceptance(draft, seqs, depth=6, head=_head(target), target_norm=target.norm)
            eng = engine_tokens_per_round(target, draft, prompts, 3, args.new_tokens)
            cost = [measure_cost(target, draft, batch=b, steps=24) for b in (1, 8)]
            rows.append({"draft_vocab": n, "first_token_acceptance": acc["conditional"][0],
                         "conditional_acceptance_by_depth": acc["conditional"],
                         "tokens_per_round_k3": acc["tokens_per_round"]["3"],
                         "first_token_by_kind": {k: v["conditional"][0] for k, v in acc["by_kind"].items()},
                         "engine_sd_k3_tokens_per_round": eng["tokens_per_round"],
                         "engine_sd_k3_first_token": eng["first_token_acceptance"], "cost": cost})
            print(json.dumps(rows[-1]), flush=True)
            del draft
    result = {"date": time.strftime("%Y-%m-%d"), "held_out_positions": acc["positions"],
              "rank_prompts": args.rank_prompts, "rank_seed": args.seed, "torch": torch.__version__,
              "draft_dtype": "bfloat16", "threads": 1, "variants": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("| draft vocab | first token | tokens/round K=3 | SD engine K=3 | draft ms (b1) | draft/target (b1) | "
          "draft ms (b8) |\n|---|---|---|---|---|---|---|")
    for r in rows:
        c1, c8 = r["cost"]
        print(f"| {r['draft_vocab']} | {r['first_token_acceptance']:.4f} | {r['tokens_per_round_k3']:.3f} | "
              f"{r['engine_sd_k3_tokens_per_round']:.3f} | {c1['draft_ms']:.2f} | {c1['ratio']:.3f} | "
              f"{c8['draft_ms']:.2f} |")


if __name__ == "__main__":
    main()
