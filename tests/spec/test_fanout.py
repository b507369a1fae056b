import itertools
import math

import numpy as np
import pytest

from ssd.spec.fanout import (PRIOR_ACCEPTANCE, R_PRIOR, FanoutPolicy, acceptance_counts, default_budget,
                             default_fanout, estimate_acceptance, fit_power_law, geometric_fanout, geometric_weights,
                             outcome_fanout, outcome_probabilities, uniform_fanout)

GRID = list(itertools.product([0, 1, 3, 5, 8], [0, 1, 3, 4, 7, 16, 31, 64, 100], [0.3, 0.6, 0.8, 0.95],
                              [0.3, 1.0, 2.5]))


@pytest.mark.parametrize("K,budget", [(0, 5), (3, 0), (3, 2), (4, 17), (7, 64)])
def test_uniform_fanout_sums_to_budget_and_differs_by_at_most_one(K, budget):
    f = uniform_fanout(K, budget)
    assert len(f) == K + 1 and sum(f) == budget
    assert max(f) - min(f) <= 1 and f == sorted(f, reverse=True)


def test_geometric_fanout_sums_exactly_to_budget_everywhere():
    for K, budget, a, r in GRID:
        f = geometric_fanout(K, budget, a, r)
        assert len(f) == K + 1 and sum(f) == budget and min(f) >= 0, (K, budget, a, r, f)


def test_geometric_fanout_is_non_increasing_before_the_bonus_position():
    for K, budget, a, r in GRID:
        f = geometric_fanout(K, budget, a, r)
        assert all(f[j] >= f[j + 1] for j in range(K - 1)), (K, budget, a, r, f)


def test_geometric_weights_match_theorem_12_shape():
    K, a, r = 5, 0.75, 1.7
    w = geometric_weights(K, a, r)
    e = 1 / (1 + r)
    expected = [a ** (j * e) for j in range(K)] + [a ** (K * e) * (1 - a) ** (-e)]
    expected = [x / sum(expected) for x in expected]
    assert w == pytest.approx(expected, rel=1e-12)
    assert all(w[j] > w[j + 1] for j in range(K - 1))
    assert w[K] / w[K - 1] == pytest.approx(a ** e * (1 - a) ** (-e))


def test_rounded_fanout_stays_within_one_of_the_continuous_shares():
    for K, budget, a, r in GRID:
        f = geometric_fanout(K, budget, a, r)
        ideal = [s * budget for s in geometric_weights(K, a, r)]
        assert all(abs(x - y) < 1 for x, y in zip(f, ideal)), (K, budget, a, r, f, ideal)


def test_budget_below_positions_leaves_the_smallest_shares_at_zero():
    f = geometric_fanout(5, 3, 0.6, 1.0)
    assert sum(f) == 3 and f.count(0) >= 3
    shares = geometric_weights(5, 0.6, 1.0)
    kept = [j for j, x in enumerate(f) if x]
    assert min(shares[j] for j in kept) >= max(shares[j] for j, x in enumerate(f) if not x)


def test_min_fanout_gives_every_position_a_fork_when_the_budget_allows():
    f = geometric_fanout(7, 12, 0.3, 0.5, min_fanout=1)
    assert sum(f) == 12 and min(f) >= 1
    assert geometric_fanout(7, 12, 0.3, 0.5).count(0) > 0
    assert sum(geometric_fanout(7, 5, 0.3, 0.5, min_fanout=1)) == 5


def test_geometric_fanout_rejects_invalid_parameters():
    for a in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError):
            geometric_fanout(3, 10, a, 1.0)
    with pytest.raises(ValueError):
        geometric_fanout(3, 10, 0.5, 0.0)
    with pytest.raises(ValueError):
        geometric_fanout(3, -1, 0.5, 1.0)


