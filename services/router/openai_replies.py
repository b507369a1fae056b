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

from dataclasses import dataclass, field

from ssd.engine.stats import SpecStats
from ssd.params import FinishReason, TokenLogprob
from ssd.tokenizer import Tokenizer
from services.router.frontend import Final
from services.router.openai_tools import as_call, call_id


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
            "cache_hits": st.served, "cache_misses": st.backed_up,
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
    tools: bool = False   # a finished choice's text may be a tool call {name, arguments}: answered as tool_calls

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, choices: list[tuple[str, Final, list[TokenLogprob]]]) -> dict:
        """The response of (text, Final, logprobs) per choice, in index order."""
        out = []
        for i, (text, f, logprobs) in enumerate(choices):
            choice = {"index": i, "finish_reason": _finish(f), "logprobs": self.logprobs(logprobs, i)}
            choice.update({"message": {"role": "assistant", "content": text}} if self.chat else {"text": text})
            call = self.call(text, f)
            if call is not None:
                choice["message"] = {"role": "assistant", "content": None,
                                     "tool_calls": [{"id": call_id(), "type": "function", "function": call}]}
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

    def call(self, text: str, f: Final) -> dict | None:
        """The tool call a finished choice's text is ({name, arguments as JSON text}), or None: text, or a call cut
        by max_tokens or a stop string."""
        return as_call(text) if self.tools and f.reason is not FinishReason.LENGTH else None

    def call_chunks(self, call: dict, f: Final, logprobs: list[TokenLogprob], index: int) -> list[dict]:
        """A tool call as OpenAI's stream deltas: its id, type and name; its arguments; the finish."""
        head = {"index": 0, "id": call_id(), "type": "function", "function": {"name": call["name"], "arguments": ""}}
        first = self.chunk(index=index)
        first["choices"][0]["delta"] = {"tool_calls": [head]}
        args = self.chunk(logprobs=logprobs, index=index)
        args["choices"][0]["delta"] = {"tool_calls": [{"index": 0, "function": {"arguments": call["arguments"]}}]}
        last = self.chunk(f=f, index=index)
        last["choices"][0]["finish_reason"] = "tool_calls"
        return [first, args, last]

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


@dataclass(slots=True)
class CallStream:
    """One choice's stream when its output may be a tool call. The first character decides (a call starts with
    `{`, and auto's text never does): text goes out as content deltas from then on; a call is held to its end and
    goes out as `Reply.call_chunks`. Held text that ends up not being a whole call goes out as content."""
    reply: Reply
    index: int
    text: bool | None = None     # None: undecided
    held: str = ""
    logprobs: list = field(default_factory=list)

    def delta(self, text: str, logprobs: list[TokenLogprob]) -> list[dict]:
        if self.text is None:
            self.held += text
            self.logprobs += logprobs
            if not self.held:
                return []
            self.text = not self.held.startswith("{")
            if not self.text:
                return []
            text, logprobs, self.held, self.logprobs = self.held, self.logprobs, "", []
        elif not self.text:
            self.held += text
            self.logprobs += logprobs
            return []
        return [self.reply.chunk(text, logprobs=logprobs, index=self.index)] if text or logprobs else []

    def final(self, f: Final) -> list[dict]:
        text = self.held + f.text
        call = None if self.text else self.reply.call(text, f)
        if call is not None:
            return self.reply.call_chunks(call, f, self.logprobs, self.index)
        out = [self.reply.chunk(text, logprobs=self.logprobs, index=self.index)] if self.logprobs else []
        return out + [self.reply.chunk("" if self.logprobs else text, f, index=self.index)]
