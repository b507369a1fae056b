import pytest

from ssd.engine.ar import AREngine
from ssd.launcher import Stack, StackConfig
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


@pytest.fixture(scope="session")
def stack(default_models, tmp_path_factory):
    """A real stack: router, target and one draft as separate processes on loopback. The draft is the
    layer-truncated one (it accepts ~4% of tokens): these tests are about the services, not the draft; the
    distilled default draft runs through the stack in test_feature_plumbing.py."""
    logs = tmp_path_factory.mktemp("logs")
    cfg = StackConfig(mode="ssd", drafts=1, log_dir=logs, max_batch=16, target_cpus="0", draft_cpus="1", threads=1,
                      draft_model=default_models["layer_draft"])
    with Stack(cfg) as s:
        s.logs = logs
        yield s
