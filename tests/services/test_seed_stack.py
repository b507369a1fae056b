"""Seeds that reproduce, through the real stack: a seeded sampled request returns the same tokens in ar, sd and ssd,
at any K, under concurrent load and run after run, over gRPC (the SDK) and over HTTP (the openai client); and
they are the in-process target's own (the AR engine with the same seed). `seed_stream` reaches the workers."""
import threading

import openai
import pytest

from ssd.client import Client
from ssd.engine.ar import AREngine
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from ssd.tokenizer import Tokenizer
from tests.services.conftest import accepted_drafts

TOKENS, SEED = 12, 4242
SAMPLED = dict(temperature=1.0, top_p=0.95, max_tokens=TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def seeded_reference(default_models, chat_prompts):
    """The target alone (in-process AR) with the seed: what every mode must return."""
    engine = AREngine(load_model(default_models["target"]), max_batch=2, max_len=512)
    return engine.generate(chat_prompts[:1], SamplingParams(seed=SEED, **SAMPLED))[0].output


def test_a_seeded_request_gives_the_targets_tokens_in_every_mode_and_k_under_load(stack, chat_prompts,
                                                                                   seeded_reference):
    stop, errors = threading.Event(), []

    def load(i):   # other sampled and greedy requests share the batches meanwhile
        try:
            with Client(stack.grpc_address, timeout=300) as client:
                while not stop.is_set():
                    client.generate(chat_prompts[1 + i % 2], max_tokens=6, ignore_eos=True, mode="ssd",
                                    temperature=0.8 * (i % 2))
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        with Client(stack.grpc_address, timeout=300) as client:
            runs = {f"{mode} k={k}": client.generate(chat_prompts[0], seed=SEED, mode=mode, k=k, **SAMPLED)
                    for mode, k in [("ar", 0), ("sd", 1), ("sd", 3), ("ssd", 2), ("ssd", 3), ("ssd", 3)]}
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    assert not errors, errors
    assert {name: r.token_ids for name, r in runs.items()} == {name: seeded_reference for name in runs}
    # the drafts' coupled proposals were accepted, not only the target's own draws
    assert accepted_drafts([r for name, r in runs.items() if not name.startswith("ar")]) > 0
    assert sum(r.stats.cache_hits for name, r in runs.items() if name.startswith("ssd")) > 0   # SSD's cache served


def test_a_seed_reproduces_over_http_and_seed_stream_is_honoured(stack, chat_prompts, seeded_reference, default_models):
    tok = Tokenizer.from_folder(default_models["target"])
    client = openai.OpenAI(base_url=f"http://{stack.http_address}/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    prompt = chat_prompts[0]   # token ids, as the reference took them

    def complete(mode, **extra):
        out = client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS, temperature=1.0, top_p=0.95,
                                        seed=extra.pop("seed", SEED),
                                        extra_body={"ignore_eos": True, "speculation": {"mode": mode}, **extra})
        return out.choices[0].text

    want = tok.decode(seeded_reference, skip_special_tokens=True)
    assert complete("ssd") == complete("sd") == complete("ar") == want
    # a per-request stream: the ar and sd draws differ (for at least one of three seeds), so the option arrived
    assert any(complete("ar", seed=s, seed_stream=True) != complete("sd", seed=s, seed_stream=True) for s in range(3))
    with pytest.raises(openai.BadRequestError) as e:
        complete("ar", seed_stream="yes")
    assert e.value.param == "seed_stream"
