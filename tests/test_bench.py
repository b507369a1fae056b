"""`ssd bench`'s summary: the best fixed K per mode, and the adaptive setting against it; its passes and how a
mode's runs add up (no processes)."""
import pytest

from ssd.bench.stack import add_measures, auto_passes, markdown, mode_row, orders, pass_plan, summary_row


def run(tok_s, hit=0.4, tpr=1.7):
    return {"tok_s": tok_s, "tokens_per_round": tpr, "hit_rate": hit, "served_rate": hit, "late_rate": 0.0,
            "acceptance": 0.45,
            "bound_tok_s": 2 * tok_s, "overhead_fraction": 0.02}


def test_summary_picks_the_best_fixed_k_of_each_mode():
    per = {"ar": run(20.0), "sd1": run(30.0), "sd2": run(27.0), "ssd1": run(26.0), "ssd2": run(33.0, hit=0.5),
           "ssd-auto": run(31.0)}
    r = summary_row(per)
    assert (r["sd_k"], r["sd_tok_s"], r["ssd_k"], r["ssd_tok_s"]) == (1, 30.0, 2, 33.0)
    assert r["auto_over_best_fixed"] == 31.0 / 33.0 and r["auto_over_ar"] == 31.0 / 20.0
    assert r["auto_over_sd"] == 31.0 / 30.0 and r["hit_rate"] == 0.5   # the best SSD run's figures


def test_summary_counts_ar_as_a_fixed_setting():
    per = {"ar": run(40.0), "sd3": run(30.0), "ssd3": run(25.0), "ssd-auto": run(38.0)}
    assert summary_row(per)["auto_over_best_fixed"] == 38.0 / 40.0


def test_markdown_has_a_row_per_batch_size():
    per = {"ar": run(20.0), "sd3": run(30.0), "ssd3": run(25.0), "ssd-auto": run(28.0)}
    table = markdown({"k": 3, "batch": {"1": summary_row(per), "4": summary_row(per)}})
    lines = table.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| 1 | 20.0 | 30.0 (3) | 25.0 (3) | 28.0 | 0.93 |")


def test_the_routers_own_sd_counts_as_an_sd_setting():
    per = {"ar": run(20.0), "sd3": run(30.0), "ssd3": run(25.0), "sd-auto": run(32.0), "ssd-auto": run(36.0)}
    r = summary_row(per)
    assert (r["sd_k"], r["sd_tok_s"]) == ("auto", 32.0)
    assert r["auto_over_sd"] == 36.0 / 32.0 and r["auto_over_best_fixed"] == 36.0 / 32.0
    assert markdown({"k": 3, "batch": {"1": r}}).splitlines()[2].startswith("| 1 | 20.0 | 32.0 (auto) | 25.0 (3) |")


def test_passes_split_the_prompts_and_reverse_the_order_of_the_modes_on_every_other_pass():
    modes, prompts = ["ar", "sd3", "ssd3", "sd-auto", "ssd-auto"], [f"p{i}" for i in range(20)]
    plan = pass_plan(modes, prompts, 8, 1, 2)
    assert [order for order, _ in plan] == [modes, modes[::-1]]
    assert [ps for _, ps in plan] == [prompts[0:4], prompts[4:8]]   # every prompt once, in one of the passes
    plan = pass_plan(modes, prompts, 8, 2, 3)
    assert [ps for _, ps in plan] == [prompts[0:3], prompts[3:6], prompts[6:9]]
    assert [order for order, _ in plan] == [modes, modes[::-1], modes]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 9])
def test_as_many_passes_as_modes_run_each_mode_once_at_every_place(n):
    modes = [f"m{i}" for i in range(n)]
    rows = orders(modes, n)
    assert all(sorted(row) == modes for row in rows)                    # every mode in every pass
    assert all(sorted(col) == modes for col in zip(*rows))              # and once at every place
    if n % 2 == 0:   # Williams: each mode follows each other mode once
        follows = [(a, b) for row in rows for a, b in zip(row, row[1:])]
        assert len(set(follows)) == len(follows) == n * (n - 1)
    assert orders(modes, 2 * n) == rows + rows
    assert orders(modes, 3 if n != 3 else 4)[:2] == [modes, modes[::-1]]   # not a multiple: reversed in turn


def test_the_default_takes_the_square_where_it_costs_at_most_a_quarter_more_prompts():
    modes, prompts = ["ar", "sd3", "ssd3", "sd-auto", "ssd-auto"], [f"p{i}" for i in range(20)]
    assert [auto_passes(5, 8, b) for b in (1, 2, 4, 8, 16)] == [5, 5, 2, 2, 2]
    assert [auto_passes(5, 16, b) for b in (1, 2, 4, 8)] == [5, 5, 5, 2]
    assert auto_passes(2, 8, 1) == 2 and auto_passes(9, 8, 1) == 9
    plan = pass_plan(modes, prompts, 8, 1, 0)
    assert [order for order, _ in plan] == orders(modes, 5)
    assert [ps for _, ps in plan] == [prompts[i:i + 2] for i in range(0, 10, 2)]   # 10 runs a mode, not 8
    places = {m: [order.index(m) for order, _ in plan] for m in modes}
    assert all(sorted(p) == list(range(5)) for p in places.values())   # no mode mid-way in every pass
    plan = pass_plan(modes, prompts, 8, 4, 0)
    assert [order for order, _ in plan] == [modes, modes[::-1]] and [len(ps) for _, ps in plan] == [4, 4]


