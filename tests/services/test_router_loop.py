"""The router's ZeroMQ loop (services/router/loop.py) against fake workers on loopback sockets: workers that answer
nonsense cannot stop it or change a token. What the round core does with each kind of invalid reply, in process:
tests/round/test_invalid_replies.py.
"""
import queue
import threading
import time

import zmq

from ssd import wire
from ssd.params import FinishReason, SamplingParams
from ssd.round import CoreConfig
from services.router.loop import RouterLoop

VOCAB, K = 100, 3


def ready(role: str) -> wire.Ready:
    return wire.Ready(role, "m", "h", VOCAB, 256, K, [2, 1, 1, 1] if role == "draft" else [], 0)


class FakeWorker:
    """A worker's data plane in a thread: answers Hello and Ping, and hands every other message to `reply`."""

    def __init__(self, ctx, role: str, reply):
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address, self.role, self.reply = f"tcp://127.0.0.1:{port}", role, reply
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            peer, *frames = self.sock.recv_multipart()
            msg = wire.decode(frames)
            answers = [ready(self.role)] if isinstance(msg, wire.Hello) else \
                [wire.Pong(msg.nonce)] if isinstance(msg, wire.Ping) else self.reply(msg)
            for answer in answers:
                self.sock.send_multipart([peer, *wire.encode(answer)])


def _loop_with(ctx, target, draft=None, mode="ar"):
    workers = [FakeWorker(ctx, "target", target)] + ([FakeWorker(ctx, "draft", draft)] if draft else [])
    for w in workers:
        w.thread.start()
    router = RouterLoop(CoreConfig(mode=mode, adaptive=False, ready_timeout=20), [workers[0].address],
                        [w.address for w in workers[1:]], "h", [2])
    return router, workers


def plain_target(verify_s: float = 0.001):
    """A target's replies: first token 3 for each prefilled sequence, then token 4 a verify (none accepted), each
    verify taking `verify_s`."""
    def target(msg):
        if isinstance(msg, wire.Prefill):
            return [wire.Prefilled([(it.seq, 3) for it in msg.items], 0.001, [])]
        if isinstance(msg, wire.Verify):
            time.sleep(verify_s)
            return [wire.Outcomes(msg.batch_id, [wire.Outcome(it.seq, 0, 4) for it in msg.items], verify_s, [])]
        return []
    return target


def _stop(router, loop, workers, ctx):
    router.stop()
    if loop.ident is not None:
        loop.join(timeout=5)   # the loop closes its sockets as it ends
    else:
        router._close()
    for w in workers:
        w.stop.set()
        w.thread.join(timeout=5)
        w.sock.close(0)
    ctx.term()


def _drain(req) -> list[int]:
    seen, kind = [], None
    while kind != "done":
        kind, value = req.events.get(timeout=30)
        assert kind != "error", value
        seen += value if kind == "tokens" else []
    return seen


def test_the_loop_survives_workers_that_answer_nonsense_and_the_output_stays_the_targets():
    """A target whose first verify answer of each sequence is j > K (then honest: it accepts nothing and
    decodes 4, 5, 6, ...) and a draft that answers every JIT with out-of-vocabulary tokens and publishes entries
    that are too long: each request still streams exactly the target's tokens, and the loop keeps running."""
    ctx = zmq.Context()
    lied: set[int] = set()
    made: dict[int, list[int]] = {}

    def target(msg):
        if isinstance(msg, wire.Prefill):
            return [wire.Prefilled([(it.seq, 3) for it in msg.items], 0.001, [])]
        if isinstance(msg, wire.Restore):
            return [wire.Restored([it.seq for it in msg.items], 0.001)]
        if isinstance(msg, wire.Verify):
            items = []
            for it in msg.items:
                if it.seq not in lied:
                    lied.add(it.seq)
                    items.append(wire.Outcome(it.seq, K + 5, 4))
                else:
                    made.setdefault(it.seq, []).append(4 + len(made.get(it.seq, [])))
                    items.append(wire.Outcome(it.seq, 0, made[it.seq][-1]))
            return [wire.Outcomes(msg.batch_id, items, 0.001, [])]
        return []

    def draft(msg):
        if isinstance(msg, wire.Jit):
            return [wire.JitResult(msg.batch_id, [(it.seq, [VOCAB + 1] * it.room, None) for it in msg.items], 0.001)]
        if isinstance(msg, wire.DraftRound):
            return [wire.CacheEntries(it.seq, it.round, [wire.CacheEntry(0, t, [1] * (K + 2), None)
                                                         for t in range(VOCAB)], 0.001) for it in msg.items]
        return []

    router, workers = _loop_with(ctx, target, draft, mode="ssd")
    loop = threading.Thread(target=router.run, daemon=True)
    try:
        router.handshake()
        loop.start()
        reqs = [router.round.submit(f"l{i}", [5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True), mode="ssd")
                for i in range(3)]
        for req in reqs:
            seen, kind = [], None
            while kind != "done":
                kind, value = req.events.get(timeout=30)
                assert kind != "error", value
                seen += value if kind == "tokens" else []
            assert seen == [3, 4, 5, 6, 7, 8] and value is FinishReason.LENGTH
        assert loop.is_alive() and lied == {r.seq for r in reqs}
    finally:
        _stop(router, loop, workers, ctx)


