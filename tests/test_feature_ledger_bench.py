"""bench/feature_ledger.py runs both ways of keeping a plain stretch's features on the router's real ledger."""
from tests.bench_scripts import load


def test_both_ways_run_on_the_routers_ledger():
    bench = load("feature_ledger")
    keep, take = bench.ledger_ms(5)
    assert keep > 0 and take >= 0 and bench.merged_ms(5) > 0
