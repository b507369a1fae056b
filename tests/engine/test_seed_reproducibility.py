"""A seeded sampled request returns the same tokens in every mode, at every K, alone or in a batch, run after run:
each position's token is the target's position-keyed Gumbel-max pick (`ssd.sampling.coupled_tokens`), which draft
and target share. The draft is the target with noise on its weights, so rounds accept and reject. `seed_stream`
keeps the per-request stream (rejection sampling), whose tokens do depend on the mode: the option is real.

The distribution of coupled outputs is the target's: tests/engine/test_sampling_exactness.py (coupled cases)."""
from dataclasses import replace

import pytest
import torch

from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.sampling import SamplingParams, coupled_tokens, position_noise
from tests.engine.perturbed import perturbed, varied_llama

MINE = SamplingParams(temperature=1.0, top_p=0.95, seed=11, max_tokens=20, ignore_eos=True)
OTHERS = [SamplingParams(temperature=0.7, seed=5, max_tokens=24, ignore_eos=True),
          SamplingParams(max_tokens=10, ignore_eos=True),
          SamplingParams(temperature=1.3, max_tokens=16, ignore_eos=True)]
PROMPT, OTHER_PROMPTS = [5, 6, 7], [[9, 9], [4], [5, 6, 7]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = varied_llama(tmp_path_factory.mktemp("varied-llama"))
    return target, perturbed(target, 0.1)


def spec(pair, mode, k, **kw):
    return SpeculativeEngine(*pair, SpecConfig(mode=mode, k=k, draft_top_k=8, **kw), max_batch=4, max_len=64)


def test_position_noise_depends_on_seed_and_position_alone():
    a = position_noise(3, 17, 1000)
    assert torch.equal(a, position_noise(3, 17, 1000))
    assert not torch.equal(a, position_noise(3, 18, 1000)) and not torch.equal(a, position_noise(4, 17, 1000))
    assert bool((a > 0).all()) and abs(float(a.mean()) - 1.0) < 0.15   # Exp(1)
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0]])
    picks = {coupled_tokens(probs, s, [0])[0] for s in range(200)}
    assert picks == {1, 2}   # never a zero-probability token


def test_a_seed_gives_the_same_tokens_in_every_mode_at_every_k_and_in_a_batch(pair):
    ar = AREngine(pair[0], max_batch=4, max_len=64).generate([PROMPT], MINE)[0].output
    assert len(ar) == MINE.max_tokens
    outputs = {"ar": ar}
    for mode, k in [("sd", 1), ("sd", 3), ("ssd", 2), ("ssd", 3)]:
        engine = spec(pair, mode, k)
        outputs[f"{mode} k={k}"] = engine.generate([PROMPT], MINE)[0].output
        assert 0 < engine.stats.acceptance_rate < 1, mode   # drafted tokens were both accepted and rejected
    engine = spec(pair, "ssd", 3, adaptive=True, adaptive_fanout=True)   # K chosen per round
    batch = engine.generate([OTHER_PROMPTS[0], PROMPT, *OTHER_PROMPTS[1:]], [OTHERS[0], MINE, *OTHERS[1:]])
    outputs["ssd adaptive, in a batch"] = batch[1].output
    outputs["ssd k=3 again"] = spec(pair, "ssd", 3).generate([PROMPT], MINE)[0].output
    assert all(out == ar for out in outputs.values()), outputs
    assert spec(pair, "sd", 3).generate([PROMPT], replace(MINE, seed=12))[0].output != ar   # not vacuous


def test_seed_stream_keeps_one_stream_per_request(pair):
    """With `seed_stream` the seed starts a random stream: reproducible for one mode and K, not across them."""
    streamed = replace(MINE, seed_stream=True)
    sd = spec(pair, "sd", 3).generate([PROMPT], streamed)[0].output
    assert spec(pair, "sd", 3).generate([PROMPT], streamed)[0].output == sd
    others = [AREngine(pair[0], max_batch=4, max_len=64).generate([PROMPT], streamed)[0].output,
              spec(pair, "sd", 1).generate([PROMPT], streamed)[0].output]
    assert any(o != sd for o in others)
