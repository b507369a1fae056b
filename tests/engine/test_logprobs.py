"""Logprobs in every mode: each returned token's log-probability and its top alternatives are the target's own
log-softmax (float32) at that position, as one teacher-forced forward over prompt and output computes it, in
AR, SD and SSD, greedy and sampled, with penalties (logprobs are of the raw logits) and without; they come
from the verify pass itself, one per token."""
import pytest
import torch

from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.decoder import ForwardBatch
from ssd.sampling import SamplingParams
from tests.engine.perturbed import perturbed, varied_llama

N, TOP, TOKENS = 4, 3, 20


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return varied_llama(tmp_path_factory.mktemp("varied-llama"))


def _prompts():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 128, (int(torch.randint(4, 20, (1,), generator=g)),), generator=g).tolist()
            for _ in range(N)]


def teacher_forced(model, prompt, output) -> torch.Tensor:
    """log_softmax (float32) of the logits after prompt + output[:i], for every i: [len(output), V]."""
    tokens = prompt + output
    cache = model.make_cache(1, len(tokens) + 1)
    with torch.inference_mode():
        hidden = model(ForwardBatch.ragged([tokens], [0], [0]), cache)
        logits = model.logits(hidden[0, len(prompt) - 1:len(tokens) - 1])
    return torch.log_softmax(logits.float(), dim=-1)


def engine_for(model, mode):
    if mode == "ar":
        return AREngine(model, max_batch=N, max_len=64)
    return SpeculativeEngine(model, perturbed(model, 0.1), SpecConfig(mode=mode, k=3), max_batch=N, max_len=64)


PARAMS = {
    "greedy": SamplingParams(max_tokens=TOKENS, ignore_eos=True, logprobs=TOP),
    "sampled": SamplingParams(temperature=0.9, top_k=20, seed=11, max_tokens=TOKENS, ignore_eos=True,
                              logprobs=TOP),
    "penalised": SamplingParams(max_tokens=TOKENS, ignore_eos=True, logprobs=TOP, repetition_penalty=1.4,
                                presence_penalty=0.5),
}


@pytest.mark.parametrize("case", sorted(PARAMS))
@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_logprobs_are_the_targets_log_softmax(model, mode, case):
    engine = engine_for(model, mode)
    seqs = engine.generate(_prompts(), [PARAMS[case]] * N)
    for prompt, seq in zip(_prompts(), seqs):
        assert len(seq.logprobs) == len(seq.output) == TOKENS
        want = teacher_forced(model, prompt, seq.output)
        for i, (tok, lp) in enumerate(zip(seq.output, seq.logprobs)):
            assert lp.token == tok
            assert lp.logprob == pytest.approx(float(want[i, tok]), abs=1e-4)
            values, ids = want[i].topk(TOP)
            assert [t for t, _ in lp.top] == ids.tolist()
            assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-4)
    if mode != "ar":
        assert engine.stats.rounds > 0 and 0 < engine.stats.acceptance_rate < 1   # several tokens per verify


def test_no_logprobs_unless_asked_and_zero_alternatives(model):
    plain, zero = AREngine(model, max_batch=2, max_len=64).generate(
        _prompts()[:2], [SamplingParams(max_tokens=5), SamplingParams(max_tokens=5, logprobs=0)])
    assert plain.logprobs == []
    assert len(zero.logprobs) == len(zero.output) and all(lp.top == () for lp in zero.logprobs)