@pytest.mark.parametrize("r", [0.4, 1.0, 2.3])
def test_fit_power_law_recovers_exponent_from_synthetic_miss_rates(r):
    rng = np.random.default_rng(0)
    fanouts = np.arange(1, 17)
    miss = fanouts ** (-r) * np.exp(rng.normal(0.0, 0.02, fanouts.size))
    assert fit_power_law(fanouts.tolist(), miss.tolist()) == pytest.approx(r, rel=0.03)
    assert fit_power_law([2, 4, 8], [2 ** -r, 4 ** -r, 8 ** -r]) == pytest.approx(r, rel=1e-9)


def test_fit_power_law_needs_a_fanout_above_one():
    with pytest.raises(ValueError):
        fit_power_law([1, 1], [1.0, 0.9])


def test_acceptance_counts_follow_round_outcomes():
    accepted, offered = acceptance_counts([0, 4, 2], K=4)
    assert offered == [3, 2, 2, 1]
    assert accepted == [2, 2, 1, 1]


def test_estimate_acceptance_converges_to_data_and_holds_prior_on_few_samples():
    assert estimate_acceptance([], []) == pytest.approx(0.7)
    assert estimate_acceptance([0], [1]) > 0.6
    accepted, offered = acceptance_counts([4] * 1000 + [0] * 1000, K=4)
    assert estimate_acceptance(accepted, offered) == pytest.approx(4000 / 5000, abs=0.01)
    assert estimate_acceptance([10_000], [10_000]) == 0.99
    assert 0 < geometric_fanout(4, 20, estimate_acceptance([10_000], [10_000]), 1.0)[-1]
    assert math.isfinite(estimate_acceptance([0], [100_000]))


def test_outcome_probabilities_follow_the_conditional_acceptance():
    assert outcome_probabilities([0.5, 0.8]) == pytest.approx([0.5, 0.1, 0.4])
    assert outcome_probabilities([]) == [1.0]
    assert sum(outcome_probabilities([0.3, 0.9, 0.1, 0.6])) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="acceptance"):
        outcome_probabilities([1.2])


@pytest.mark.parametrize("K,budget,a,r", GRID[::7])
def test_outcome_fanout_is_theorem_12_for_iid_acceptance(K, budget, a, r):
    assert outcome_fanout(budget, outcome_probabilities([a] * K), r) == geometric_fanout(K, budget, a, r)


def test_outcome_fanout_follows_each_positions_acceptance():
    # the first token rarely accepted, the second almost always: outcome j = 1 is the rarest, j = 0 the likeliest
    fan = outcome_fanout(64, outcome_probabilities([0.3, 0.95, 0.9]), 0.4)
    assert sum(fan) == 64 and fan[0] == max(fan) and fan[1] == min(fan)
    with pytest.raises(ValueError, match="r must be > 0"):
        outcome_fanout(8, [0.5, 0.5], 0.0)
    with pytest.raises(ValueError, match="p_outcome"):
        outcome_fanout(8, [0.0, 0.0], 1.0)


def test_the_default_is_sixteen_forks_per_position_split_by_the_priors():
    """What a draft runs when told nothing (SpecConfig, the draft service): 64 forks at K = 3, not the paper's
    2 per position (a hit rate of 0.43 on the default pair, against 0.73: bench/results/fanout.json), split by
    Theorem 12 with r = 0.4, not uniformly."""
    from services.draft.service import DraftConfig
    from ssd.engine.speculative import SpecConfig

    assert default_budget(3) == 64 and default_budget(1) == 32
    assert default_fanout(3) == geometric_fanout(3, 64, PRIOR_ACCEPTANCE, R_PRIOR) == [23, 16, 11, 14]
    assert R_PRIOR == 0.4
    assert list(SpecConfig(k=3).fanout) == default_fanout(3) == DraftConfig(k=3).resolved_fanout()
    assert sum(SpecConfig(k=2, budget=6).fanout) == 6 and sum(DraftConfig(k=2, budget=6).resolved_fanout()) == 6


