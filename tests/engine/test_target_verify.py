"""The target's verify of a batch whose sequences speculate different numbers of tokens: the matrices run on the
real rows only (not the batch padded to its longest), and every outcome and logprob equals that sequence's verify
alone."""
import pytest
import torch

from ssd.engine.target import TargetWorker
from ssd.sampling import SamplingParams
from ssd.wire.target import VerifyItem
from tests.engine.perturbed import varied_llama

PROMPTS = {1: [5, 6, 7, 8], 2: [9, 9, 3], 3: [4, 11, 12, 13, 14]}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return varied_llama(tmp_path_factory.mktemp("varied-llama"))


def _prefilled(model, seqs):
    w = TargetWorker(model, 4, 256)
    firsts = w.prefill([(s, PROMPTS[s], SamplingParams(logprobs=2)) for s in seqs])
    return w, dict(zip(seqs, firsts))


def _speculations(model):
    """Per sequence: its first token, then K = 3, 0 and 1 tokens; sequence 1's start with the target's own two next
    picks, so its verify accepts some and rejects one."""
    w, firsts = _prefilled(model, [1])
    own = [w.verify([VerifyItem(1, [], None)])[0].token]
    own.append(w.verify([VerifyItem(1, [], None)])[0].token)
    return {1: [firsts[1], *own, 3], 2: [], 3: [17]}


def test_a_batch_of_different_k_runs_the_output_layer_on_its_real_rows_and_equals_each_alone(model):
    spec = _speculations(model)
    alone = {}
    for s in PROMPTS:
        w, firsts = _prefilled(model, [s])
        tokens = spec[s][1:] if s == 1 else spec[s]
        out = w.verify([VerifyItem(s, tokens, None)])[0]
        alone[s] = (firsts[s], out.accepted, out.token, w.last_logprobs[s])
    w, firsts = _prefilled(model, list(PROMPTS))
    rows = []
    inner = w.model.logits

    def logits(hidden):
        rows.append(tuple(hidden.shape[:-1]))
        return inner(hidden)

    w.model.logits = logits
    items = [VerifyItem(s, spec[s][1:] if s == 1 else spec[s], None) for s in PROMPTS]
    outs = w.verify(items)
    assert rows == [(sum(len(it.tokens) + 1 for it in items),)]   # 4 + 1 + 2 rows, not 3 x 4
    for out in outs:
        first, accepted, token, lps = alone[out.seq]
        assert (firsts[out.seq], out.accepted, out.token) == (first, accepted, token)
        got = w.last_logprobs[out.seq]
        assert [(g.token, [i for i, _ in g.top]) for g in got] == [(e.token, [i for i, _ in e.top]) for e in lps]
        assert len(got) == accepted + 1
        assert [g.logprob for g in got] == pytest.approx([e.logprob for e in lps], abs=1e-5)
    assert 0 < alone[1][1] < 3   # sequence 1 accepted some of its speculation and not all: a real verify


def test_a_batch_of_one_k_takes_the_output_layer_once_over_all_its_rows(model):
    w, firsts = _prefilled(model, [1, 3])
    rows = []
    inner = w.model.logits
    w.model.logits = lambda hidden: rows.append(tuple(hidden.shape[:-1])) or inner(hidden)
    w.verify([VerifyItem(1, [3, 4], None), VerifyItem(3, [5, 6], None)])
    assert rows == [(6,)]
