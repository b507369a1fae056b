"""Prompt logprobs and echo through the real stack: over gRPC (the SDK's Result.prompt_logprobs) each prompt token
after the first carries the target's own log-softmax (float32) given the tokens before it, its rank and top
alternatives, also for a prompt the target's prefix cache holds, and the generated tokens are those of the same
request without them; the OpenAI HTTP API returns the same numbers (completions echo with logprobs, vLLM's
prompt_logprobs on completions and chat), parsed by the openai client; bad values are INVALID_ARGUMENT / 400s
naming the field."""
import openai
import pytest
import torch

from ssd.client import Client, InvalidRequestError
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model
from ssd.tokenizer import Tokenizer

TOKENS, TOP = 4, 2
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def target(default_models):
    return load_model(default_models["target"])


@pytest.fixture(scope="module")
def tok(default_models):
    return Tokenizer.from_folder(default_models["target"])


@pytest.fixture(scope="module")
def http(stack):
    return openai.OpenAI(base_url=f"http://{stack.http_address}/v1", api_key="unused", max_retries=0, timeout=300)


def prompt_reference(model, prompt: list[int]) -> torch.Tensor:
    """log_softmax (float32) of the target's logits after prompt[:i + 1], i = 0..len(prompt) - 2."""
    with torch.inference_mode():
        hidden = model(ForwardBatch.ragged([prompt], [0], [0]), model.make_cache(1, len(prompt) + 1))
        return torch.log_softmax(model.logits(hidden[0, :len(prompt) - 1]).float(), dim=-1)


def test_grpc_prompt_logprobs_are_the_targets_and_change_no_token(stack, target, chat_prompts, assert_speculated):
    prompt = chat_prompts[5]   # prompt 4 hit the cache in 0 of 13 rounds on a fresh stack once; prompt 5 hits
    with Client(stack.grpc_address, timeout=300) as client:
        # 16 tokens: long enough for rounds after the first (a forced miss) to take speculations from the cache
        plain = client.generate(prompt, max_tokens=16, ignore_eos=True, mode="ssd")   # caches the prompt
        asked = client.generate(prompt, max_tokens=16, ignore_eos=True, mode="ssd", prompt_logprobs=TOP)
        with pytest.raises(InvalidRequestError) as err:
            client.generate(prompt, max_tokens=TOKENS, prompt_logprobs=21)
    assert "prompt_logprobs" in err.value.details
    assert asked.token_ids == plain.token_ids and plain.prompt_logprobs == []
    assert_speculated([plain, asked], "ssd")
    want = prompt_reference(target, prompt)
    assert [lp.token_id for lp in asked.prompt_logprobs] == prompt[1:]
    for i, lp in enumerate(asked.prompt_logprobs):
        assert lp.logprob == pytest.approx(float(want[i, lp.token_id]), abs=1e-4)
        assert lp.rank == int((want[i] > want[i, lp.token_id]).sum()) + 1
        values, ids = want[i].topk(TOP)
        assert [t.token_id for t in lp.top] == ids.tolist()
        assert [t.logprob for t in lp.top] == pytest.approx(values.tolist(), abs=1e-4)


def test_http_echo_and_prompt_logprobs_equal_the_targets_in_openai_and_vllm_shape(stack, target, tok, http):
    ids = tok.encode(PROMPT)
    want = prompt_reference(target, ids)
    with Client(stack.grpc_address, timeout=300) as client:
        ref = client.generate(ids, max_tokens=TOKENS, ignore_eos=True, logprobs=TOP)
    model = http.models.list().data[0].id
    out = http.completions.create(model=model, prompt=PROMPT, max_tokens=TOKENS, temperature=0, echo=True,
                                  logprobs=TOP, extra_body={"ignore_eos": True, "prompt_logprobs": TOP})
    choice = out.choices[0]
    assert choice.text == PROMPT + ref.text
    lp = choice.logprobs
    assert lp.tokens == [tok.decode([t]) for t in ids + ref.token_ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:len(ids)] == pytest.approx([float(want[i, t]) for i, t in enumerate(ids[1:])],
                                                          abs=1e-4)
    assert lp.token_logprobs[len(ids):] == pytest.approx([x.logprob for x in ref.logprobs], abs=1e-5)
    assert all(choice.text[at:at + len(t)] == t for t, at in zip(lp.tokens, lp.text_offset))
    rows = choice.model_extra["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(ids)
    for i, (t, row) in enumerate(zip(ids[1:], rows[1:])):
        assert row[str(t)]["logprob"] == pytest.approx(float(want[i, t]), abs=1e-4)
        assert row[str(t)]["rank"] == int((want[i] > want[i, t]).sum()) + 1
        assert row[str(t)]["decoded_token"] == tok.decode([t])
        top = want[i].topk(TOP).indices.tolist()
        assert set(row) == {str(t), *map(str, top)} and [row[str(a)]["rank"] for a in top] == [1, 2]
    messages = [{"role": "user", "content": PROMPT}]
    chat = http.chat.completions.create(model=model, messages=messages, max_tokens=2, temperature=0,
                                        extra_body={"prompt_logprobs": 0})
    chat_ids = tok.encode(tok.apply_chat_template(messages))
    chat_want = prompt_reference(target, chat_ids)
    chat_rows = chat.model_extra["prompt_logprobs"]
    assert chat_rows[0] is None and [list(r) for r in chat_rows[1:]] == [[str(t)] for t in chat_ids[1:]]
    assert [r[str(t)]["logprob"] for t, r in zip(chat_ids[1:], chat_rows[1:])] == \
        pytest.approx([float(chat_want[i, t]) for i, t in enumerate(chat_ids[1:])], abs=1e-4)
    with pytest.raises(openai.BadRequestError) as err:
        http.completions.create(model=model, prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 21})
    assert err.value.param == "prompt_logprobs"
