"""The core's batch ledger (ssd/round/batches.py): when a lingering target's wait ends, so the loop carrying the
core can sleep until then."""
from ssd.round.batches import BatchLedger


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_next_timer_is_the_earliest_linger_still_running():
    clock = Clock()
    ledger = BatchLedger(clock, verify_inflight=1, verify_hold=5.0, jit_linger=0.05)
    ledger.jit_latency = 0.02                         # the window: min(0.05, 1.5 x 0.02) = 0.03 s
    assert ledger.linger_ends() is None
    assert ledger.linger("t1")                        # t1 starts waiting at 100.0
    clock.now = 100.01
    assert ledger.linger("t2")                        # t2 at 100.01
    assert abs(ledger.linger_ends() - 100.03) < 1e-9
    clock.now = 100.035                               # t1's wait is over, t2's not
    assert not ledger.linger("t1")
    assert abs(ledger.linger_ends() - 100.04) < 1e-9
    clock.now = 100.05                                # both over: nothing to wake up for
    assert ledger.linger_ends() is None
    ledger.verify_sent("t2", 4)                       # a verify ends t2's wait
    clock.now = 100.06
    assert ledger.linger("t2") and abs(ledger.linger_ends() - 100.09) < 1e-9
