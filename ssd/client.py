"""Python client for the router's gRPC `ssd.v1.Generation` API.

    from ssd.client import Client
    with Client("127.0.0.1:50051") as c:
        for delta in c.stream("Why is the sky blue?", chat=True, max_tokens=64):
            print(delta.text, end="", flush=True)
        result = c.generate("def fib(n):", max_tokens=32)
        print(result.text, result.finish_reason, result.stats.tokens_per_round)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import grpc

from ssd.pb import generation_pb2 as pb
from ssd.pb import generation_pb2_grpc as pb_grpc

FINISH_NAMES = {v.number: v.name.removeprefix("FINISH_REASON_").lower()
                for v in pb.DESCRIPTOR.enum_types_by_name["FinishReason"].values}


@dataclass(slots=True)
class Delta:
    token_ids: list[int]
    text: str


@dataclass(slots=True)
class Result:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stats: pb.SpeculationStats
    time_to_first_token_s: float
    total_time_s: float
    deltas: list[Delta] = field(default_factory=list)


def build_request(prompt: str | list[int] | list[dict], *, chat: bool = False, max_tokens: int = 0,
                  temperature: float = 0.0, top_k: int = 0, top_p: float = 0.0, min_p: float = 0.0,
                  seed: int | None = None, ignore_eos: bool = False, stop_token_ids=(),
                  request_id: str = "", mode: str = "") -> pb.GenerateRequest:
    req = pb.GenerateRequest(max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=list(stop_token_ids),
                             request_id=request_id, mode=mode,
                             sampling=pb.Sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                                  seed=seed))
    if isinstance(prompt, str) and chat:
        req.chat.messages.add(role="user", content=prompt)
    elif isinstance(prompt, str):
        req.text = prompt
    elif prompt and isinstance(prompt[0], dict):
        for m in prompt:
            req.chat.messages.add(role=m["role"], content=m["content"])
    else:
        req.token_ids.ids.extend(prompt)
    return req


class Client:
    def __init__(self, address: str = "127.0.0.1:50051", timeout: float | None = None):
        self.address, self.timeout = address, timeout
        self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.GenerationStub(self._channel)

    def stream(self, prompt, **kw) -> Iterator[Delta | Result]:
        """Yields a Delta per streamed piece, then the final Result."""
        out = Result("", [], "", 0, 0, pb.SpeculationStats(), 0.0, 0.0)
        for resp in self._stub.Generate(build_request(prompt, **kw), timeout=self.timeout):
            if resp.token_ids or resp.text:
                delta = Delta(list(resp.token_ids), resp.text)
                out.deltas.append(delta)
                out.token_ids += delta.token_ids
                out.text += delta.text
                yield delta
            if resp.finish_reason:
                out.finish_reason = FINISH_NAMES[resp.finish_reason]
                out.prompt_tokens, out.completion_tokens = resp.usage.prompt_tokens, resp.usage.completion_tokens
                out.stats = resp.stats
                out.time_to_first_token_s, out.total_time_s = resp.time_to_first_token_s, resp.total_time_s
                yield out

    def generate(self, prompt, **kw) -> Result:
        result = None
        for item in self.stream(prompt, **kw):
            if isinstance(item, Result):
                result = item
        return result

    def model_info(self) -> pb.ModelInfo:
        return self._stub.GetModelInfo(pb.ModelInfoRequest(), timeout=self.timeout)

    def server_info(self) -> pb.ServerInfo:
        return self._stub.GetServerInfo(pb.ServerInfoRequest(), timeout=self.timeout)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