def test_policy_splits_by_the_acceptance_it_measures_at_each_position():
    p = FanoutPolicy(3, 12)
    assert p.fanout() == geometric_fanout(3, 12, PRIOR_ACCEPTANCE, R_PRIOR)   # the prior until it measures
    rng = np.random.default_rng(1)
    for _ in range(2000):   # token 1 accepted 30% of the time, then 90%, then 50%
        a = [0.3, 0.9, 0.5]
        j = next((i for i in range(3) if rng.random() >= a[i]), 3)
        p.observe_outcome(j, 3)
    assert p.acceptance() == pytest.approx([0.3, 0.9, 0.5], abs=0.12)
    assert p.fanout() == outcome_fanout(12, outcome_probabilities(p.acceptance()), R_PRIOR)
    assert p.fanout()[1] < p.fanout()[2]      # j = 1 needs token 1 accepted and token 2 rejected: rare
    p.observe_outcome(1, 1)                   # a shorter speculation (room): positions past it are not counted
    with pytest.raises(ValueError, match="offered"):
        p.observe_outcome(3, 2)


def test_policy_splits_over_the_outcomes_a_shorter_speculation_can_have():
    """A round of k < K drafted tokens has k + 1 outcomes: the budget goes to those (laid out as the draft reads a
    fan-out: F_0..F_{k-1}, then the bonus token's last), none to positions the round does not have."""
    p = FanoutPolicy(5, 30)
    rng = np.random.default_rng(2)
    for _ in range(3000):
        a = [0.6, 0.7, 0.7, 0.8, 0.8]
        j = next((i for i in range(5) if rng.random() >= a[i]), 5)
        p.observe_outcome(j, 5)
    for j, forks, hit in [(0, 8, True), (1, 5, False), (5, 3, True), (5, 3, False), (2, 4, True)]:
        p.observe_lookup(forks, hit, j)
    r, acc, scale = p.exponent(), p.acceptance(), p.miss_scale()
    assert p.fanout() == p.fanout(k=5) == outcome_fanout(30, outcome_probabilities(acc), r, scale)
    three = p.fanout(k=3)
    split = outcome_fanout(30, outcome_probabilities(acc[:3]), r, scale[:3] + [scale[5]])
    assert three == split[:3] + [0, 0] + [split[3]] and sum(three) == 30
    assert three[5] > p.fanout()[5]        # all of 3 accepted is likelier than all of 5: more forks for its bonus
    assert p.fanout(k=0) == [0] * 5 + [30]   # no drafted token: the bonus token is the only outcome
    before = p._rounds
    both = p.fanouts(2, [1, 3])
    assert p._rounds == before + 1 and p._asked % 15 == 0   # one draft round of two sequences, counted once
    assert set(both) == {1, 3} and all(sum(f) == 15 and len(f) == 6 for f in both.values())
    assert both[1][1:5] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="k must be in 0..5"):
        p.fanout(k=6)


def test_policy_fits_r_from_miss_rates_at_each_fork_count():
    p = FanoutPolicy(3, 12, min_lookups=10)
    assert p.exponent() == R_PRIOR   # the prior until enough lookups
    rng = np.random.default_rng(0)
    for _ in range(3000):
        f = int(rng.choice([2, 4]))
        p.observe_lookup(f, rng.random() >= f ** -0.5)   # miss(F) = F^-0.5
    assert p.exponent() == pytest.approx(0.5, abs=0.12)
    assert p.fanout() == outcome_fanout(12, outcome_probabilities(p.acceptance()), p.exponent())


def test_outcome_fanout_gives_more_forks_where_a_position_misses_more():
    p = outcome_probabilities([0.5, 0.5, 0.5])
    assert outcome_fanout(32, p, 0.4, [1.0] * 4) == outcome_fanout(32, p, 0.4)
    assert outcome_fanout(32, p, 0.4, [2.0] * 4) == outcome_fanout(32, p, 0.4)   # only the ratios count
    plain, scaled = outcome_fanout(32, p, 0.4), outcome_fanout(32, p, 0.4, [1.0, 1.0, 1.0, 0.25])
    assert scaled[3] < plain[3] and scaled[0] > plain[0] and sum(scaled) == 32
    w = [(pj * c) ** (1 / 1.4) for pj, c in zip(p, [1.0, 1.0, 1.0, 0.25])]
    assert all(abs(f - 32 * x / sum(w)) < 1 for f, x in zip(scaled, w))   # F_j ∝ (P(j) c_j)^(1/(1+r))
    with pytest.raises(ValueError, match="miss_scale"):
        outcome_fanout(32, p, 0.4, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="miss_scale"):
        outcome_fanout(32, p, 0.4, [1.0, 1.0, 1.0, 0.0])


