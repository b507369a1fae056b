"""`build_request`: a prompt (text, token ids or chat messages) and the caller's options as a
`GenerateRequest`, refusing a malformed one before it is sent (`InvalidRequestError` naming the field)."""
from __future__ import annotations

from ssd.client.errors import InvalidRequestError
from ssd.pb import generation_pb2 as pb


def _fill(msg, prefix: str, **values):
    """Sets fields on a protobuf message; a value protobuf refuses becomes an InvalidRequestError naming it."""
    for name, value in values.items():
        if value is None:
            continue
        try:
            if isinstance(value, list):
                getattr(msg, name).extend(value)
            elif isinstance(value, dict):
                getattr(msg, name).update(value)
            else:
                setattr(msg, name, value)
        except (TypeError, ValueError) as e:
            raise InvalidRequestError("INVALID_ARGUMENT", f"{prefix}{name}: {e}") from None
    return msg


def _add_messages(req: pb.GenerateRequest, messages: list) -> None:
    req.chat.SetInParent()
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidRequestError("INVALID_ARGUMENT", f"messages[{i}]: needs string 'role' and 'content'")
        req.chat.messages.add(role=m["role"], content=m["content"])


def build_request(prompt: str | list[int] | list[dict] | None = None, *, chat: bool = False,
                  messages: list[dict] | None = None, max_tokens: int = 0, temperature: float = 0.0,
                  top_k: int = 0, top_p: float = 0.0, min_p: float = 0.0, seed: int | None = None,
                  seed_stream: bool = False, ignore_eos: bool = False, stop_token_ids=(), stop: str | list[str] = (),
                  request_id: str = "",
                  mode: str = "", k: int = 0, speculation_off: bool = False, presence_penalty: float = 0.0,
                  frequency_penalty: float = 0.0, repetition_penalty: float = 0.0,
                  logit_bias: dict[int, float] | None = None, min_tokens: int = 0,
                  logprobs: int | None = None, n: int | None = None,
                  best_of: int | None = None, constraint: tuple[str, str] | None = None,
                  prompt_logprobs: int | None = None) -> pb.GenerateRequest:
    """The GenerateRequest for a prompt and options. The prompt is raw text (one user chat message when
    chat=True), token ids, or chat messages ({"role", "content"} dicts), which `messages=` may give instead.
    Penalties and biases (`repetition_penalty` 0 = off, like 1) are the target's, applied at every position.
    A `seed` reproduces the tokens in every mode and at any K (each position's draw is keyed by seed and position);
    `seed_stream=True` seeds one random stream instead (reproducible for one mode and K; a little more acceptance).
    `logprobs` = N: each token's log-probability and its N most probable alternatives (None: none);
    `prompt_logprobs` = N: the same for each prompt token after the first (`Result.prompt_logprobs`).
    `n` choices (1..16; each its own sequence, choice i seeded with seed + i), the best n of `best_of` candidates
    by cumulative logprob (n..16). `constraint` = (kind, text): structured output, kind json_object (text ""),
    json_schema (the schema's JSON), regex or lark; the server compiles it."""
    for name, value, low in (("n", n, 1), ("best_of", best_of, max(1, n or 1))):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 16):
            raise InvalidRequestError("INVALID_ARGUMENT", f"{name}: must be an integer in {low}..16, got {value!r}")
    req = _fill(pb.GenerateRequest(), "", max_tokens=max_tokens, ignore_eos=ignore_eos, request_id=request_id,
                stop_token_ids=list(stop_token_ids), stop=[stop] if isinstance(stop, str) else list(stop),
                min_tokens=min_tokens, logprobs=logprobs, n=n, best_of=best_of, prompt_logprobs=prompt_logprobs)
    _fill(req.sampling, "sampling.", temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
          seed_stream=seed_stream,
          presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
          repetition_penalty=repetition_penalty, logit_bias=dict(logit_bias or {}))
    _fill(req.speculation, "speculation.", mode=mode, k=k, off=speculation_off)
    if constraint is not None:
        kind, text = constraint
        _fill(req.constraint, "constraint.", kind=kind, text=text)
        req.constraint.SetInParent()
    if messages is not None and prompt is not None:
        raise InvalidRequestError("INVALID_ARGUMENT", "prompt: give a prompt or messages, not both")
    if messages is not None:
        _add_messages(req, list(messages))
    elif isinstance(prompt, str):
        if chat:
            req.chat.messages.add(role="user", content=prompt)
        else:
            req.text = prompt
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        _add_messages(req, list(prompt))
    elif isinstance(prompt, (list, tuple)):
        req.token_ids.SetInParent()
        _fill(req.token_ids, "prompt.token_ids.", ids=list(prompt))
    else:
        raise InvalidRequestError("INVALID_ARGUMENT", "prompt: expected text, token ids or chat messages, "
                                                      f"got {type(prompt).__name__}")
    return req
