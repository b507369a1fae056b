"""The target's features reach a feature-reading draft through real processes: the shared stack
(tests/services/conftest.py), whose draft is the distilled feature draft. Greedy output equals in-process AR with
drafts accepted, sampled requests complete (their distribution: test_stack_sampling.py), and the router forwarded
the target's feature rows to the draft. In process (the round core's merge rule and pending features, the
handlers): tests/round/test_feature_plumbing.py.
"""
import urllib.request

from ssd.client import Client

N_PROMPTS, N_TOKENS = 4, 32


def feature_rows_total(metrics_text: str) -> float:
    return float(next(line.split()[-1] for line in metrics_text.splitlines()
                      if line.startswith("ssd_feature_rows_total ")))


def feature_rows_forwarded(stack) -> float:
    with urllib.request.urlopen(f"http://{stack.http_address}/metrics", timeout=30) as response:
        return feature_rows_total(response.read().decode())


def test_a_feature_draft_through_the_stack_keeps_output_exact(stack, chat_prompts, ar_reference, assert_speculated):
    """On the shared stack (tests/services/conftest.py), whose draft is the product's distilled feature draft."""
    before = feature_rows_forwarded(stack)
    with Client(stack.grpc_address, timeout=600) as client:
        for mode in ("ssd", "sd"):
            results = [client.generate(p, max_tokens=N_TOKENS, ignore_eos=True, mode=mode)
                       for p in chat_prompts[:N_PROMPTS]]
            assert [r.token_ids for r in results] == ar_reference[:N_PROMPTS], mode
            assert_speculated(results, mode)
        rows = feature_rows_forwarded(stack) - before
        # every prompt position and every committed position but the last of each request, at most
        assert 0 < rows <= 2 * sum(len(p) + N_TOKENS for p in chat_prompts[:N_PROMPTS])
        sampled = [client.generate(p, max_tokens=N_TOKENS, ignore_eos=True, mode="ssd", temperature=0.8, seed=i)
                   for i, p in enumerate(chat_prompts[:2])]
        assert [len(r.token_ids) for r in sampled] == [N_TOKENS, N_TOKENS]
        assert feature_rows_forwarded(stack) - before > rows
    draft_log = (stack.logs / "draft0.log").read_text()
    assert "features ignored" not in draft_log and "Traceback" not in draft_log
    router_log = (stack.logs / "router.log").read_text()
    assert "feature bytes" not in router_log and "reads features of size" not in router_log