def test_policy_measures_each_positions_miss_scale_and_splits_by_it():
    """Outcomes at four positions whose misses fall as c_j F^-0.4 with c = [0.9, 0.6, 0.5, 0.25] (the bonus token is
    the easiest to guess, as on the default pair): the policy measures the scales' ratios and its split hits more
    often, by the true curves, than the split by P(j) alone; lookups without a position teach only r."""
    c = [0.9, 0.6, 0.5, 0.25]
    rng = np.random.default_rng(1)
    p = FanoutPolicy(3, 32)
    shared = FanoutPolicy(3, 32)
    for _ in range(4000):
        j = int(rng.choice(4, p=[0.5, 0.25, 0.1, 0.15]))
        for q in (p, shared):
            f = q.fanout()[j]
            hit = rng.random() >= c[j] * f ** -0.4
            q.observe_outcome(j, 3)
            q.observe_lookup(f, hit, j if q is p else None)
    scale = p.miss_scale(0.4)
    assert [x / scale[0] for x in scale] == pytest.approx([y / c[0] for y in c], abs=0.12)
    assert shared.miss_scale() == [1.0] * 4 and shared._pos_lookups == [{}, {}, {}, {}]

    def hit_rate(fan):
        return sum(pj * (1 - min(1.0, cj * f ** -0.4)) if f else 0.0
                   for pj, cj, f in zip([0.5, 0.25, 0.1, 0.15], c, fan))
    assert p.fanout()[3] < shared.fanout()[3] and p.fanout()[0] > shared.fanout()[0]
    assert hit_rate(p.fanout()) > hit_rate(shared.fanout()) + 0.005
    with pytest.raises(ValueError, match="position"):
        p.observe_lookup(4, True, 4)


def test_policy_cuts_the_budget_while_late_and_gives_it_back():
    p = FanoutPolicy(3, 16, window=10)
    for _ in range(10):
        p.observe_late(True)
    assert p.budget == 12                      # a quarter off
    for _ in range(100):
        p.observe_late(True)
    assert p.budget == 4                       # never below one fork per position (K + 1)
    for _ in range(30):
        p.observe_late(False)
    assert p.budget == 7                       # with no times measured, an eighth (at least one) back per window
    for _ in range(300):
        p.observe_late(False)
    assert p.budget == 16                      # never above the draft's own
    for _ in range(10):
        p.observe_late(_ % 10 == 0)            # 10%: between the thresholds, unchanged
    assert p.budget == 16


def _window(p, draft_s, verify_s, late=False):
    for _ in range(p.window):
        p.observe_draft(draft_s)
        p.observe_verify(verify_s)
        p.observe_late(late)


def test_policy_sizes_the_budget_so_the_drafts_round_fits_in_the_verify():
    """A draft whose round costs 2 ms plus 1 ms a fork, against a 50 ms verify: with 80% headroom the budget
    settles at (40 - 2) / 1 = 38 forks, from above and from below; it follows the verify when that changes."""
    p = FanoutPolicy(3, 64, window=8)
    for _ in range(6):
        _window(p, 0.002 + 0.001 * p.budget, 0.05)
    assert p.budget == 38
    p.budget = 5
    for _ in range(2):
        _window(p, 0.002 + 0.001 * p.budget, 0.05)
    assert p.budget == 20                      # at most twice per window
    for _ in range(5):
        _window(p, 0.002 + 0.001 * p.budget, 0.05)
    assert p.budget == 38
    for _ in range(5):                         # a slower target (a larger batch on it): up to the draft's own
        _window(p, 0.002 + 0.001 * p.budget, 0.5)
    assert p.budget == 64
    _window(p, 0.002 + 0.001 * p.budget, 0.001)
    assert p.budget == 16                      # a quarter per window at most
    for _ in range(3):
        _window(p, 0.002 + 0.001 * p.budget, 0.001)
    assert p.budget == 4                       # one fork per position at least


