"""The shipped draft, installed by `ssd models prepare`: a broken or badly trained checkpoint is caught here.

The floors sit about a third under what the shipped weights measure on these prompts (greedy is deterministic
for one dtype; the margin is for thread-count rounding at near-ties and for the draft's dtype, which the services
choose by the CPU); an untrained or broken draft accepts
under 0.2. The in-process SD engine must speculate well too while its output stays the target's.
"""
import pytest

from ssd.distill.evaluate import chain_acceptance
from ssd.distill.data import DataConfig, generate_shard
from ssd.distill.corpus import Corpus
from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.eagle import FeatureDraft
from ssd.models.loader import load_model
from ssd.prompts import PROMPTS_BY_KIND
from ssd.sampling import SamplingParams
from ssd.tokenizer import Tokenizer
from ssd.worker.service import torch_dtype

FIRST_TOKEN_FLOOR = 0.52       # these 8 prompts measured 0.72 (all 20 held-out prompts: 0.64; the previous draft 0.73, 0.60)
TOKENS_PER_ROUND_FLOOR = 2.10  # K = 3, bonus included: measured 2.75 here (2.36 on all 20; the previous draft 2.73, 2.23)
ENGINE_FLOOR = 1.70            # the SD engine on 4 of them, 48 tokens each: measured 2.02 (the previous draft 2.11; on
                               # all 20 prompts 2.10 against 2.02); the figures of this block with the draft in
                               # float32 (in bfloat16 on all 20 prompts: 0.642, 2.38, 2.11)


@pytest.fixture(scope="module")
def models(default_models):
    """The pair as the services load it: the target in float32, the draft in what its --dtype auto resolves to
    (bfloat16 on a CPU with native bfloat16)."""
    target = load_model(default_models["target"])
    draft = load_model(default_models["draft"], dtype=torch_dtype("auto", "cpu", "draft"))
    assert isinstance(draft, FeatureDraft)
    return target, draft, Tokenizer.from_folder(default_models["target"])


@pytest.fixture(scope="module")
def held_out(models):
    target, _, tok = models
    picks = [0, 1, 2, 3, 4, 6, 8, 13]        # code, chat and math prompts the draft never saw
    items = [(i, PROMPTS_BY_KIND[i][0], PROMPTS_BY_KIND[i][1]) for i in picks]
    shard = generate_shard(target, tok, items, DataConfig(max_new_tokens=64, batch=8, sampled_every=0))
    return Corpus.from_shards([shard]).seqs


def test_acceptance_floor_on_held_out_prompts(models, held_out):
    target, draft, _ = models
    acc = chain_acceptance(draft, held_out, depth=3, head=target.embed, target_norm=target.norm)
    assert acc["conditional"][0] >= FIRST_TOKEN_FLOOR, acc
    assert acc["tokens_per_round"]["3"] >= TOKENS_PER_ROUND_FLOOR, acc


def test_sd_engine_speculates_well_and_exactly(models, held_out):
    target, draft, _ = models
    prompts = [list(t[:plen].tolist()) for t, _, plen, _ in held_out[:4]]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    ref = [s.output for s in AREngine(target, max_batch=4).generate(prompts, params)]
    engine = SpeculativeEngine(target, draft, SpecConfig(mode="sd", k=3), max_batch=4)
    assert [s.output for s in engine.generate(prompts, params)] == ref
    assert engine.stats.tokens / engine.stats.rounds >= ENGINE_FLOOR, engine.stats
