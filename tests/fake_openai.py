"""A fake OpenAI-compatible server for the benchmark tests (`ssd bench serve`, the locust suite): it streams known
tokens with known delays, optionally with our `ssd` field, and fails on the prompts "fail" (HTTP 500) and
"midfail" (an error event mid-stream)."""
import asyncio
import json

from aiohttp import web

FIRST_DELAY = 0.3                    # s before the first content chunk (headers and the role chunk go at once)
CHUNKS = [(1, 0.0), (1, 0.1), (3, 0.2), (1, 0.1)]   # (tokens in the chunk, gap before it)
N_TOKENS = sum(n for n, _ in CHUNKS)


def fake_app(with_ssd: bool) -> web.Application:
    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def chat(request):
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        if "fail" == prompt:
            return web.json_response({"error": {"message": "deliberate failure"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj):
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(FIRST_DELAY)
        for i, (n, gap) in enumerate(CHUNKS):
            await asyncio.sleep(gap)
            await send({"choices": [{"index": 0, "delta": {"content": "tok" * n}}]})
            if prompt == "midfail" and i == 1:
                await send({"error": {"message": "died mid-stream"}})
                await resp.write(b"data: [DONE]\n\n")
                return resp
        final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        if with_ssd:
            final["ssd"] = {"rounds": 3, "tokens_per_round": 5 / 3, "acceptance_per_position": [0.5, 0.5],
                            "cache_hits": 2, "cache_misses": 1}
        await send(final)
        await send({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": N_TOKENS}})
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app
