"""The OpenAI response objects of one request (`Reply`): whole, or as stream chunks, with the request's
speculation stats under `ssd` and, when asked, its tokens' logprobs in OpenAI's two shapes (chat:
`{"content": [{token, logprob, bytes, top_logprobs}]}`; completions: `{tokens, token_logprobs, top_logprobs,
text_offset}`). A token's text is its own decoding (a token that holds part of a UTF-8 character shows U+FFFD).
A request of several choices (`n`, `best_of`) has them as `choices[i]` with their `index`; usage counts the
prompt once and the completion tokens of every returned choice; each choice of a whole response carries its own
`ssd`, and the top-level `ssd` merges them (no finish reason there); a stream chunk holds one choice, and the
last chunk of each carries that choice's `ssd`. No torch here.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from ssd.engine.stats import SpecStats
from ssd.params import FinishReason, TokenLogprob
from ssd.tokenizer import Tokenizer
from services.router.frontend import Final


def _finish(f: Final) -> str:
    return "length" if f.reason is FinishReason.LENGTH else "stop"


def _usage(finals: list[Final]) -> dict:
    prompt, completion = finals[0].prompt_tokens, sum(f.completion_tokens for f in finals)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _ssd(f: Final) -> dict:
    return {"finish_reason": f.reason.value, **_stats(f.mode, f.stats, f.ttft_s, f.total_s)}


def _merged_ssd(finals: list[Final]) -> dict:
    """The stats of several choices together (rounds, tokens and cache lookups summed; the first token's time)."""
    st = SpecStats()
    for f in finals:
        st.merge(f.stats)
    return {**_stats(finals[0].mode, st, min(f.ttft_s for f in finals), max(f.total_s for f in finals)),
            "choices": len(finals)}


def _stats(mode: str, st: SpecStats, ttft_s: float, total_s: float) -> dict:
    return {"mode": mode, "rounds": st.rounds, "tokens_per_round": round(st.tokens_per_round, 4),
            "acceptance_per_position": [round(a, 4) for a in st.acceptance_per_position],
            "cache_hits": st.cache.get("hit", 0), "cache_misses": sum(v for k, v in st.cache.items() if k != "hit"),
            "ttft_s": round(ttft_s, 6), "total_s": round(total_s, 6)}


@dataclass(slots=True)
class Reply:
    """The response objects of one request, whole or as stream chunks. With `tok`, the request asked for
    logprobs: chunks and the whole response carry those of their tokens."""
    chat: bool
    id: str
    model: str
    created: int
    tok: Tokenizer | None = None
    offsets: dict[int, int] = field(default_factory=dict, repr=False)   # per choice: text_offset of its next token
    tools: bool = False   # each finished choice's text is a tool call {name, arguments}: answered as tool_calls

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, choices: list[tuple[str, Final, list[TokenLogprob]]]) -> dict:
        """The response of (text, Final, logprobs) per choice, in index order."""
        out = []
        for i, (text, f, logprobs) in enumerate(choices):
            choice = {"index": i, "finish_reason": _finish(f), "logprobs": self.logprobs(logprobs, i)}
            choice.update({"message": {"role": "assistant", "content": text}} if self.chat else {"text": text})
            if self.tools and f.reason is not FinishReason.LENGTH:   # the grammar ended: the text is one call
                call = json.loads(text)
                choice["message"] = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                     "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]}
                choice["finish_reason"] = "tool_calls"
            out.append(choice | ({"ssd": _ssd(f)} if len(choices) > 1 else {}))
        finals = [f for _, f, _ in choices]
        return {**self._head(False), "choices": out, "usage": _usage(finals),
                "ssd": _ssd(finals[0]) if len(finals) == 1 else _merged_ssd(finals)}

    def chunk(self, text: str = "", f: Final | None = None, role: bool = False,
              logprobs: list[TokenLogprob] = (), index: int = 0) -> dict:
        choice = {"index": index, "finish_reason": _finish(f) if f else None,
                  "logprobs": self.logprobs(logprobs, index) if logprobs else None}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": ""} if role else \
                {"content": text} if text or logprobs else {}
        else:
            choice["text"] = text
        out = {**self._head(True), "choices": [choice]}
        return {**out, "ssd": _ssd(f)} if f else out

    def usage_chunk(self, finals: list[Final]) -> dict:
        return {**self._head(True), "choices": [], "usage": _usage(finals)}

    def logprobs(self, logprobs: list[TokenLogprob], index: int = 0) -> dict | None:
        """OpenAI's logprobs object of these tokens of choice `index` (None when the request asked for none)."""
        if self.tok is None:
            return None
        text = self._text
        if self.chat:
            def entry(token: int, logprob: float) -> dict:
                s = text(token)
                return {"token": s, "logprob": logprob, "bytes": list(s.encode())}
            return {"content": [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                                for lp in logprobs]}
        tokens = [text(lp.token) for lp in logprobs]
        offsets, at = [], self.offsets.get(index, 0)
        for s in tokens:
            offsets.append(at)
            at += len(s)
        self.offsets[index] = at
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
                "top_logprobs": [{text(t): v for t, v in lp.top} for lp in logprobs], "text_offset": offsets}

    def _text(self, token: int) -> str:
        return self.tok.decode([token])