def test_the_budget_is_per_draft_round_and_shared_by_its_sequences():
    """64 forks a round: one sequence gets the draft's own 64, four get 16 each, 32 get one per position; the
    time it then measures is that of the forks asked for, and however fast the draft, a wider round does not
    widen its work past the draft's own 64 (a busy draft slows a verify that shares its memory bus)."""
    p = FanoutPolicy(3, 64, window=8)
    assert sum(p.fanout(1)) == 64 and sum(p.fanout(4)) == 16 and sum(p.fanout(32)) == 4
    assert p.per_sequence(2) == 32
    p = FanoutPolicy(3, 64, window=8)
    p.budget = 32
    for _ in range(8):                         # rounds of 4 at 8 forks each: 32 a round, a quarter of the verify
        p.fanout(4)
        p.observe_draft(0.0125)
        p.observe_verify(0.05)
        p.observe_late(False)
    assert p.budget == 64                      # x2 a window at most (32 x 0.8 / 0.25 = 102 asked)
    for _ in range(3):                         # a fast draft and rounds of 4: still 64 a round, 16 a sequence
        p.fanout(4)
        _window(p, 0.0001, 0.05)
    assert p.budget == 64 and sum(p.fanout(4)) == 16
    p.budget = 8
    assert sum(p.fanout(4)) == 4               # one fork per position each, even when that is more than 8 / 4


def test_lateness_overrides_the_time_it_measures():
    p = FanoutPolicy(3, 64, window=10)
    p.budget = 32
    _window(p, 0.001, 0.05, late=True)         # the times say grow, but the entries came late: cut a quarter
    assert p.budget == 24
    for i in range(10):                        # 10% late: the times may not grow it
        p.observe_draft(0.001)
        p.observe_verify(0.05)
        p.observe_late(i == 0)
    assert p.budget == 24


def test_policy_settings_are_checked():
    with pytest.raises(ValueError):
        FanoutPolicy(3, -1)
    with pytest.raises(ValueError, match="r_prior"):
        FanoutPolicy(3, 8, r_prior=0)
    with pytest.raises(ValueError, match="late_low"):
        FanoutPolicy(3, 8, late_low=0.5, late_high=0.2)
    with pytest.raises(ValueError, match="prior_acceptance"):
        FanoutPolicy(3, 8, prior_acceptance=1.0)
    with pytest.raises(ValueError, match="headroom"):
        FanoutPolicy(3, 8, headroom=0)
    with pytest.raises(ValueError, match="position_decay"):
        FanoutPolicy(3, 8, position_decay=0)
    with pytest.raises(ValueError, match="position_prior"):
        FanoutPolicy(3, 8, position_prior=0)
    assert FanoutPolicy(3, 2).min_budget == 2   # a draft budget under K + 1 stays what it is


def test_a_late_window_cuts_to_what_the_measured_times_say_fits():
    """Late entries with the draft's round at 1.3 verifies: down to 64 x 0.8 / 1.3 = 39 forks at once, not a
    quarter off (48), which left a new stack's first request waiting for late entries; a quarter when the times
    say less would do."""
    p = FanoutPolicy(3, 64, window=8)
    _window(p, 0.065, 0.05, late=True)
    assert p.budget == 39
    p = FanoutPolicy(3, 64, window=8)
    _window(p, 0.045, 0.05, late=True)         # the times say 57 fit, the entries were late anyway
    assert p.budget == 48


def test_the_first_adjustment_comes_after_the_first_window():
    p = FanoutPolicy(3, 64, window=32, first_window=8)
    for _ in range(8):
        p.observe_late(True)
    assert p.budget == 48                      # after 8 lookups
    for _ in range(31):
        p.observe_late(True)
    assert p.budget == 48                      # then every 32
    p.observe_late(True)
    assert p.budget == 36
    with pytest.raises(ValueError, match="first_window"):
        FanoutPolicy(3, 8, first_window=0)
    assert FanoutPolicy(3, 8, window=5).first_window == 5
