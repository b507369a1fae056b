"""Prompt logprobs through the real stack: over gRPC (the SDK's Result.prompt_logprobs) each prompt token after
the first carries the target's own log-softmax (float32) given the tokens before it, its rank and top
alternatives, also for a prompt the target's prefix cache holds, and the generated tokens are those of the same
request without them; a bad value is INVALID_ARGUMENT naming the field."""
import pytest
import torch

from ssd.client import Client, InvalidRequestError
from ssd.models.decoder import ForwardBatch
from ssd.models.loader import load_model

TOKENS, TOP = 4, 2


@pytest.fixture(scope="module")
def target(default_models):
    return load_model(default_models["target"])


def prompt_reference(model, prompt: list[int]) -> torch.Tensor:
    """log_softmax (float32) of the target's logits after prompt[:i + 1], i = 0..len(prompt) - 2."""
    with torch.inference_mode():
        hidden = model(ForwardBatch.ragged([prompt], [0], [0]), model.make_cache(1, len(prompt) + 1))
        return torch.log_softmax(model.logits(hidden[0, :len(prompt) - 1]).float(), dim=-1)


def test_grpc_prompt_logprobs_are_the_targets_and_change_no_token(stack, target, chat_prompts):
    prompt = chat_prompts[4]
    with Client(stack.grpc_address, timeout=300) as client:
        plain = client.generate(prompt, max_tokens=TOKENS, ignore_eos=True, mode="ssd")   # caches the prompt
        asked = client.generate(prompt, max_tokens=TOKENS, ignore_eos=True, mode="ssd", prompt_logprobs=TOP)
        with pytest.raises(InvalidRequestError) as err:
            client.generate(prompt, max_tokens=TOKENS, prompt_logprobs=21)
    assert "prompt_logprobs" in err.value.details
    assert asked.token_ids == plain.token_ids and plain.prompt_logprobs == []
    want = prompt_reference(target, prompt)
    assert [lp.token_id for lp in asked.prompt_logprobs] == prompt[1:]
    for i, lp in enumerate(asked.prompt_logprobs):
        assert lp.logprob == pytest.approx(float(want[i, lp.token_id]), abs=1e-4)
        assert lp.rank == int((want[i] > want[i, lp.token_id]).sum()) + 1
        values, ids = want[i].topk(TOP)
        assert [t.token_id for t in lp.top] == ids.tolist()
        assert [t.logprob for t in lp.top] == pytest.approx(values.tolist(), abs=1e-4)
