"""Prompt logprobs are the target's own: for every prompt token after the first, the float32 log-softmax of the
target's logits at the position before it, as one teacher-forced forward over the prompt computes it, with the
token's rank and the top alternatives. They come from the prefill itself, in ar, sd and ssd, also for a prompt
the prefix cache holds (such a request skips the lookup), and asking for them changes no generated token."""
import pytest
import torch

from ssd import tp_wire, wire
from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.engine.target import TargetWorker
from ssd.engine.target_handler import TargetHandler
from ssd.engine.target_tp import MirroredTarget, follow
from ssd.models.decoder import ForwardBatch
from ssd.sampling import SamplingParams
from tests.engine.perturbed import perturbed, varied_llama
from tests.tp_channel import ByteChannel

TOP, TOKENS = 3, 8
PROMPTS = [[5, 17, 99, 3, 42, 8, 64, 21, 7, 11, 90, 33, 12, 4, 77, 50, 6, 19], [9, 31, 2, 45, 100]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return varied_llama(tmp_path_factory.mktemp("varied-llama"))


def teacher_forced(model, prompt) -> torch.Tensor:
    """log_softmax (float32) of the logits after prompt[:i + 1], for i in 0..len(prompt) - 2: [len(prompt) - 1, V]."""
    cache = model.make_cache(1, len(prompt) + 1)
    with torch.inference_mode():
        hidden = model(ForwardBatch.ragged([prompt], [0], [0]), cache)
        logits = model.logits(hidden[0, :len(prompt) - 1])
    return torch.log_softmax(logits.float(), dim=-1)


def assert_reference(model, prompt, rows):
    assert rows[0] is None and len(rows) == len(prompt)
    want = teacher_forced(model, prompt)
    for i, (tok, lp) in enumerate(zip(prompt[1:], rows[1:])):
        assert lp.token == tok
        assert lp.logprob == pytest.approx(float(want[i, tok]), abs=1e-4)
        assert lp.rank == int((want[i] > want[i, tok]).sum()) + 1
        values, ids = want[i].topk(TOP)
        assert [t for t, _ in lp.top] == ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-4)


def engine_for(model, mode):
    if mode == "ar":
        return AREngine(model, max_batch=2, max_len=64)
    return SpeculativeEngine(model, perturbed(model, 0.1), SpecConfig(mode=mode, k=3), max_batch=2, max_len=64)


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_prompt_logprobs_are_the_targets_log_softmax_even_on_a_cached_prompt(model, mode):
    engine = engine_for(model, mode)
    plain = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
    asked = SamplingParams(max_tokens=TOKENS, ignore_eos=True, prompt_logprobs=TOP, logprobs=1)
    without = engine.generate(PROMPTS, [plain] * 2)   # leaves the prompts' blocks in the prefix cache
    hits = engine.prefix_stats.hit_tokens if mode == "ar" else engine.target.prefix_stats.hit_tokens
    with_them = engine.generate(PROMPTS, [asked] * 2)
    for prompt, a, b in zip(PROMPTS, without, with_them):
        assert b.output == a.output   # asking for prompt logprobs changes no generated token
        assert a.prompt_logprobs is None
        assert_reference(model, prompt, b.prompt_logprobs)
    # the second run looked nothing up (its prompts would have hit: a third plain run does)
    assert (engine.prefix_stats.hit_tokens if mode == "ar" else engine.target.prefix_stats.hit_tokens) == hits
    engine.generate(PROMPTS[:1], [plain])
    assert (engine.prefix_stats.hit_tokens if mode == "ar" else engine.target.prefix_stats.hit_tokens) > hits
    if mode != "ar":   # and it speculated
        assert sum(engine.stats.accepted) > 0 and (mode == "sd" or engine.stats.cache.get("hit", 0) > 0)