def test_the_loop_sleeps_while_a_verify_is_out_and_a_submit_wakes_it(monkeypatch):
    """While the target takes 0.3 s over each verify, the loop sleeps in its poll (it used to pass every
    millisecond: ~300 passes a verify); a request submitted while the loop sleeps with a 10-minute idle poll
    still starts at once, woken by the intake."""
    import services.router.loop as loop_module

    ctx = zmq.Context()
    router, workers = _loop_with(ctx, plain_target(0.3))
    loop = threading.Thread(target=router.run, daemon=True)
    try:
        router.handshake()
        loop.start()
        req = router.round.submit("a", [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
        passes = router.passes
        assert _drain(req) == [3, 4, 4, 4]
        assert router.passes - passes < 60   # three verifies of 0.3 s: at most 20 ms a sleep, plus the messages
        monkeypatch.setattr(loop_module, "IDLE_POLL_MS", 600_000)
        time.sleep(0.1)                       # the loop is now asleep in a long poll (it may have one 20 ms left)
        req = router.round.submit("b", [5, 6, 7], SamplingParams(max_tokens=1))
        assert _drain(req) == [3]             # woken by the submit, not by the poll's end 10 minutes later
    finally:
        _stop(router, loop, workers, ctx)


def test_the_poll_ends_at_the_cores_timer():
    ctx = zmq.Context()
    router, workers = _loop_with(ctx, lambda msg: [])
    try:
        now = router.clock()
        assert router._poll_ms(None) == 20
        assert router._poll_ms(now + 0.0054) in (5, 6)
        assert router._poll_ms(now - 1.0) == 1          # a timer already due: the shortest poll, never 0 or less
        assert router._poll_ms(now + 60.0) == 20
    finally:
        _stop(router, threading.Thread(), workers, ctx)


def test_a_passes_tokens_reach_the_stream_after_the_verify_it_sent():
    """The loop sends a pass's next verify before it hands the pass's tokens to the streams: each event wakes its
    stream's thread, and at batch 16 those threads kept the loop from the target's next verify for milliseconds."""
    ctx = zmq.Context()
    router, workers = _loop_with(ctx, plain_target())
    loop = threading.Thread(target=router.run, daemon=True)
    try:
        router.handshake()
        (peer,) = router.pool.targets
        verifies, send = [], peer.send

        def counting_send(msg):
            if isinstance(msg, wire.Verify):
                verifies.append(msg.batch_id)
            return send(msg)

        peer.send = counting_send
        seen = queue.Queue()

        class Stream:   # each event with the verify batches sent when it reached the stream
            def put(self, event):
                seen.put((event, len(verifies)))

        loop.start()
        router.round.submit("a", [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True), events=Stream())
        got = [seen.get(timeout=30) for _ in range(5)]
        assert got == [(("tokens", [3]), 1), (("tokens", [4]), 2), (("tokens", [4]), 3), (("tokens", [4]), 3),
                       (("done", FinishReason.LENGTH), 3)]
    finally:
        _stop(router, loop, workers, ctx)
