"""What a stream yields: `Delta` (tokens committed since the previous one, with their text) and the final
`Result`, which folds the streamed `GenerateResponse`s in; with several choices (`n`), each Delta and Result
carries its choice's `index` and `Results` keeps one Result per choice."""
from __future__ import annotations

from dataclasses import dataclass, field

from ssd.client.errors import SSDError
from ssd.pb import generation_pb2 as pb

FINISH_NAMES = {v.number: v.name.removeprefix("FINISH_REASON_").lower()
                for v in pb.DESCRIPTOR.enum_types_by_name["FinishReason"].values}


@dataclass(slots=True)
class Delta:
    """Tokens committed since the previous delta, the text they add and, when asked, their logprobs; `index`:
    the choice they belong to (0 unless the request asked for n > 1)."""
    token_ids: list[int]
    text: str
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    index: int = 0


@dataclass(slots=True)
class Result:
    """A finished completion. finish_reason: stop, length, eos, abort, error, stop_string or time_limit."""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stats: pb.SpeculationStats = field(default_factory=pb.SpeculationStats)
    time_to_first_token_s: float = 0.0
    total_time_s: float = 0.0
    deltas: list[Delta] = field(default_factory=list)
    request_id: str = ""
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)   # one per token id, when asked
    index: int = 0                                                  # the choice (0..n-1)
    # when asked (prompt_logprobs=N): one per prompt token after the first (entry i is prompt token i + 1's)
    prompt_logprobs: list[pb.TokenLogprob] = field(default_factory=list)

    @property
    def usage(self) -> pb.Usage:
        return pb.Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)

    def add(self, resp: pb.GenerateResponse) -> Delta | None:
        """Folds one streamed response in; returns its Delta when it carries output."""
        self.request_id = resp.request_id or self.request_id
        if resp.finish_reason:
            self.finish_reason = FINISH_NAMES.get(resp.finish_reason, str(resp.finish_reason))
            self.prompt_tokens, self.completion_tokens = resp.usage.prompt_tokens, resp.usage.completion_tokens
            self.stats = resp.stats
            self.time_to_first_token_s, self.total_time_s = resp.time_to_first_token_s, resp.total_time_s
        if resp.prompt_logprobs:   # the first response's
            self.prompt_logprobs = list(resp.prompt_logprobs)
        if not (resp.token_ids or resp.text):
            return None
        delta = Delta(list(resp.token_ids), resp.text, list(resp.logprobs), resp.index)
        self.deltas.append(delta)
        self.token_ids += delta.token_ids
        self.text += delta.text
        self.logprobs += delta.logprobs
        return delta

    def finished(self) -> Result:
        if not self.finish_reason:
            raise SSDError("INTERNAL", "the stream ended without its final response")
        return self


class Results:
    """The Results of one stream, one per choice: responses are folded into the Result of their `index`."""

    def __init__(self, n: int):
        self.items = [Result(index=i) for i in range(n)]

    def add(self, resp: pb.GenerateResponse) -> Delta | None:
        if resp.index >= len(self.items):
            raise SSDError("INTERNAL", f"a response for choice {resp.index} of a request for {len(self.items)}")
        return self.items[resp.index].add(resp)

    @property
    def token_ids(self) -> list[int]:
        """The tokens received so far (of the only choice: what a resumption starts after)."""
        return self.items[0].token_ids

    def finished(self) -> list[Result]:
        return [r.finished() for r in self.items]
