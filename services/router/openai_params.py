"""OpenAI request bodies -> `Frontend.build` arguments, with nothing silently ignored.

Every field of a body is one of three kinds: honoured (read below), accepted only at the value that changes
nothing (`NO_OP`: `echo` false, `response_format` text, ...), or refused with ValueError("field: ...")
(HTTP 400 naming it): a field this server does not implement ("not supported by this server"), one of the
other endpoint ("not a field of ..."), or one nobody defines ("unknown field"). JSON `null` is an unset field.
The same holds inside `stream_options`, `speculation` and each chat message. No torch here.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ssd.constraints import Constraint
from ssd.params import MAX_LOGPROBS

NUMBER, INT, BOOL, STR, LIST, OBJECT, STOP = (int, float), (int,), (bool,), (str,), (list,), (dict,), (str, list)
WHAT = {NUMBER: "a number", INT: "an integer", BOOL: "a boolean", STR: "a string", LIST: "a list",
        OBJECT: "an object", STOP: "a string or a list of strings", (dict, str): "an object or a string"}

# read by `parse`, on both endpoints or on one
HONOURED = frozenset({"model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed",
                      "seed_stream", "stop",
                      "stop_token_ids", "ignore_eos", "max_tokens", "user", "speculation", "presence_penalty",
                      "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "logprobs", "n",
                      "response_format", "guided_json", "guided_regex",
                      "tools", "tool_choice"})
CHAT_ONLY = frozenset({"messages", "max_completion_tokens", "top_logprobs"})
COMPLETION_ONLY = frozenset({"prompt", "best_of"})
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
    "safety_identifier", "guided_choice", "guided_grammar", "guided_decoding_backend",
    "guided_whitespace_pattern", "structured_outputs", "allowed_token_ids", "bad_words", "prompt_logprobs",
    "truncate_prompt_tokens", "chat_template", "chat_template_kwargs", "documents", "request_id",
    "mm_processor_kwargs", "cache_salt", "kv_transfer_params", "vllm_xargs"}
STREAM_OPTIONS = {"include_usage": None, "continuous_usage_stats": (False,)}
SPECULATION = frozenset({"mode", "k"})
MESSAGE_FIELDS = frozenset({"role", "content"})
MESSAGE_UNSUPPORTED = frozenset({"name", "tool_calls", "tool_call_id", "function_call", "refusal", "audio"})


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _same(a, b) -> bool:
    """Equal and of the same JSON type (True is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def get(obj: dict, key: str, types: tuple, default=None, param: str | None = None):
    """obj[key] checked against `types` (None or absent: `default`); ValueError naming `param or key`."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types) or \
            (isinstance(value, float) and not math.isfinite(value)):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(f"{param or key}: must be {WHAT[types]}, got {shown}")
    return value


def check_fields(body: dict, chat: bool) -> None:
    """Refuse every field of `body` that this endpoint does not honour at the value given."""
    honoured = HONOURED | (CHAT_ONLY if chat else COMPLETION_ONLY)
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    for name, value in body.items():
        if name in honoured or value is None or any(_same(value, v) for v in NO_OP.get(name, ())):
            continue
        if name in (COMPLETION_ONLY if chat else CHAT_ONLY):
            raise ValueError(f"{name}: not a field of {endpoint}")
        if name in UNSUPPORTED:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise ValueError(f"{name}: not supported by this server (got {shown})")
        raise ValueError(f"{name}: unknown field")


def _check_object(obj: dict, fields, where: str) -> None:
    for name, value in obj.items():
        allowed = fields.get(name, ()) if isinstance(fields, dict) else None
        if name in fields and (allowed is None or value is None or any(_same(value, v) for v in allowed)):
            continue
        raise ValueError(f"{where}.{name}: " + ("not supported by this server" if name in fields else
                                                "unknown field"))


@dataclass(slots=True)
class Parsed:
    build: dict           # Frontend.build keyword arguments
    stream: bool
    include_usage: bool
    user: str | None = None
    tools: bool = False   # the output is a tool call (tool_choice required or named): answer with tool_calls


def parse(body: dict, chat: bool) -> Parsed:
    """An OpenAI request body -> Frontend.build arguments; raises ValueError("field: ...")."""
    check_fields(body, chat)
    calling = False
    if chat:
        prompt = {"messages": messages(get(body, "messages", LIST))}
        call = tool_call(body)
        if call is not None:
            for name in ("response_format", "guided_json", "guided_regex"):
                if body.get(name) is not None:
                    raise ValueError(f"{name}: cannot be used with tools")
            if get(body, "stream", BOOL, False):
                raise ValueError("stream: not supported with tools (the tool call is answered whole)")
            prompt["messages"], schema = call
            body = {**body, "guided_json": schema}
            calling = True
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
    _check_object(spec, {name: None for name in SPECULATION}, "speculation")
    opts = get(body, "stream_options", OBJECT, {})
    _check_object(opts, STREAM_OPTIONS, "stream_options")
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
                 k=get(spec, "k", INT, 0, "speculation.k"), constraint=constraint(body))
    return Parsed(build, stream,
                  get(opts, "include_usage", BOOL, False, "stream_options.include_usage"), get(body, "user", STR),
                  calling)


TOOL_PROMPT = ("You can call the following functions. Answer with one call, as a JSON object "
               '{{"name": <function name>, "arguments": <its arguments>}} and nothing else.\n{tools}')


def tool_call(body: dict) -> tuple[list, dict] | None:
    """`tools` with `tool_choice` required or a named function: the messages with the tools described in a system
    message (SmolLM2's chat template has no tools), and the JSON schema of a call. None: no tool call to make
    (no tools, or tool_choice none). `auto` is refused: the grammar would have to allow free text too."""
    tools = get(body, "tools", LIST, [])
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, "none"):
            raise ValueError("tool_choice: needs tools")
        return None
    functions = {}
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise ValueError(f"tools[{i}]: must be {{type: function, function: {{name, parameters}}}}")
        _check_object(t, {"type": None, "function": None}, f"tools[{i}]")
        fn = t["function"]
        _check_object(fn, {"name": None, "description": None, "parameters": None, "strict": None},
                      f"tools[{i}].function")
        name = get(fn, "name", STR, None, f"tools[{i}].function.name")
        if not name or name in functions:
            raise ValueError(f"tools[{i}].function.name: must be a non-empty name, each once")
        get(fn, "description", STR, None, f"tools[{i}].function.description")
        functions[name] = {"name": name, "description": fn.get("description") or "",
                           "parameters": get(fn, "parameters", OBJECT, {"type": "object"},
                                             f"tools[{i}].function.parameters")}
    if choice == "none":
        return None
    if choice in (None, "auto"):
        raise ValueError("tool_choice: auto (the default with tools) is not supported; give required or "
                         "{type: function, function: {name}}")
    if choice == "required":
        names = list(functions)
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict) \
            and choice["function"].get("name") in functions and set(choice) == {"type", "function"}:
        names = [choice["function"]["name"]]
    else:
        raise ValueError("tool_choice: must be none, required or {type: function, function: {name}} naming a tool")
    calls = [{"type": "object", "properties": {"name": {"const": n}, "arguments": functions[n]["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for n in names]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    system = TOOL_PROMPT.format(tools=json.dumps([functions[n] for n in names]))
    msgs = list(messages(get(body, "messages", LIST)))
    if msgs and msgs[0]["role"] == "system":
        msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + system}
    else:
        msgs.insert(0, {"role": "system", "content": system})
    return msgs, schema


RESPONSE_FORMAT = {"type": None, "json_schema": None}
JSON_SCHEMA = {"name": None, "schema": None, "strict": None, "description": None}


def constraint(body: dict) -> Constraint | None:
    """Structured output from `response_format` (OpenAI's text, json_object, json_schema) or vLLM's `guided_json`
    (a schema, as an object or its JSON text) and `guided_regex`: at most one of them; the grammar is compiled
    here, so a bad schema or pattern is a 400 naming the field."""
    given = [name for name in ("response_format", "guided_json", "guided_regex") if body.get(name) is not None]
    if len(given) > 1:
        raise ValueError(f"{given[1]}: cannot be used with {given[0]}")
    if not given:
        return None
    name = given[0]
    if name == "response_format":
        fmt = get(body, name, OBJECT)
        _check_object(fmt, RESPONSE_FORMAT, name)
        kind = get(fmt, "type", STR, None, "response_format.type")
        if kind == "text":
            return None
        if kind == "json_object":
            found = Constraint("json_object")
        elif kind == "json_schema":
            spec = get(fmt, "json_schema", OBJECT, None, "response_format.json_schema")
            if spec is None:
                raise ValueError("response_format.json_schema: is required with type json_schema")
            _check_object(spec, JSON_SCHEMA, "response_format.json_schema")
            get(spec, "name", STR, None, "response_format.json_schema.name")
            get(spec, "strict", BOOL, None, "response_format.json_schema.strict")
            schema = get(spec, "schema", OBJECT, None, "response_format.json_schema.schema")
            if schema is None:
                raise ValueError("response_format.json_schema.schema: is required")
            found, name = Constraint("json_schema", json.dumps(schema)), "response_format.json_schema.schema"
        else:
            raise ValueError(f"response_format.type: must be text, json_object or json_schema, got {kind!r}")
    elif name == "guided_json":
        schema = get(body, name, (dict, str))
        found = Constraint("json_schema", schema if isinstance(schema, str) else json.dumps(schema))
    else:
        found = Constraint("regex", get(body, name, STR))
    try:
        found.validate()
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    return found


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
    if isinstance(p, list) and all(_is_int(t) for t in p):
        return {"token_ids": p}
    if isinstance(p, list) and all(isinstance(x, (str, list)) for x in p):
        raise ValueError("prompt: batched prompts are not supported")
    raise ValueError("prompt: is required, as a string or a list of token ids")


def messages(items: list | None) -> list:
    """Chat messages as {role, content} with text content parts joined into one string; the rest is for
    Frontend.build to judge."""
    if items is None:
        raise ValueError("messages: is required, as a list of {role, content} objects")
    out = []
    for i, m in enumerate(items):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}]: needs a string role and a content")
        for name, value in m.items():
            if name not in MESSAGE_FIELDS and value is not None:
                raise ValueError(f"messages[{i}].{name}: " + ("not supported by this server"
                                                              if name in MESSAGE_UNSUPPORTED else "unknown field"))
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       and set(p) == {"type", "text"} for p in content):
                raise ValueError(f"messages[{i}].content: only text parts ({{type: text, text}}) are supported")
            content = "".join(p["text"] for p in content)
        out.append({"role": m["role"], "content": content})
    return out


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
