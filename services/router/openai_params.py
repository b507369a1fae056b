"""OpenAI request bodies -> `Frontend.build` arguments, with nothing silently ignored.

Every field of a body is one of three kinds: honoured (read below), accepted only at the value that changes
nothing (`NO_OP`: `echo` false, `response_format` text, ...), or refused with ValueError("field: ...")
(HTTP 400 naming it): a field this server does not implement ("not supported by this server"), one of the
other endpoint ("not a field of ..."), or one nobody defines ("unknown field"). JSON `null` is an unset field.
The same holds inside `stream_options`, `speculation` and each chat message. Structured output is read by
`openai_structured.py`, tools by `openai_tools.py`, the helpers all three share live in `openai_fields.py`. No torch
here.
"""
from __future__ import annotations

from dataclasses import dataclass

from ssd.params import MAX_LOGPROBS
from services.router.openai_fields import (BOOL, INT, LIST, NUMBER, OBJECT, STOP, STR, check_object, get, is_int,
                                           messages, same)
from services.router.openai_structured import constraint
from services.router.openai_tools import ToolCall, tool_call

# read by `parse`, on both endpoints or on one
HONOURED = frozenset({"model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed",
                      "seed_stream", "stop",
                      "stop_token_ids", "ignore_eos", "max_tokens", "user", "speculation", "presence_penalty",
                      "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "logprobs", "n",
                      "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                      "structured_outputs", "tools", "tool_choice",
                      "prompt_logprobs"})   # read, with completions' echo, by openai_prompt.py
CHAT_ONLY = frozenset({"messages", "max_completion_tokens", "top_logprobs"})
COMPLETION_ONLY = frozenset({"prompt", "best_of", "echo"})
# accepted at exactly these values, which change nothing (best_of 1 on chat, as vLLM's chat accepts it)
NO_OP = {"best_of": (1,), "echo": (False,), "suffix": ("",),
         "parallel_tool_calls": (True, False), "functions": ([],), "function_call": ("none",), "store": (False,),
         "service_tier": ("auto", "default"), "modalities": (["text"],), "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,),
         "include_stop_str_in_output": (False,), "add_generation_prompt": (True,), "add_special_tokens": (False,),
         "continue_final_message": (False,), "use_beam_search": (False,), "length_penalty": (1, 1.0),
         "return_tokens_as_token_ids": (False,), "priority": (0,)}
# known (OpenAI's or vLLM's) but not implemented here: refused at any value outside NO_OP
UNSUPPORTED = frozenset(NO_OP) | {
    "audio", "prediction", "reasoning_effort", "web_search_options", "metadata", "verbosity", "prompt_cache_key",
    "safety_identifier", "guided_decoding_backend",
    "guided_whitespace_pattern", "allowed_token_ids", "bad_words",
    "truncate_prompt_tokens", "chat_template", "chat_template_kwargs", "documents", "request_id",
    "mm_processor_kwargs", "cache_salt", "kv_transfer_params", "vllm_xargs"}
STREAM_OPTIONS = {"include_usage": None, "continuous_usage_stats": (False,)}
SPECULATION = frozenset({"mode", "k"})


def check_fields(body: dict, chat: bool) -> None:
    """Refuse every field of `body` that this endpoint does not honour at the value given."""
    honoured = HONOURED | (CHAT_ONLY if chat else COMPLETION_ONLY)
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    for name, value in body.items():
        if name in honoured or value is None or any(same(value, v) for v in NO_OP.get(name, ())):
            continue
        if name in (COMPLETION_ONLY if chat else CHAT_ONLY):
            raise ValueError(f"{name}: not a field of {endpoint}")
        if name in UNSUPPORTED:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise ValueError(f"{name}: not supported by this server (got {shown})")
        raise ValueError(f"{name}: unknown field")


@dataclass(slots=True)
class Parsed:
    build: dict           # Frontend.build keyword arguments
    stream: bool
    include_usage: bool
    user: str | None = None
    tools: ToolCall | None = None   # the output may be a tool call (tool_choice auto, required or named)


