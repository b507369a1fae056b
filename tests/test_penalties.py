"""`ssd.sampling.penalize` follows the rules of OpenAI (presence, frequency, logit_bias), Hugging Face
(repetition_penalty) and vLLM (min_tokens), checked against a plain-Python reading of them; and the K+1 rows of a
verify are penalised exactly as K+1 one-row autoregressive steps would be."""
import math
from collections import Counter

import pytest
import torch

from ssd.params import SamplingParams, ending_tokens
from ssd.sampling import penalize

V = 12
PROMPT = [1, 2, 2, 3]
OUTPUT = [3, 5, 5, 5, 7]   # generated so far
ENDING = (0, 11)


def reference(row: list[float], p: SamplingParams, prompt: list[int], output: list[int], ending) -> list[float]:
    x = list(row)
    for t, b in p.logit_bias:
        x[t] += b
    if len(output) < p.min_tokens:
        for t in ending:
            x[t] = -math.inf
    for t in set(prompt) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t, n in Counter(output).items():
        x[t] -= p.frequency_penalty * n + p.presence_penalty
    return x


PARAMS = [
    SamplingParams(presence_penalty=0.7),
    SamplingParams(frequency_penalty=-0.4),
    SamplingParams(repetition_penalty=1.5),
    SamplingParams(repetition_penalty=0.5),
    SamplingParams(logit_bias={4: 3.0, 9: -100.0}),
    SamplingParams(min_tokens=7),
    SamplingParams(presence_penalty=-1.0, frequency_penalty=0.5, repetition_penalty=1.3, logit_bias={3: 1.0},
                   min_tokens=6),
]


@pytest.mark.parametrize("params", PARAMS, ids=repr)
def test_each_row_follows_the_rules_with_the_drafted_tokens_before_it(params):
    torch.manual_seed(0)
    drafted = [5, 0, 8]
    logits = torch.randn(len(drafted) + 1, V) * 3
    out = penalize(logits, params, PROMPT + OUTPUT, len(PROMPT), ENDING, drafted)
    for i in range(len(drafted) + 1):
        want = reference(logits[i].tolist(), params, PROMPT, OUTPUT + drafted[:i], ENDING)
        assert out[i].tolist() == pytest.approx(want, rel=1e-6, abs=1e-6)
        one = penalize(logits[i:i + 1], params, PROMPT + OUTPUT + drafted[:i], len(PROMPT), ENDING)
        assert torch.equal(one[0], out[i])   # a verify row is bit-identical to the autoregressive step


def test_min_tokens_masks_the_ending_tokens_only_until_reached():
    p = SamplingParams(min_tokens=len(OUTPUT) + 2)
    logits = torch.zeros(4, V)
    out = penalize(logits, p, PROMPT + OUTPUT, len(PROMPT), ENDING, [4, 4, 4])
    assert [bool(torch.isinf(out[i, list(ENDING)]).all()) for i in range(4)] == [True, True, False, False]
    assert not torch.isinf(out[:, 1:11]).any()


def test_no_penalty_leaves_the_logits_and_the_prompt_is_not_output():
    logits = torch.randn(2, V)
    assert torch.equal(penalize(logits, SamplingParams(), PROMPT, len(PROMPT), ENDING, [3]), logits)
    out = penalize(logits, SamplingParams(presence_penalty=1.0), PROMPT, len(PROMPT), ENDING, [3])
    assert torch.equal(out[0], logits[0])   # prompt tokens are not counted by presence/frequency
    assert out[1, 3] == logits[1, 3] - 1.0


def test_ending_tokens_are_the_stop_ids_and_eos_unless_ignored():
    assert ending_tokens(SamplingParams(stop_token_ids=(9, 4)), {2}) == (2, 4, 9)
    assert ending_tokens(SamplingParams(stop_token_ids=(9,), ignore_eos=True), {2}) == (9,)


@pytest.mark.parametrize("fields, name", [
    ({"presence_penalty": 2.1}, "presence_penalty"), ({"frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"logit_bias": {1: 100.5}}, "logit_bias"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"), ({"logit_bias": [(1, 1.0), (1, 2.0)]}, "logit_bias"),
    ({"min_tokens": -2}, "min_tokens"), ({"min_tokens": True}, "min_tokens"),
])
def test_bad_values_are_refused_naming_the_field(fields, name):
    with pytest.raises(ValueError, match=f"SamplingParams.{name} must be"):
        SamplingParams(**fields)
