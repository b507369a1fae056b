"""A stack whose target and draft hold far less KV than the running sequences need: the target preempts
sequences (their KV dropped, recomputed when next verified) and the draft evicts committed KV, while every
request still gets exactly the in-process AR output, in sd and ssd, with the distilled draft (it accepts about
half of its tokens, so rounds both accept and reject)."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from ssd.cli.launcher import Stack, StackConfig
from ssd.client import Client
from ssd.control import describe

KV_TOKENS, MAX_LEN = 192, 128   # 12 blocks of 16: room for about two of the ten sequences at a time


@pytest.fixture(scope="module")
def small_kv_stack(default_models, tmp_path_factory):
    small = ["--kv-tokens", str(KV_TOKENS), "--max-len", str(MAX_LEN)]
    cfg = StackConfig(mode="ssd", drafts=1, log_dir=tmp_path_factory.mktemp("kv-logs"), max_batch=16,
                      target_cpus="0", draft_cpus="1", threads=1, draft_model=default_models["draft"],
                      extra={"target": small, "draft": small, "router": ["--adaptive", "false"]})
    with Stack(cfg) as s:
        yield s


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_preempted_sequences_through_the_stack_keep_output_exact(small_kv_stack, chat_prompts, ar_reference, mode,
                                                                 assert_speculated):
    before = describe(small_kv_stack.target_control[0]).preemptions
    with Client(small_kv_stack.grpc_address, timeout=600) as client, ThreadPoolExecutor(len(chat_prompts)) as pool:
        results = list(pool.map(lambda p: client.generate(p, max_tokens=32, ignore_eos=True, mode=mode),
                                chat_prompts))
    assert [r.token_ids for r in results] == ar_reference
    assert_speculated(results, mode)
    assert any(a < 1.0 for r in results for a in r.stats.acceptance_per_position)   # rejections too
    assert describe(small_kv_stack.target_control[0]).preemptions > before, "the target never ran out of KV"
    assert describe(small_kv_stack.draft_control[0]).preemptions > 0, "the draft never evicted KV"
