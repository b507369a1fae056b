"""bench/ab_stack.py's switch count: the adaptive K changes a run's mode logged in the router's log after the run began."""
from tests.bench_scripts import load


def line(mode: str, batch: int, was: int, now: int) -> str:
    return (f"2026-12-06 02:07:44,270 router DEBUG adaptive speculation ({mode}, batch {batch}): K {was} -> {now} "
            "from the cache {'cached': True}\n")


def test_switches_count_the_runs_mode_from_where_the_run_began(tmp_path):
    ab = load("ab_stack")
    log = tmp_path / "router.log"
    log.write_text(line("ssd", 16, 0, 1) + line("sd", 16, 3, 0))
    start = ab._size(log)
    assert start == log.stat().st_size and ab._size(tmp_path / "missing.log") == 0
    with open(log, "a") as f:
        f.write(line("ssd", 16, 1, 0) + line("sd", 16, 0, 1) + "2026-12-06 router INFO something else\n"
                + line("ssd", 8, 0, 2) + line("sd", 8, 1, 0))
    assert ab._switches(log, start, "ssd-auto") == 2
    assert ab._switches(log, start, "ssd") == 2
    assert ab._switches(log, start, "sd-auto") == 2
    assert ab._switches(log, 0, "ssd-auto") == 3     # from the start of the log: the earlier run's change too
    assert ab._switches(log, start, "ar") == 0
    assert ab._switches(log, start, "ssd1") == 0     # a pinned K does not adapt


def test_max_batch_sizes_the_stack_for_more_than_the_batches_it_runs(monkeypatch):
    ab = load("ab_stack")
    made = []

    class FakeStack:
        grpc_address = "127.0.0.1:1"

        def __init__(self, cfg):
            made.append(cfg)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class FakeClient(FakeStack):
        def __init__(self, address, timeout):
            pass

        def generate(self, *args, **kwargs):
            return None

    monkeypatch.setattr(ab, "Stack", FakeStack)
    monkeypatch.setattr(ab, "Client", FakeClient)
    ab.main("x", batches=(1,), modes=(), max_batch=16)
    ab.main("x", batches=(1, 4), modes=())
    ab.main("x", batches=(8,), modes=(), max_batch=4)
    assert [cfg.max_batch for cfg in made] == [16, 4, 8]   # never smaller than a batch it runs
