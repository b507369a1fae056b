"""Penalties, biases and min_tokens through the real stack: penalised greedy requests in sd and ssd, over gRPC
(the SDK) and over HTTP (the openai client), return exactly what the target alone gives with those penalties
(the in-process AR engine); and the served context is the model's own."""
import openai
import pytest

from ssd.client import Client
from ssd.engine.ar import AREngine
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from ssd.tokenizer import Tokenizer

TOKENS = 24
# values float32 holds exactly, as the proto carries them
PENALTIES = dict(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.25)


@pytest.fixture(scope="module")
def tok(default_models):
    return Tokenizer.from_folder(default_models["target"])


@pytest.fixture(scope="module")
def penalised_reference(default_models, chat_prompts, tok):
    """In-process AR outputs of the first two prompts with the penalties and a bias, and with min_tokens holding
    back an EOS that a bias pushes to the front."""
    bias = {tok.encode(" the")[0]: 3.0}
    eos = min(tok.eos_token_ids)
    engine = AREngine(load_model(default_models["target"]), max_batch=2, max_len=512)
    penalised = SamplingParams(max_tokens=TOKENS, ignore_eos=True, logit_bias=bias, **PENALTIES)
    early = SamplingParams(max_tokens=TOKENS, logit_bias={eos: 30.0}, min_tokens=6)
    return {"bias": bias, "eos": eos,
            "penalised": [s.output for s in engine.generate(chat_prompts[:2], penalised)],
            "early": [s.output for s in engine.generate(chat_prompts[:2], early)]}


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_penalised_greedy_through_the_stack_equals_penalised_ar(stack, chat_prompts, penalised_reference, mode,
                                                                 assert_speculated):
    ref = penalised_reference
    with Client(stack.grpc_address, timeout=300) as client:
        penalised = [client.generate(p, max_tokens=TOKENS, ignore_eos=True, mode=mode, logit_bias=ref["bias"],
                                     **PENALTIES) for p in chat_prompts[:2]]
        early = [client.generate(p, max_tokens=TOKENS, mode=mode, logit_bias={ref["eos"]: 30.0}, min_tokens=6)
                 for p in chat_prompts[:2]]
    assert [r.token_ids for r in penalised] == ref["penalised"]
    assert [r.token_ids for r in early] == ref["early"]
    assert all(r.finish_reason == "eos" and r.completion_tokens > 6 for r in early)
    assert_speculated(penalised, mode)


def test_penalised_chat_over_http_equals_penalised_ar(stack, chat_prompts, penalised_reference, tok):
    client = openai.OpenAI(base_url=f"http://{stack.http_address}/v1", api_key="unused", max_retries=0, timeout=300)
    ref = penalised_reference
    out = client.completions.create(
        model=client.models.list().data[0].id, prompt=chat_prompts[0], max_tokens=TOKENS, temperature=0,
        presence_penalty=PENALTIES["presence_penalty"], frequency_penalty=PENALTIES["frequency_penalty"],
        logit_bias={str(t): b for t, b in ref["bias"].items()},
        extra_body={"ignore_eos": True, "repetition_penalty": PENALTIES["repetition_penalty"],
                    "speculation": {"mode": "ssd"}})
    assert out.choices[0].text == tok.decode(ref["penalised"][0], skip_special_tokens=True)
    assert out.usage.completion_tokens == TOKENS
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=out.model, prompt="Hi", max_tokens=4, presence_penalty=2.5)
    assert e.value.param == "presence_penalty"


def test_the_stack_serves_the_models_own_context(stack):
    client = openai.OpenAI(base_url=f"http://{stack.http_address}/v1", api_key="unused", max_retries=0, timeout=60)
    card = client.models.retrieve(client.models.list().data[0].id)
    assert card.model_extra["max_model_len"] == 8192   # SmolLM2's max_position_embeddings


def test_a_stop_string_does_not_end_a_request_before_min_tokens(stack):
    client = openai.OpenAI(base_url=f"http://{stack.http_address}/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    ask = dict(model=model, prompt="The capital of France is", max_tokens=12, temperature=0)
    text = client.completions.create(**ask, extra_body={"ignore_eos": True}).choices[0].text
    stop = text[:3]   # matches in the first token or two
    early = client.completions.create(**ask, stop=[stop], extra_body={"ignore_eos": True})
    assert early.choices[0].text == "" and early.model_extra["ssd"]["finish_reason"] == "stop_string"
    held = client.completions.create(**ask, stop=[stop], extra_body={"ignore_eos": True, "min_tokens": 8,
                                                                     "speculation": {"mode": "ssd"}})
    assert held.usage.completion_tokens >= 8 and held.choices[0].text and text.startswith(held.choices[0].text)