def parse(body: dict, chat: bool) -> Parsed:
    """An OpenAI request body -> Frontend.build arguments; raises ValueError("field: ...")."""
    check_fields(body, chat)
    call = None
    if chat:
        prompt = {"messages": messages(get(body, "messages", LIST))}
        call = tool_call(body)
        if call is not None:
            prompt["messages"] = call.messages
        max_tokens = get(body, "max_completion_tokens", INT)
        max_tokens = get(body, "max_tokens", INT) if max_tokens is None else max_tokens
        top = get(body, "top_logprobs", INT, 0)
        if not 0 <= top <= MAX_LOGPROBS:
            raise ValueError(f"top_logprobs: must be an integer in 0..{MAX_LOGPROBS}, got {top}")
        if top and not get(body, "logprobs", BOOL, False):
            raise ValueError("top_logprobs: needs logprobs: true")
        logprobs = top if get(body, "logprobs", BOOL, False) else None
    else:
        prompt = _prompt(body.get("prompt"))
        max_tokens = get(body, "max_tokens", INT)
        logprobs = get(body, "logprobs", INT)
    best_of = None if chat else get(body, "best_of", INT)
    stream = get(body, "stream", BOOL, False)
    if stream and best_of is not None and best_of > 1:
        raise ValueError("best_of: cannot be used with stream (the best choices are known only at the end)")
    spec = get(body, "speculation", OBJECT, {})
    check_object(spec, {name: None for name in SPECULATION}, "speculation")
    opts = get(body, "stream_options", OBJECT, {})
    check_object(opts, STREAM_OPTIONS, "stream_options")
    top_k = get(body, "top_k", INT, 0)
    build = dict(prompt, temperature=get(body, "temperature", NUMBER, 1.0), top_k=0 if top_k == -1 else top_k,
                 top_p=get(body, "top_p", NUMBER, 1.0), min_p=get(body, "min_p", NUMBER, 0.0),
                 seed=get(body, "seed", INT), seed_stream=get(body, "seed_stream", BOOL, False),
                 max_tokens=max_tokens, stop=get(body, "stop", STOP, ()),
                 stop_token_ids=get(body, "stop_token_ids", LIST, ()),
                 ignore_eos=get(body, "ignore_eos", BOOL, False),
                 presence_penalty=get(body, "presence_penalty", NUMBER, 0.0),
                 frequency_penalty=get(body, "frequency_penalty", NUMBER, 0.0),
                 repetition_penalty=get(body, "repetition_penalty", NUMBER, 1.0),
                 logit_bias=_logit_bias(get(body, "logit_bias", OBJECT, {})),
                 min_tokens=get(body, "min_tokens", INT, 0), logprobs=logprobs, n=get(body, "n", INT, 1),
                 best_of=best_of, mode=get(spec, "mode", STR, "", "speculation.mode"),
                 k=get(spec, "k", INT, 0, "speculation.k"), constraint=call.constraint if call else constraint(body))
    return Parsed(build, stream,
                  get(opts, "include_usage", BOOL, False, "stream_options.include_usage"), get(body, "user", STR),
                  call)


def _logit_bias(bias: dict) -> dict[int, float]:
    """OpenAI's {"token id": bias} -> {id: bias}; the ids' range and the biases' are Frontend.build's to check."""
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()):
            raise ValueError(f"logit_bias: keys must be token ids (integers, as strings), got {key[:40]!r}")
        out[int(key)] = get(bias, key, NUMBER, param=f"logit_bias[{key}]")
    return out


def _prompt(p) -> dict:
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one is one prompt
    if isinstance(p, str):
        return {"text": p}
    if isinstance(p, list) and all(is_int(t) for t in p):
        return {"token_ids": p}
    if isinstance(p, list) and all(isinstance(x, (str, list)) for x in p):
        raise ValueError("prompt: batched prompts are not supported")
    raise ValueError("prompt: is required, as a string or a list of token ids")


@dataclass(slots=True)
class TokenizeRequest:
    text: str | None
    messages: list | None
    add_special_tokens: bool
    add_generation_prompt: bool
    return_token_strs: bool


def parse_tokenize(body: dict) -> TokenizeRequest:
    """A vLLM /tokenize body: {prompt} or {messages}, add_special_tokens, add_generation_prompt (chat),
    return_token_strs."""
    chat = body.get("messages") is not None
    fields = {"model", "add_special_tokens", "return_token_strs"} | (
        {"messages", "add_generation_prompt"} if chat else {"prompt"})
    for name, value in body.items():
        if name not in fields and value is not None:
            raise ValueError(f"{name}: " + ("not supported by this server" if name in UNSUPPORTED | {
                "continue_final_message", "chat_template", "tools"} else "unknown field"))
    text = None if chat else get(body, "prompt", STR)
    if not chat and text is None:
        raise ValueError("prompt: is required (a string), or give messages")
    return TokenizeRequest(text, messages(get(body, "messages", LIST)) if chat else None,
                           get(body, "add_special_tokens", BOOL, False),
                           get(body, "add_generation_prompt", BOOL, True),
                           get(body, "return_token_strs", BOOL, False))
