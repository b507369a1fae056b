import pytest

from ssd.cli.launcher import Stack, StackConfig
from ssd.engine.ar import AREngine
from ssd.models.loader import load_model
from ssd.prompts import PROMPTS
from ssd.sampling import SamplingParams
from ssd.tokenizer import Tokenizer

N_PROMPTS, N_TOKENS = 10, 32


@pytest.fixture(scope="session")
def chat_prompts(default_models):
    tok = Tokenizer.from_folder(default_models["target"])
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS[:N_PROMPTS]]


@pytest.fixture(scope="session")
def ar_reference(default_models, chat_prompts):
    """In-process AR outputs: what every mode through the stack must reproduce."""
    engine = AREngine(load_model(default_models["target"]), max_batch=N_PROMPTS)
    params = SamplingParams(max_tokens=N_TOKENS, ignore_eos=True)
    return [s.output for s in engine.generate(chat_prompts, params)]


def accepted_drafts(results) -> int:
    """Drafted tokens the target accepted over `results` (ssd.client.Result): the first token comes from prefill
    and every round commits its accepted drafts plus one token, so a round without speculation adds exactly one."""
    return sum(r.completion_tokens - 1 - r.stats.rounds for r in results)


@pytest.fixture(scope="session")
def assert_speculated():
    """Checks that requests really speculated: drafted tokens were accepted and, in ssd, the cache was hit (a
    K = 0 round also counts as a round, so `rounds > 0` alone proves nothing)."""
    def check(results, mode: str) -> None:
        assert all(r.stats.mode == mode for r in results)
        assert sum(r.stats.rounds for r in results) > 0, mode
        assert accepted_drafts(results) > 0, f"{mode}: no drafted token was accepted"
        if mode == "ssd":
            assert sum(r.stats.cache_hits for r in results) > 0, "ssd: no round took its speculation from the cache"
    return check


@pytest.fixture(scope="session")
def stack(default_models, tmp_path_factory):
    """A real stack: router, target and one draft as separate processes on loopback, with the product's default
    pair (the distilled feature draft accepts about half of its tokens) and K fixed at 3 (`--adaptive false`), so
    every sd/ssd request speculates whatever ran before it. The adaptive policy has its own stack
    (test_adaptive_stack.py)."""
    yield from _default_stack(default_models, tmp_path_factory.mktemp("logs"))


@pytest.fixture(scope="module")
def fresh_stack(default_models, tmp_path_factory):
    """The `stack` fixture's settings in a stack of the module's own, which no other test module has used."""
    yield from _default_stack(default_models, tmp_path_factory.mktemp("fresh-logs"))


def _default_stack(default_models, logs):
    cfg = StackConfig(mode="ssd", drafts=1, log_dir=logs, max_batch=16, target_cpus="0", draft_cpus="1", threads=1,
                      draft_model=default_models["draft"], extra={"router": ["--adaptive", "false"]})
    with Stack(cfg) as s:
        s.logs = logs
        yield s
