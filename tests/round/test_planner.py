"""The speculation planner's K (ssd/round/planner.py) with no core around it: where the adaptive choice starts."""
from ssd.round.planner import START_K, SpeculationPlanner
from ssd.spec.backup import BackupTimings
from tests.round.fakes import Clock, RecordingMetrics


def planner(k: int, metrics=None) -> SpeculationPlanner:
    return SpeculationPlanner(k, True, False, 16, BackupTimings(k=k), metrics or RecordingMetrics(), Clock())


def test_the_adaptive_choice_starts_at_the_default_k_not_the_pools_deepest():
    """With the draft's K at 5 a fresh router ran K = 5 from the prior and came down to K = 3 only as explore rounds
    measured the shallower sizes (a few hundred rounds at batch 1, where K = 5 hit 0.34 and K = 3 0.67-0.69)."""
    metrics = RecordingMetrics()
    deep = planner(5, metrics)
    assert START_K == 3 and deep.choice == {"sd": 3, "ssd": 3}
    assert metrics.speculation_k == {"sd": [3], "ssd": [3]}   # the exported K is the one in use
    assert planner(2).choice == {"sd": 2, "ssd": 2} and planner(3).choice == {"sd": 3, "ssd": 3}


def test_the_choice_climbs_from_the_start_where_a_deeper_k_pays():
    """A draft that accepts 0.95 a position and verifies that cost the same at every size: once the deeper sizes are
    measured (explore rounds measure them in service), the choice leaves the start for the pool's K."""
    p = planner(5)
    for policy in p.adaptive.values():
        for _ in range(600):
            policy.observe_round(5, 5, "plain")
            policy.observe_round(5, 5, "cache")
            policy.observe_lookup(True, 1, 5)
    for _ in range(3):
        for n in range(1, 7):
            p.observe_verify(n, 0.03, 0.001, 1)
        p.adaptive["sd"].observe_draft_step(1, 0.001)
    p.adapt(1)
    assert p.choice == {"sd": 5, "ssd": 5}
