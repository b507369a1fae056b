import math
import subprocess
import sys
from pathlib import Path

import pytest

from ssd.spec.backup import BackupPolicy, BackupTimings, LinearEma, choose_backup, jit_threshold
from ssd.spec.theory import expected_tokens

P = BackupPolicy


def measured(k=4, accept_jit=0.8, accept_ngram=0.3):
    t = BackupTimings(k=k, accept_jit=accept_jit, accept_ngram=accept_ngram)
    for b in (1, 2, 4, 8, 16, 32, 64):
        t.observe_draft_step(b, 2e-3 + 1e-3 * b)
        t.observe_verify(b, 20e-3 + 1e-3 * b)
    return t


def test_auto_picks_jit_at_batch_one_and_ngram_above_the_threshold():
    t = measured()
    g = expected_tokens(0.8, 4) / expected_tokens(0.3, 4) - 1
    b_star = (g * 20e-3 - 4 * 2e-3) / (4 * 1e-3 - g * 1e-3)
    assert jit_threshold(t) == pytest.approx(b_star, rel=1e-6)
    assert choose_backup(P.AUTO, 1, t) is P.JIT
    assert choose_backup(P.AUTO, math.floor(b_star), t) is P.JIT
    assert choose_backup(P.AUTO, math.ceil(b_star), t) is P.NGRAM
    assert choose_backup("auto", 256, t) is P.NGRAM


def test_defaults_before_measurements_pick_jit_small_and_ngram_large():
    assert 2 < jit_threshold(BackupTimings()) < 32
    assert choose_backup(P.AUTO, 1) is P.JIT
    assert choose_backup(P.AUTO, 64) is P.NGRAM


def test_concrete_policies_pass_through():
    for p in (P.JIT, P.NGRAM, P.NONE):
        assert choose_backup(p, 1000, measured()) is p
    assert choose_backup("none", 1) is P.NONE


def test_jit_never_pays_when_its_drafts_are_no_better_than_ngram():
    assert jit_threshold(measured(accept_jit=0.3, accept_ngram=0.3)) == 0.0


def test_cheap_draft_that_scales_like_the_target_always_pays():
    t = BackupTimings()
    for b in (1, 8, 64):
        t.observe_draft_step(b, 1e-4 * b)
        t.observe_verify(b, 1e-2 * b)
    assert jit_threshold(t) == math.inf


def test_linear_ema_fits_a_line_and_scales_the_prior_from_one_batch_size():
    line = LinearEma(prior_intercept=1.0, prior_slope=1.0)
    for b in (1, 3, 9, 27):
        line.observe(b, 0.5 + 0.25 * b)
    assert line.coefficients() == pytest.approx((0.5, 0.25))
    one = LinearEma(prior_intercept=1.0, prior_slope=1.0)
    one.observe(3, 8.0)
    assert one.predict(3) == pytest.approx(8.0) and one.predict(1) == pytest.approx(4.0)


def test_acceptance_ema_moves_toward_observations():
    t = BackupTimings(accept_ngram=0.3)
    for _ in range(100):
        t.observe_acceptance(P.NGRAM, 4, 4)
    assert t.accept_ngram > 0.99
    with pytest.raises(ValueError):
        t.observe_acceptance(P.NONE, 1, 1)


def test_router_side_modules_do_not_import_torch():
    code = ("import sys, ssd.spec.cache, ssd.spec.fanout, ssd.spec.ngram, ssd.spec.backup, ssd.spec.theory; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
