"""Logprobs through the real stack: in ar, sd and ssd each streamed token carries the target's own log-softmax
(float32) at its position and its top alternatives (over gRPC, the SDK), and the OpenAI HTTP API returns the
same numbers in OpenAI's shape, parsed by the openai client."""
import openai
import pytest
import torch

from ssd.client import Client
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model
from ssd.tokenizer import Tokenizer

TOKENS, TOP = 16, 3
MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def target(default_models):
    return load_model(default_models["target"])


def teacher_forced(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    tokens = prompt + output
    with torch.inference_mode():
        hidden = model(ForwardBatch.ragged([tokens], [0], [0]), model.make_cache(1, len(tokens) + 1))
        return torch.log_softmax(model.logits(hidden[0, len(prompt) - 1:len(tokens) - 1]).float(), dim=-1)


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_streamed_logprobs_are_the_targets_log_softmax(stack, chat_prompts, target, mode):
    with Client(stack.grpc_address, timeout=300) as client:
        items = list(client.stream(chat_prompts[2], max_tokens=TOKENS, ignore_eos=True, mode=mode, logprobs=TOP))
    result = items[-1]
    assert [lp.token_id for lp in result.logprobs] == result.token_ids and len(result.token_ids) == TOKENS
    assert sum(len(d.logprobs) for d in items[:-1]) == TOKENS   # each delta carries its own tokens' logprobs
    want = teacher_forced(target, chat_prompts[2], result.token_ids)
    for i, lp in enumerate(result.logprobs):
        assert lp.logprob == pytest.approx(float(want[i, lp.token_id]), abs=1e-4)
        values, ids = want[i].topk(TOP)
        assert [t.token_id for t in lp.top] == ids.tolist()
        assert [t.logprob for t in lp.top] == pytest.approx(values.tolist(), abs=1e-4)
    if mode != "ar":
        assert result.stats.rounds < TOKENS - 1   # some rounds committed several tokens, each with its logprob


def test_http_logprobs_equal_the_grpc_ones_in_openai_shape(stack, default_models):
    tok = Tokenizer.from_folder(default_models["target"])
    with Client(stack.grpc_address, timeout=300) as client:
        ref = client.generate(messages=MESSAGES, max_tokens=TOKENS, ignore_eos=True, mode="ssd", logprobs=2)
    http = openai.OpenAI(base_url=f"http://{stack.http_address}/v1", api_key="unused", max_retries=0, timeout=300)
    model = http.models.list().data[0].id
    chat = http.chat.completions.create(model=model, messages=MESSAGES, max_tokens=TOKENS, temperature=0,
                                        logprobs=True, top_logprobs=2,
                                        extra_body={"ignore_eos": True, "speculation": {"mode": "ssd"}})
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == [tok.decode([t]) for t in ref.token_ids]
    # the two requests' rounds verify different numbers of positions, and a float32 product's summation order
    # follows its row count: the same tolerance as against the teacher-forced target above
    assert [c.logprob for c in content] == pytest.approx([lp.logprob for lp in ref.logprobs], abs=1e-4)
    assert [[a.token for a in c.top_logprobs] for c in content] == \
        [[tok.decode([a.token_id]) for a in lp.top] for lp in ref.logprobs]
    chunks = http.chat.completions.create(model=model, messages=MESSAGES, max_tokens=TOKENS, temperature=0,
                                          logprobs=True, stream=True, extra_body={"ignore_eos": True})
    streamed = [c.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs
                for c in ch.choices[0].logprobs.content]
    assert streamed == pytest.approx([lp.logprob for lp in ref.logprobs], abs=1e-4)
