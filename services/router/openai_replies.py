"""The OpenAI response objects of one request (`Reply`): whole, or as stream chunks, with the request's
speculation stats under `ssd` and, when asked, its tokens' logprobs in OpenAI's two shapes (chat:
`{"content": [{token, logprob, bytes, top_logprobs}]}`; completions: `{tokens, token_logprobs, top_logprobs,
text_offset}`). A token's text is its own decoding (a token that holds part of a UTF-8 character shows U+FFFD).
No torch here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ssd.params import FinishReason, TokenLogprob
from ssd.tokenizer import Tokenizer
from services.router.frontend import Final


def _finish(f: Final) -> str:
    return "length" if f.reason is FinishReason.LENGTH else "stop"


def _usage(f: Final) -> dict:
    return {"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens,
            "total_tokens": f.prompt_tokens + f.completion_tokens}


def _ssd(f: Final) -> dict:
    st = f.stats
    return {"finish_reason": f.reason.value, "mode": f.mode, "rounds": st.rounds,
            "tokens_per_round": round(st.tokens_per_round, 4),
            "acceptance_per_position": [round(a, 4) for a in st.acceptance_per_position],
            "cache_hits": st.cache.get("hit", 0), "cache_misses": sum(v for k, v in st.cache.items() if k != "hit"),
            "ttft_s": round(f.ttft_s, 6), "total_s": round(f.total_s, 6)}


@dataclass(slots=True)
class Reply:
    """The response objects of one request, whole or as stream chunks. With `tok`, the request asked for
    logprobs: chunks and the whole response carry those of their tokens."""
    chat: bool
    id: str
    model: str
    created: int
    tok: Tokenizer | None = None
    offset: int = field(default=0, repr=False)   # completions' text_offset of the next token

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, f: Final, logprobs: list[TokenLogprob] = ()) -> dict:
        choice = {"index": 0, "finish_reason": _finish(f), "logprobs": self.logprobs(logprobs)}
        choice.update({"message": {"role": "assistant", "content": text}} if self.chat else {"text": text})
        return {**self._head(False), "choices": [choice], "usage": _usage(f), "ssd": _ssd(f)}

    def chunk(self, text: str = "", f: Final | None = None, role: bool = False,
              logprobs: list[TokenLogprob] = ()) -> dict:
        choice = {"index": 0, "finish_reason": _finish(f) if f else None,
                  "logprobs": self.logprobs(logprobs) if logprobs else None}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": ""} if role else \
                {"content": text} if text or logprobs else {}
        else:
            choice["text"] = text
        out = {**self._head(True), "choices": [choice]}
        return {**out, "ssd": _ssd(f)} if f else out

    def usage_chunk(self, f: Final) -> dict:
        return {**self._head(True), "choices": [], "usage": _usage(f)}

    def logprobs(self, logprobs: list[TokenLogprob]) -> dict | None:
        """OpenAI's logprobs object of these tokens (None when the request asked for none)."""
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
        offsets = []
        for s in tokens:
            offsets.append(self.offset)
            self.offset += len(s)
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
                "top_logprobs": [{text(t): v for t, v in lp.top} for lp in logprobs], "text_offset": offsets}

    def _text(self, token: int) -> str:
        return self.tok.decode([token])