def test_target_worker_computes_every_prompt_position_once_and_a_one_token_prompt_has_none(model):
    worker = TargetWorker(model, max_seqs=4, max_len=64)
    worker.prefill([(1, PROMPTS[0], SamplingParams())])
    computed = worker.prefill_tokens
    worker.prefill([(2, PROMPTS[0], SamplingParams(prompt_logprobs=0)), (3, [7], SamplingParams(prompt_logprobs=2))])
    assert worker.prefill_tokens - computed == len(PROMPTS[0]) + 1   # no prefix-cache hit for seq 2
    rows = worker.last_prompt_logprobs[2]
    assert len(rows) == len(PROMPTS[0]) - 1 and all(r.top == () for r in rows)
    assert worker.last_prompt_logprobs[3] == []
    want = teacher_forced(model, PROMPTS[0])
    assert [r.logprob for r in rows] == pytest.approx([float(want[i, t]) for i, t in enumerate(PROMPTS[0][1:])],
                                                      abs=1e-4)


class _Endpoint:
    """Collects what a handler sends, each message through the codec."""

    def __init__(self):
        self.sent = []

    def send(self, peer, msg) -> None:
        self.sent.append(wire.decode(wire.encode(msg)))


def test_the_handler_answers_prompt_logprobs_in_a_prefilled_of_their_own_within_the_wire_limit(model, monkeypatch):
    ep = _Endpoint()
    handler = TargetHandler(TargetWorker(model, max_seqs=4, max_len=64), ep)
    plain = wire.SamplingSpec(0.0, 0, 1.0, 0.0, None)
    asks = wire.SamplingSpec(0.0, 0, 1.0, 0.0, None, prompt_logprobs=2)
    handler.handle([(b"r", wire.Prefill([wire.PrefillItem(1, PROMPTS[1], plain),
                                         wire.PrefillItem(2, PROMPTS[1], asks)]))])
    first, own = ep.sent
    assert [s for s, _ in first.items] == [1] and first.prompt_logprobs == []
    assert [s for s, _ in own.items] == [2] and own.items[0][1] == first.items[0][1]
    (lp,) = own.prompt_logprobs
    want = teacher_forced(model, PROMPTS[1])
    assert lp.seq == 2 and len(lp.logprobs) == len(lp.ranks) == len(PROMPTS[1]) - 1 and len(lp.top_ids) == 2 * 4
    assert lp.logprobs == pytest.approx([float(want[i, t]) for i, t in enumerate(PROMPTS[1][1:])], abs=1e-4)
    monkeypatch.setattr(wire, "MAX_ROW_ENTRIES", 7)   # 4 prompt tokens after the first, 2 alternatives each: 8
    ep.sent.clear()
    handler.handle([(b"r", wire.Prefill([wire.PrefillItem(3, PROMPTS[1], asks)]))])
    (err,) = ep.sent
    assert isinstance(err, wire.Error) and err.code == "invalid_argument" and err.seq == 3
    assert "prompt_logprobs" in err.message


def test_tensor_parallel_followers_skip_the_prefix_cache_as_the_leader_does(model):
    """Every rank makes the same prefill call, prompt_logprobs included, so all compute every prompt position
    (the collectives inside the forwards meet) and the leader's rows are the reference's."""
    leader, follower = (TargetWorker(model, max_seqs=4, max_len=64) for _ in range(2))
    channel = ByteChannel()
    mirrored = MirroredTarget(leader, channel)
    mirrored.prefill([((b"r", 1), PROMPTS[0], SamplingParams())])
    mirrored.prefill([((b"r", 2), PROMPTS[0], SamplingParams(prompt_logprobs=1))])
    channel.send(tp_wire.encode(tp_wire.Stop()))
    follow(follower, channel)
    assert follower.prefill_tokens == leader.prefill_tokens == 2 * len(PROMPTS[0])
    assert follower.last_prompt_logprobs == leader.last_prompt_logprobs
    rows = leader.last_prompt_logprobs[(b"r", 2)]
    want = teacher_forced(model, PROMPTS[0])
    assert [r.logprob for r in rows] == pytest.approx([float(want[i, t]) for i, t in enumerate(PROMPTS[0][1:])],
                                                      abs=1e-4)
