"""One rank of the tensor-parallel tests (run by torch.multiprocessing.spawn from test_tp.py)."""
import torch

from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model
from ssd.models.parallel import TPGroup
from ssd.sampling import SamplingParams

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)


def prompts():
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, 120, (n,), generator=g).tolist() for n in (5, 17, 9)]


def reference_run(folder, tp=None, draft=None):
    """Logits of a ragged prefill, greedy AR outputs and greedy SSD outputs of one model."""
    model = load_model(folder, tp=tp)
    ps = prompts()
    with torch.inference_mode():
        cache = model.make_cache(3, 64)
        logits = model.logits(model(ForwardBatch.ragged(ps, [0, 0, 0], [0, 1, 2]), cache))
    ar = [s.output for s in AREngine(model, max_batch=3).generate(ps, PARAMS)]
    spec = SpecConfig(mode="ssd", k=3, backup="jit")   # no timing-driven choices: every rank decides alike
    ssd = [s.output for s in SpeculativeEngine(model, draft or load_model(folder), spec, max_batch=3).generate(ps, PARAMS)]
    return {"logits": logits, "ar": ar, "ssd": ssd}


def run_rank(rank, size, port, folders, out):
    torch.set_num_threads(1)
    tp = TPGroup.init(rank, size, f"tcp://127.0.0.1:{port}", backend="gloo")
    results = [reference_run(folder, tp) for folder in folders]
    if rank == 0:
        save_results(results, out)
    torch.distributed.destroy_process_group()


def save_results(results, out) -> None:
    """Logits as safetensors, token lists as JSON (never pickle)."""
    import json

    from safetensors.torch import save_file

    save_file({f"logits_{i}": r["logits"].contiguous() for i, r in enumerate(results)}, f"{out}.safetensors")
    with open(f"{out}.json", "w") as f:
        json.dump([{"ar": r["ar"], "ssd": r["ssd"]} for r in results], f)


def load_results(out) -> list[dict]:
    import json

    from safetensors.torch import load_file

    tensors = load_file(f"{out}.safetensors")
    with open(f"{out}.json") as f:
        lists = json.load(f)
    return [{"logits": tensors[f"logits_{i}"], **r} for i, r in enumerate(lists)]
