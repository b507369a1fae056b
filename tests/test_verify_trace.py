"""The verify trace (ssd/trace.py) and bench/verify_trace.py's split of it: the marks each process writes when
SSD_VERIFY_TRACE is set, and the phases a run's verify batches are split into."""
import threading

import pytest
import zmq

from ssd import trace, wire
from ssd.params import SamplingParams
from ssd.worker.io import WorkerEndpoint
from tests.bench_scripts import load


def load_bench():
    return load("verify_trace")


@pytest.fixture
def traced(monkeypatch, tmp_path):
    """Tracing on in this process, to tmp_path/t.<pid>."""
    monkeypatch.setenv(trace.ENV, str(tmp_path / "t"))
    monkeypatch.setattr(trace, "ON", True)
    monkeypatch.setattr(trace, "_file", None)
    yield str(tmp_path / "t")
    if trace._file is not None:
        trace._file.close()


def test_split_reads_each_phase_and_the_routers_turn_within_the_window():
    bench = load_bench()
    ev = {}
    for i, t in enumerate((10.0, 10.1, 10.2)):   # batches 1-3: 1 ms in, 2 queued, 50 computing, 1 out, 1 back
        ev[i + 1] = {"router_send": t, "target_recv": t + 0.001, "compute_start": t + 0.003, "compute_end": t + 0.053,
                     "target_sent": t + 0.054, "router_recv": t + 0.055}
    ev[4] = {"router_send": 10.3, "target_recv": 10.301}   # not traced end to end: left out
    ev[5] = dict(ev[1], router_send=20.0)                  # outside the window
    got = bench.split(ev, 9.0, 11.0)
    assert got["batches"] == 3
    for phase, ms in (("zmq_in", 1), ("queue", 2), ("compute", 50), ("send", 1), ("zmq_out", 1)):
        assert got[phase] == pytest.approx(ms, abs=1e-6)
    assert got["turn"] == pytest.approx(45) and got["turn_median"] == pytest.approx(45)   # 0.1 s apart, 55 ms each
    assert bench.split(ev, 0.0, 1.0) == {"batches": 0}
    assert "sequences" not in got   # no counts traced: nothing said of the batching


def test_split_says_how_the_sequences_were_batched_and_the_compute_spent_on_partial_batches():
    bench = load_bench()
    ev = {}
    # four batches of 4 sequences (8 positions, 50 ms each), then a cohort of 1 (4 positions, 40 ms) and of 3
    for i, (seqs, positions, ms) in enumerate([(4, 8, 50)] * 4 + [(1, 4, 40), (3, 6, 50)]):
        t = 10.0 + 0.1 * i
        ev[i + 1] = {"router_send": t, "target_recv": t, "compute_start": t, "compute_end": t + ms / 1000,
                     "target_sent": t + ms / 1000, "router_recv": t + ms / 1000,
                     "sequences": float(seqs), "positions": float(positions)}
    got = bench.split(ev, 9.0, 11.0)
    assert got["sequences"] == {"1": 1, "3": 1, "4": 4}
    assert got["positions"] == pytest.approx((4 * 8 + 4 + 6) / 6)
    assert got["partial_compute"] == pytest.approx(90 / 290, abs=1e-3)
    assert "split_compute" not in got   # the router's running count not traced
    for i, active in zip(range(1, 7), (4, 4, 4, 4, 4, 3)):   # the cohort of 1 was out of step; the 3 a ramp
        ev[i]["active"] = float(active)
    assert bench.split(ev, 9.0, 11.0)["split_compute"] == pytest.approx(40 / 290, abs=1e-3)


def test_marks_go_to_the_prefix_and_pid_and_read_back_by_batch(traced):
    trace.mark("router_send", 7, at=1.5)
    trace.mark("router_recv", 7)
    events = load_bench().read_events(traced)
    assert events[7]["router_send"] == 1.5 and events[7]["router_recv"] > 1.5


def test_the_targets_endpoint_marks_a_verify_in_and_its_outcomes_out(traced):
    endpoint = WorkerEndpoint("tcp://127.0.0.1:0", lambda: wire.Ready("target", "m", "h", 10, 64, 0, []), "test")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint.start())
    try:
        sock.send_multipart(wire.encode(wire.Verify(3, [wire.VerifyItem(1, [], None)], False)))
        peer, _ = endpoint.inbox.get(timeout=10)
        endpoint.send(peer, wire.Outcomes(3, [wire.Outcome(1, 0, 4)], 0.01, []))
        assert sock.poll(10_000)
        assert isinstance(wire.decode(sock.recv_multipart()), wire.Outcomes)
    finally:
        sock.close(0)
        ctx.term()
        endpoint.stop()
    events = load_bench().read_events(traced)
    assert set(events[3]) == {"target_recv", "target_sent"} and events[3]["target_recv"] <= events[3]["target_sent"]


def test_the_router_marks_each_verify_it_sends_and_each_outcome_it_receives(traced):
    from tests.services.test_router_loop import _drain, _loop_with, _stop, plain_target

    ctx = zmq.Context()
    router, workers = _loop_with(ctx, plain_target())
    loop = threading.Thread(target=router.run, daemon=True)
    try:
        router.handshake()
        loop.start()
        req = router.round.submit("a", [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
        assert _drain(req) == [3, 4, 4, 4]
    finally:
        _stop(router, loop, workers, ctx)
    events = load_bench().read_events(traced)
    assert len(events) == 3 and all(set(e) == {"router_send", "router_recv", "active"} for e in events.values())
    assert all(e["active"] == 1 for e in events.values())
    assert all(e["router_send"] < e["router_recv"] for e in events.values())


def test_the_target_marks_each_verify_batchs_compute(traced):
    import time

    from ssd.engine.target_handler import TargetHandler

    class Worker:   # what TargetHandler's verify path asks of a TargetWorker
        last_logprobs: dict = {}

        def check(self, item):
            return None

        def verify(self, items, features=False):
            time.sleep(0.02)
            return [wire.Outcome(it.seq, 0, 4) for it in items]

    class Sent:
        def __init__(self):
            self.out = []

        def send(self, peer, msg):
            self.out.append(msg)

    sent = Sent()
    TargetHandler(Worker(), sent).handle([(b"r", wire.Verify(5, [wire.VerifyItem(1, [], None),
                                                               wire.VerifyItem(2, [7, 8], None)], False)),
                                          (b"s", wire.Verify(6, [wire.VerifyItem(1, [9], None)], False))])
    assert [m.batch_id for m in sent.out] == [5, 6]
    events = load_bench().read_events(traced)
    for batch_id, seqs, positions in ((5, 2, 4), (6, 1, 2)):   # one forward for both routers' batches
        e = events[batch_id]
        assert set(e) == {"compute_start", "compute_end", "sequences", "positions"}
        assert e["compute_end"] - e["compute_start"] >= 0.02
        assert (e["sequences"], e["positions"]) == (seqs, positions)   # each batch's own, not the forward's