def test_a_pass_fills_its_batch_wrapping_around_the_prompts_when_the_shares_would_not():
    prompts = [f"p{i}" for i in range(20)]
    plan = pass_plan(["ar", "ssd-auto"], prompts, 8, 8, 2)
    assert [ps for _, ps in plan] == [prompts[0:8], prompts[8:16]]
    plan = pass_plan(["ar", "ssd-auto"], prompts, 8, 16, 2)
    assert [ps for _, ps in plan] == [prompts[0:16], prompts[16:20] + prompts[0:12]]
    assert pass_plan(["ar"], prompts, 8, 1, 1) == [(["ar"], prompts[0:8])]


def measure(tokens, wall, rounds, hits, misses, verify_s, batches):
    return {"tokens": tokens, "wall_s": wall,
            "totals": {"rounds": rounds, "round_tokens": tokens, "accepted": [hits, 1], "offered": [rounds, 3],
                       "reached": rounds, "cache": {"hit": hits, "no_entry": misses, "forced": 1},
                       "backups": {"jit": misses}, "verify_batches": batches, "target_verify_s": verify_s,
                       "verify_roundtrip_s": verify_s * 1.1, "draft_rounds": rounds, "draft_round_s": 0.5,
                       "jit_batches": misses, "jit_s": 0.1 * misses}}


def test_a_modes_runs_add_up_to_one_row_over_all_of_them_not_a_mean_of_their_rates():
    a, b = measure(100, 2.0, 50, 30, 10, 1.5, 50), measure(300, 4.0, 100, 40, 60, 3.0, 100)
    both = mode_row(add_measures(a, b))
    assert both["tok_s"] == 400 / 6.0                       # not (50 + 75) / 2
    assert both["hit_rate"] == 70 / 140 and both["tokens_per_round"] == 400 / 150
    assert both["verify_s_per_batch"] == 4.5 / 150 and both["cache"] == {"hit": 70, "no_entry": 70, "forced": 2}
    assert both["acceptance_per_position"] == [70 / 150, 2 / 6]
    assert both["served_rate"] == both["hit_rate"] and both["waits"] == {}   # no late lookup waited
    assert add_measures(a, {"tokens": 0, "wall_s": 0.0, "totals": {k: (type(v)() if not isinstance(v, (int, float))
                                                                         else 0) for k, v in a["totals"].items()}}) == a


def test_rounds_run_from_the_cache_count_the_late_lookups_whose_wait_found_their_entry():
    m = measure(100, 2.0, 50, 30, 10, 1.5, 50)
    m["totals"]["cache"]["late"] = 10
    m["totals"]["waits"] = {"hit": 7, "no_entry": 2, "failed": 1}
    m["totals"]["wait_s"] = 0.1
    row = mode_row(m)
    assert row["wait_s_per_wait"] == pytest.approx(0.01)
    assert row["hit_rate"] == 30 / 50 and row["late_rate"] == 10 / 50 and row["served_rate"] == 37 / 50
    assert "| 0.60 (0.74) |" in markdown({"k": 3, "batch": {"1": summary_row(
        {"ar": run(20.0), "sd3": run(30.0), "ssd3": {**run(25.0, hit=0.6), "served_rate": 0.74},
         "ssd-auto": run(28.0)})}})


@pytest.mark.parametrize("native", [True, False])
def test_the_host_facts_name_the_dtype_each_service_loads_on_this_cpu(monkeypatch, native):
    import ssd.worker.service as service
    from ssd.bench.stack import host_facts

    monkeypatch.setattr(service, "native_bf16", lambda device: native)
    facts = host_facts()
    assert facts["native_bf16"] is native
    # the target's default is float32 everywhere; the draft's `auto` is bfloat16 only where the CPU computes it
    assert facts["dtype"] == {"target": "float32", "draft": "bfloat16" if native else "float32"}
    assert facts["cores"] >= 1 and facts["cpu"]
    # a --dtype given to the stack is what both load
    assert host_facts("float16")["dtype"] == {"target": "float16", "draft": "float16"}


def test_the_defaults_the_host_facts_read_are_the_services_own():
    from services.draft.service import DraftConfig
    from services.target.service import TargetConfig
    from ssd.worker.service import DEFAULT_DTYPES

    assert DEFAULT_DTYPES == {"target": TargetConfig().dtype, "draft": DraftConfig().dtype}


def test_the_cpu_name_is_linux_model_name(monkeypatch, tmp_path):
    import builtins

    from ssd.bench import stack

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n")
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **kw: real_open(
        cpuinfo if path == "/proc/cpuinfo" else path, *a, **kw))
    assert stack.cpu_name() == "AMD EPYC 9R14 96-Core Processor"
    monkeypatch.setattr(builtins, "open", lambda path, *a, **kw: (_ for _ in ()).throw(OSError("no procfs")))
    monkeypatch.setattr(stack.platform, "processor", lambda: "")
    assert stack.cpu_name() == stack.platform.machine()
