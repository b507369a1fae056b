"""The router and the in-process engine run one round: the same requests give the same rounds through both.

Both carry `ssd.round.RoundCore` (the router over ZeroMQ to the target and draft processes, the engine over
function calls to the same handlers), so with K fixed (the stack runs `--adaptive false` and each request pins
K = 3), greedy decoding and one request at a time (so no batch composition can differ), every round is
determined: the draft's JIT proposal, the target's outcome. A request's round count, its accepted drafts and,
per position, its acceptance must then agree exactly; so must its tokens. SSD adds cache lookups whose
timeliness depends on the processes' speed, so there only the tokens and the speculation are compared.

Both sides also need the same history: the workers' prefix caches reuse the KV of earlier requests' shared
chat-template prefix, computed over a different length, and at a near-tie of the draft's top two tokens those
last-bit differences pick a different proposal (same tokens, different rounds). So the test runs its own stack,
which no other test has used, and one in-process engine per mode that serves the same requests in the same order.
"""
import pytest

from ssd.client import Client
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.loader import load_model
from ssd.round import RoundCore
from ssd.sampling import SamplingParams
from ssd.worker.service import torch_dtype

TOKENS = 24


@pytest.fixture(scope="module")
def engine_pair(default_models):
    """The pair in the dtypes the stack's services load (the draft's --dtype auto: bfloat16 on a CPU with native
    bfloat16): a draft in another dtype proposes differently at near-ties, and the rounds would differ."""
    return load_model(default_models["target"]), load_model(default_models["draft"],
                                                             dtype=torch_dtype("auto", "cpu", "draft"))


@pytest.fixture(scope="module")
def engines(engine_pair):
    """One in-process engine per mode, kept across the prompts as the stack's workers are."""
    return {mode: SpeculativeEngine(*engine_pair, SpecConfig(mode=mode, k=3), max_batch=16) for mode in ("sd", "ssd")}


def in_process(engine: SpeculativeEngine, prompt: list[int]):
    assert isinstance(engine.core, RoundCore)
    seq = engine.generate([prompt], SamplingParams(max_tokens=TOKENS, ignore_eos=True))[0]
    return seq.output, seq.stats


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_router_and_in_process_engine_agree_round_by_round(fresh_stack, engines, chat_prompts, ar_reference, mode):
    hits = 0
    with Client(fresh_stack.grpc_address, timeout=300) as client:
        for i in (0, 2, 5):   # code, math and chat prompts, one at a time
            served = client.generate(chat_prompts[i], max_tokens=TOKENS, ignore_eos=True, mode=mode, k=3)
            hits += served.stats.cache_hits
            tokens, stats = in_process(engines[mode], chat_prompts[i])
            assert served.token_ids == tokens == ar_reference[i][:TOKENS]
            accepted = served.completion_tokens - 1 - served.stats.rounds
            assert accepted > 0, "no drafted token was accepted: the comparison below proves nothing"
            if mode == "sd":
                assert served.stats.rounds == stats.rounds, i
                assert accepted == sum(stats.accepted), i
                assert list(served.stats.acceptance_per_position) == pytest.approx(stats.acceptance_per_position)
    if mode == "ssd":
        assert hits > 0, "ssd: no round took its speculation from the cache"
