"""The prompt on the OpenAI API: `echo` (completions) and vLLM's `prompt_logprobs` (both endpoints). No torch here.

`prompt_logprobs: N` (0..MAX_LOGPROBS) answers vLLM's list for the prompt: None for its first token, then per
token `{token_id: {logprob, rank, decoded_token}}` holding the token itself and its N most probable
alternatives (rank 1 = the most probable); per choice on completions (`choices[i].prompt_logprobs`), at the top
level on chat, where vLLM puts them. With `stream` it is a 400, as in vLLM. `echo: true` on completions returns
the prompt's text (as given, or the decoding of its token ids) before each choice's completion, in the first
chunk of each choice when streaming; with `logprobs: N` the choice's logprobs cover the prompt's tokens first
(the first one's `token_logprobs` and `top_logprobs` entries null) and `text_offset` counts from the start of the
echoed text. The target is asked for the prompt's logprobs at the larger of the two N; each shape keeps its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ssd.params import MAX_LOGPROBS, TokenLogprob
from ssd.tokenizer import Tokenizer
from services.router.openai_params import BOOL, INT, get


@dataclass(slots=True)
class PromptReply:
    """What a request's responses add for its prompt."""
    chat: bool
    tok: Tokenizer
    echo: bool = False
    logprobs: int | None = None          # completions logprobs: the echoed prompt's alternatives
    prompt_logprobs: int | None = None   # the prompt_logprobs field's alternatives (None: no field)
    text: str = ""                       # the echoed prompt
    seen: set[int] = field(default_factory=set)   # stream: the choices whose first chunk went out

    @property
    def ask(self) -> int | None:
        """How many alternatives the target computes for the prompt (None: no prompt logprobs)."""
        wanted = [n for n in (self.prompt_logprobs, self.logprobs if self.echo else None) if n is not None]
        return max(wanted) if wanted else None

    def start(self, prompt: dict, ids: list[int], offsets: dict[int, int], n: int) -> None:
        """Take the request's prompt (Frontend.build's `text` or `token_ids`, and its ids); with echo, each
        choice's generated text_offset starts after the echoed prompt."""
        if self.echo:
            self.text = prompt["text"] if "text" in prompt else self.tok.decode(ids)
            offsets.update({i: len(self.text) for i in range(n)})

    def whole(self, body: dict, ids: list[int], rows: dict[int, list]) -> dict:
        """The whole response with the prompt added; `rows`: per choice, the prompt logprobs its first delta had."""
        for choice in body["choices"]:
            lps = rows.get(choice["index"])
            if self.echo:
                choice["text"] = self.text + choice["text"]
                if choice["logprobs"] is not None:
                    choice["logprobs"] = self._echoed(ids, lps, choice["logprobs"])
            if self.prompt_logprobs is not None and not self.chat:
                choice["prompt_logprobs"] = self.vllm(ids, lps)
        if self.prompt_logprobs is not None and self.chat:
            body["prompt_logprobs"] = self.vllm(ids, rows.get(0))
        return body

    def pending(self, index: int) -> bool:
        """Whether choice `index`'s next chunk must carry the echoed prompt (then it goes out even if empty)."""
        return self.echo and index not in self.seen

    def chunk(self, chunk: dict, lps: list | None, ids: list[int]) -> dict:
        """A stream chunk; the first of its choice with the echoed prompt (and its logprobs) in front."""
        choice = chunk["choices"][0]
        if self.pending(choice["index"]):
            self.seen.add(choice["index"])
            choice["text"] = self.text + choice["text"]
            if self.logprobs is not None:
                empty = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                choice["logprobs"] = self._echoed(ids, lps, choice["logprobs"] or empty)
        return chunk

    def vllm(self, ids: list[int], lps: list | None) -> list | None:
        """vLLM's prompt_logprobs: None, then {token_id: {logprob, rank, decoded_token}} per prompt token."""
        if lps is None:
            return None
        out = [None]
        for lp in lps[1:]:
            entry = {lp.token: self._logprob(lp.token, lp.logprob, lp.rank)}
            for rank, (t, v) in enumerate(lp.top[:self.prompt_logprobs], 1):
                entry.setdefault(t, self._logprob(t, v, rank))
            out.append({str(t): v for t, v in entry.items()})
        return out

    def _logprob(self, token: int, logprob: float, rank: int | None) -> dict:
        return {"logprob": logprob, "rank": rank, "decoded_token": self.tok.decode([token])}

    def _echoed(self, ids: list[int], lps: list[TokenLogprob | None] | None, generated: dict) -> dict:
        """Completions logprobs of the prompt's tokens followed by `generated` (the completion's)."""
        text = [self.tok.decode([t]) for t in ids]
        offsets, at, detok = [], 0, self.tok.detokenizer()
        for t in ids:   # where each token's text starts in the echoed prompt
            offsets.append(at)
            at += len(detok.push(t))
        n = self.logprobs or 0
        rows = lps if lps is not None else [None] * len(ids)
        return {"tokens": text + generated["tokens"],
                "token_logprobs": [lp.logprob if lp else None for lp in rows] + generated["token_logprobs"],
                "top_logprobs": [{self.tok.decode([t]): v for t, v in lp.top[:n]} if lp else None for lp in rows]
                + generated["top_logprobs"],
                "text_offset": offsets + generated["text_offset"]}


def prompt_reply(body: dict, chat: bool, logprobs: int | None, stream: bool, tok: Tokenizer) -> PromptReply:
    """The prompt fields of a request body (checked: ValueError naming the field); `logprobs`: the parsed
    completions logprobs."""
    n = get(body, "prompt_logprobs", INT)
    if n is not None and not 0 <= n <= MAX_LOGPROBS:
        raise ValueError(f"prompt_logprobs: must be an integer in 0..{MAX_LOGPROBS}, got {n}")
    if n is not None and stream:
        raise ValueError("prompt_logprobs: not supported with stream")
    echo = False if chat else get(body, "echo", BOOL, False)
    return PromptReply(chat, tok, echo, None if chat else logprobs, n)
