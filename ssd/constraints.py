"""Structured-output constraints: a grammar that masks the target's distribution at every position it computes.

A `Constraint` is what a request asks for (`kind`: json_object | json_schema | regex | lark, and its `text`); it
is plain data (the router validates it without torch, the wire carries it as two strings). `grammar_tokenizer`
wraps a model folder's `tokenizer.json` for llguidance (~0.5 s, cached per folder). A `Matcher` follows one
sequence's committed output tokens; `masks(drafted)` gives the allowed-token masks of the K+1 positions a verify
computes, by advancing along the drafted tokens and rolling back (positions after an invalid drafted token get
the mask of the invalid one's position: the drafted token is outside it, so it is rejected there and the later
positions are never reached). EOS is allowed exactly where the grammar may end; where it must end, only EOS is.

The engine is llguidance (bench/grammar.py: 1-2 ms compiles and ~35-125 us masks on SmolLM2's vocab, and no
dependencies, so the router can import it).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import llguidance
import numpy as np

KINDS = ("json_object", "json_schema", "regex", "lark")
# JSON in json.dumps's layout: ", " and ": ", no other whitespace (a small model would otherwise pad it with newlines)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_TEXT = 1 << 16   # characters of a schema, regex or grammar


@dataclass(frozen=True, slots=True)
class Constraint:
    kind: str
    text: str = ""   # the JSON schema (json_schema), the pattern (regex) or the grammar (lark); "" for json_object

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"constraint.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.text, str) or len(self.text) > MAX_TEXT:
            raise ValueError(f"constraint.text must be a string of at most {MAX_TEXT} characters")

    def grammar(self) -> str:
        """The llguidance grammar; ValueError naming the problem when the schema, regex or grammar is invalid."""
        try:
            if self.kind == "json_object":
                grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_LAYOUT)
            elif self.kind == "json_schema":
                schema = json.loads(self.text)
                if not isinstance(schema, dict):
                    raise ValueError("the schema must be a JSON object")
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, JSON_LAYOUT)
            elif self.kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(self.text)
            else:
                grammar = llguidance.LLMatcher.grammar_from_lark(self.text)
        except (ValueError, TypeError) as err:
            raise ValueError(f"invalid {self.kind}: {err}") from None
        problem = llguidance.LLMatcher.validate_grammar(grammar)
        if problem:
            raise ValueError(f"invalid {self.kind}: {problem}")
        return grammar

    def validate(self) -> None:
        self.grammar()


@lru_cache(maxsize=4)
def grammar_tokenizer(folder: str | Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> llguidance.LLTokenizer:
    text = (Path(folder) / "tokenizer.json").read_text(encoding="utf-8")
    return llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=list(eos_token_ids))


def grammar_for(folder, vocab_size: int):
    """A function that wraps the tokenizer of the model in `folder` for llguidance when first called (~0.5 s), or
    None when the folder has no tokenizer.json (that worker then serves no grammar)."""
    if folder is None or not (Path(folder) / "tokenizer.json").is_file():
        return None
    from ssd.tokenizer import Tokenizer

    eos = tuple(sorted(Tokenizer.from_folder(folder).eos_token_ids))
    return functools.partial(grammar_tokenizer, str(folder), vocab_size, eos)


class Matcher:
    """One sequence's grammar state, advanced by its committed output tokens."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, constraint: Constraint, vocab_size: int):
        self._m = llguidance.LLMatcher(tokenizer, constraint.grammar(), log_level=0)
        if self._m.is_error():
            raise ValueError(f"invalid {constraint.kind}: {self._m.get_error()}")
        self.vocab_size = vocab_size
        self._words = (vocab_size + 31) // 32

    def _mask(self) -> np.ndarray:
        if self._m.is_error():   # no token continues an errored state: end the sequence with EOS
            raise RuntimeError(f"constraint matcher in error: {self._m.get_error()}")
        bits = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[:self.vocab_size].astype(bool)

    def masks(self, drafted: list[int] = ()) -> np.ndarray:
        """[len(drafted) + 1, V] bool: the tokens allowed after the committed ones and each prefix of drafted."""
        rows, consumed = [], 0
        for tok in drafted:
            rows.append(self._mask())
            # once the grammar has ended only EOS is allowed, and nothing after it is consumed (a stopped matcher
            # takes EOS again without recording it, so it must not be counted for the rollback)
            if self._m.is_stopped() or not rows[-1][tok] or not self._m.consume_token(tok):
                break
            consumed += 1
        if consumed == len(drafted):
            rows.append(self._mask())
        while len(rows) < len(drafted) + 1:
            rows.append(rows[-1])
        if consumed:
            self._m.rollback(consumed)
        return np.stack(rows)

    def mask_after(self, path) -> np.ndarray | None:
        """[V] bool: the tokens allowed after the committed ones and `path`; None when `path` leaves the grammar or
        runs past its end (a position that is never reached: the target rejects the first invalid token, and a
        sequence ends at EOS). For a draft: its proposals at speculated positions, steered by the target's grammar."""
        consumed = 0
        try:
            for tok in path:
                if self._m.is_stopped() or self._m.try_consume_tokens([tok]) != 1:
                    return None
                consumed += 1
            return None if self._m.is_error() else self._mask()
        finally:
            if consumed:
                self._m.rollback(consumed)

    def commit(self, tokens: list[int]) -> None:
        for tok in tokens:
            if self._m.is_stopped():   # the EOS after an accepting end: nothing left to follow
                return
            if not self._m.consume_token(tok):
                raise RuntimeError(f"constraint: committed token {tok} is outside the grammar: {self._m.get_error()}")
