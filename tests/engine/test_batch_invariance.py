"""A seeded sampled request gets the same tokens alone and inside a batch of other requests, through SD and SSD.

Each request draws from its own generator (draft proposals, acceptance tests and residual draws alike), so its
neighbours in a batch cannot change what it samples. The draft is the target with noise on its weights, so rounds
both accept and reject: the residual draws are exercised, not only the bonus ones."""
from dataclasses import replace

import pytest

from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.sampling import SamplingParams
from tests.engine.perturbed import perturbed, varied_llama

MINE = SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=16, ignore_eos=True)
OTHERS = [SamplingParams(temperature=0.7, seed=5, max_tokens=20, ignore_eos=True),
          SamplingParams(max_tokens=10, ignore_eos=True),
          SamplingParams(temperature=1.3, seed=11, max_tokens=16, ignore_eos=True)]
PROMPT, OTHER_PROMPTS = [5, 6, 7], [[9, 9], [4], [5, 6, 7]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = varied_llama(tmp_path_factory.mktemp("varied-llama"))
    return target, perturbed(target, 0.1)


def engine_for(pair, mode):
    return SpeculativeEngine(*pair, SpecConfig(mode=mode, k=3, draft_top_k=8), max_batch=4, max_len=64)


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_seeded_sampled_request_gets_the_same_tokens_alone_and_in_a_batch(pair, mode):
    alone = engine_for(pair, mode).generate([PROMPT], MINE)[0].output
    engine = engine_for(pair, mode)
    prompts = [OTHER_PROMPTS[0], PROMPT, *OTHER_PROMPTS[1:]]
    batch = engine.generate(prompts, [OTHERS[0], MINE, *OTHERS[1:]])
    assert batch[1].output == alone
    assert 0 < engine.stats.acceptance_rate < 1
    reseeded = engine_for(pair, mode).generate([PROMPT], replace(MINE, seed=12))[0]
    assert reseeded.output != alone   # the seed decides the tokens: the comparison above is not vacuous

