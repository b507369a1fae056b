"""Torch-free tokenizer for a Hugging Face model folder, plus streaming detokenization.

Contract:

* ``Tokenizer.from_folder(path)`` needs ``tokenizer.json`` (else ``FileNotFoundError``
  naming the path) and optionally reads ``tokenizer_config.json`` (``chat_template``,
  ``bos_token``, ``eos_token``, ``add_bos_token``; tokens as strings or ``{"content": ...}``),
  ``chat_template.jinja`` (wins over the config's template) and ``generation_config.json``
  (``eos_token_id`` int or list, ``bos_token_id``).
* ``encode`` recognises special tokens written in the text; ``add_special_tokens=True`` runs
  the tokenizer's post-processor and prepends bos when ``add_bos_token`` asks for it.
* ``eos_token_ids`` is the union of generation_config's eos ids and the config's eos token.
* ``fingerprint`` is the sha256 hex of the ``tokenizer.json`` bytes; equal fingerprints mean
  the draft and target tokenize identically.
* ``apply_chat_template`` validates messages (list of dicts with string ``role`` and
  ``content``) and renders the Jinja template in an immutable sandbox with HF's whitespace
  settings, ``bos_token``, ``eos_token``, ``raise_exception`` and ``strftime_now``.
* ``IncrementalDetokenizer.push(id)`` returns the new text; deltas never end inside a UTF-8
  character and, with ``flush()``, concatenate to ``decode(all_ids)``.  Each push decodes
  only the tokens since the last emitted boundary.

This module must not import torch or transformers: the router process uses it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

REPLACEMENT_CHAR = "\ufffd"


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def validate_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{index}] must be a dict, got {type(message).__name__}")
        for name in ("role", "content"):
            if name not in message:
                raise ValueError(f"messages[{index}] is missing the '{name}' field")
            if not isinstance(message[name], str):
                raise ValueError(
                    f"messages[{index}].{name} must be a string, got {type(message[name]).__name__}")


@dataclass(slots=True)
class Tokenizer:
    hf: HFTokenizer = field(repr=False)
    fingerprint: str
    chat_template: str | None = field(default=None, repr=False)
    bos_token: str | None = None
    eos_token: str | None = None
    add_bos_token: bool = False
    bos_token_id: int | None = None
    eos_token_ids: frozenset[int] = frozenset()
    source: str = ""
    _template: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_folder(cls, path: str | Path) -> Tokenizer:
        folder = Path(path)
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(
                f"no tokenizer.json in model folder {folder} (looked for {tokenizer_file})")
        raw = tokenizer_file.read_bytes()
        hf = HFTokenizer.from_str(raw.decode("utf-8"))
        config = _read_json(folder / "tokenizer_config.json")
        generation = _read_json(folder / "generation_config.json")

        template = config.get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        template_file = folder / "chat_template.jinja"
        if template_file.is_file():
            template = template_file.read_text(encoding="utf-8")

        bos_token = _token_content(config.get("bos_token"))
        eos_token = _token_content(config.get("eos_token"))
        bos_id = hf.token_to_id(bos_token) if bos_token is not None else None
        if bos_id is None and isinstance(generation.get("bos_token_id"), int):
            bos_id = generation["bos_token_id"]
        if bos_token is None and bos_id is not None:
            bos_token = hf.id_to_token(bos_id)

        eos_ids = generation.get("eos_token_id")
        eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
        if eos_token is not None and hf.token_to_id(eos_token) is not None:
            eos_ids.append(hf.token_to_id(eos_token))
        return cls(hf, fingerprint=hashlib.sha256(raw).hexdigest(),
                   chat_template=template if isinstance(template, str) else None,
                   bos_token=bos_token, eos_token=eos_token,
                   add_bos_token=bool(config.get("add_bos_token", False)), bos_token_id=bos_id,
                   eos_token_ids=frozenset(int(i) for i in eos_ids), source=str(folder))

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.hf.encode(text, add_special_tokens=add_special_tokens).ids
        if (add_special_tokens and self.add_bos_token and self.bos_token_id is not None
                and (not ids or ids[0] != self.bos_token_id)):
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _compiled_template(self):
        if self.chat_template is None:
            raise ValueError(f"the model folder {self.source or '(unknown)'} has no chat template "
                             "(tokenizer_config.json chat_template or chat_template.jinja)")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = _strftime_now
            self._template = env.from_string(self.chat_template)
        return self._template

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        validate_messages(messages)
        template = self._compiled_template()
        context = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "", **kwargs}
        try:
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **context)
        except TemplateError as exc:
            raise ValueError(f"chat template failed to render: {exc}") from exc

    def detokenizer(self, skip_special_tokens: bool = False) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)


@dataclass(slots=True)
class IncrementalDetokenizer:
    tokenizer: Tokenizer
    skip_special_tokens: bool = False
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0

    def _window(self, end: int) -> str:
        return self.tokenizer.decode(self.ids[self.prefix_offset:end], self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        prefix_text = self._window(self.read_offset)
        text = self._window(len(self.ids))
        if len(text) <= len(prefix_text) or text.endswith(REPLACEMENT_CHAR):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(prefix_text):]

    def flush(self) -> str:
        if self.read_offset == len(self.ids):
            return ""
        prefix_text = self._window(self.read_offset)
        text = self._window(len(self.ids))
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(prefix_text):]
