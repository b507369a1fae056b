"""Penalties, biases and min_tokens under speculation: greedy SD and SSD equal penalised AR token for token (every
verified position is penalised as if the drafted tokens before it were committed), in a batch that mixes
penalised and plain sequences, and the penalties do change what AR generates."""
import pytest

from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.loader import load_model
from ssd.prompts import PROMPTS
from ssd.sampling import SamplingParams
from ssd.tokenizer import Tokenizer

N_PROMPTS, TOKENS, MAX_LEN = 3, 24, 256


@pytest.fixture(scope="module")
def pair(default_models):
    tok = Tokenizer.from_folder(default_models["target"])
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS[:N_PROMPTS]]
    return load_model(default_models["target"]), load_model(default_models["draft"]), prompts, tok


def params_for(tok) -> dict[str, list[SamplingParams]]:
    """Per case, one SamplingParams per prompt: penalised and plain rows side by side."""
    eos = min(tok.eos_token_ids)
    plain = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
    repeat = SamplingParams(max_tokens=TOKENS, ignore_eos=True, repetition_penalty=1.3, presence_penalty=0.4,
                            frequency_penalty=0.3)
    bias = SamplingParams(max_tokens=TOKENS, ignore_eos=True, logit_bias={tok.encode(" the")[0]: 4.0,
                                                                          tok.encode(".")[0]: -100.0},
                          frequency_penalty=-0.2)
    # EOS pushed up so far that it comes at once, but min_tokens holds it back for 8 tokens
    early = SamplingParams(max_tokens=TOKENS, logit_bias={eos: 30.0}, min_tokens=8)
    return {"repetition": [repeat, plain, repeat], "bias": [bias, plain, bias], "min_tokens": [early, plain, early]}


def ar(pair, params, prompts):
    return [s.output for s in AREngine(pair[0], max_batch=len(prompts), max_len=MAX_LEN).generate(prompts, params)]


def batch(pair) -> tuple[list[list[int]], list[SamplingParams]]:
    """Every case's prompts and parameters in one batch: each case's penalised rows beside plain ones."""
    cases = params_for(pair[3])
    return pair[2] * len(cases), [p for case in CASES for p in cases[case]]


CASES = ("repetition", "bias", "min_tokens")


@pytest.fixture(scope="module")
def reference(pair):
    prompts, params = batch(pair)
    return ar(pair, params, prompts)


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_penalised_greedy_speculation_equals_penalised_ar(pair, reference, mode):
    target, draft, _, _ = pair
    prompts, params = batch(pair)
    engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=3, budget=4), max_batch=len(prompts),
                               max_len=MAX_LEN)
    assert [s.output for s in engine.generate(prompts, params)] == reference
    assert engine.stats.rounds > 0 and sum(engine.stats.accepted) > 0   # drafted tokens were verified and kept


def test_the_penalties_change_what_ar_generates(pair, reference):
    _, _, prompts, tok = pair
    plain = ar(pair, [SamplingParams(max_tokens=TOKENS, ignore_eos=True)] * N_PROMPTS, prompts)
    repeated = reference[:N_PROMPTS]
    assert repeated[1] == plain[1] and repeated[0] != plain[0]
    early, eos = reference[2 * N_PROMPTS:], tok.eos_token_ids
    for out in (early[0], early[2]):   # EOS held back for min_tokens, then drawn almost at once
        assert 8 < len(out) < TOKENS and out[-1] in eos and not eos & set(out[:8])
