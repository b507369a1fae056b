"""`ssd bench`'s summary: the best fixed K per mode, and the adaptive setting against it (no processes)."""
from ssd.bench.stack import markdown, summary_row


def run(tok_s, hit=0.4, tpr=1.7):
    return {"tok_s": tok_s, "tokens_per_round": tpr, "hit_rate": hit, "late_rate": 0.0, "acceptance": 0.45,
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
