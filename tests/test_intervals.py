"""Every interval method the project uses covers its true value as often as it claims, at the
sample sizes runs really have: 1,000 synthetic comparisons with a known ratio and realistic
run-to-run noise (3% in log-rate from process to process, as a 2-core VM's fresh processes
spread), 95% intervals that must cover at least 93% of the time at n = 2, 3, 5 and 10. The
percentile bootstrap the project used before over trials is checked to fail where it failed."""

import math

import numpy as np
import pytest
from accelbench import stats
from accelbench.compare import _unpaired
from conftest import a_record, throughput_of

SIMULATIONS = 1000
NOISE = 0.03
IMAGES = 800


def run_record(rates):
    """A record whose trials ran at these rates (what the unpaired analysis reads)."""
    from accelbench.records import TrialRow

    walls = [IMAGES / r for r in rates]
    trials = [TrialRow(i, "ok", "", IMAGES, w, IMAGES / w, [w / 100] * 100, []) for i, w in enumerate(walls)]
    record = a_record(trials=trials, throughput=throughput_of(IMAGES * len(rates) / sum(walls)))
    record.batch.global_ = IMAGES // 100
    return record


def coverage(interval_of, truth, n, seed):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(SIMULATIONS):
        low, high = interval_of(rng, n)
        hits += low <= truth <= high
    return hits / SIMULATIONS


def trial_rates(rng, n, rate=10.0):
    return rate * np.exp(rng.normal(0.0, NOISE, n))


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_a_records_interval_over_trials_covers_the_true_rate(n):
    def interval(rng, n):
        rates = trial_rates(rng, n)
        (low, high), method = stats.throughput_ci([IMAGES] * n, [IMAGES / r for r in rates], [], 8)
        assert method == stats.TRIALS_METHOD
        return low, high

    assert coverage(interval, 10.0, n, seed=n) >= 0.93


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_an_unpaired_comparison_covers_the_true_ratio(n):
    def interval(rng, n):
        _, ci, count, unit, _ = _unpaired(run_record(trial_rates(rng, n, 10.5)), run_record(trial_rates(rng, n)), 0, 0.95)
        assert unit == "trials" and count == n
        return ci

    assert coverage(interval, 1.05, n, seed=10 + n) >= 0.93


@pytest.mark.parametrize("n", [3, 5, 10])
def test_paired_rounds_cover_the_true_ratio_through_a_drift_and_an_order_effect(n):
    """Rounds share the machine's speed of the moment (a drift common to both sides), the side
    that runs second in a round is 1% slower, and the order alternates by round."""

    def interval(rng, n):
        machine = np.exp(np.cumsum(rng.normal(0.0, 0.05, n)))
        a_first = [i % 2 == 0 for i in range(n)]
        second = np.where(a_first, 1.0, 0.99)
        a = 10.5 * machine * second * np.exp(rng.normal(0.0, NOISE, n))
        b = 10.0 * machine * np.where(a_first, 0.99, 1.0) * np.exp(rng.normal(0.0, NOISE, n))
        return stats.paired_ratio(a, b, a_first).ci95

    assert coverage(interval, 1.05, n, seed=20 + n) >= 0.93


def old_bootstrap_over_trials(rates):
    """The percentile bootstrap over trials the project used until schema 1.10."""
    rng = np.random.default_rng(0)
    rates = np.asarray(rates)
    idx = rng.integers(0, rates.size, size=(2000, rates.size))
    samples = IMAGES * rates.size / (IMAGES / rates[idx]).sum(axis=1)
    return tuple(np.percentile(samples, [2.5, 97.5]))


def test_the_percentile_bootstrap_over_two_trials_covered_far_too_rarely():
    """Why the t-interval: this test is the coverage check run on the method it replaced."""
    found = coverage(lambda rng, n: old_bootstrap_over_trials(trial_rates(rng, n)), 10.0, 2, seed=2)
    assert found < 0.6


def test_the_t_interval_is_the_exact_textbook_one():
    rates = [9.8, 10.1, 10.4]
    low, high = stats.log_rate_interval(rates, 10.0)
    logs = np.log(rates)
    half = 4.302652729911275 * logs.std(ddof=1) / math.sqrt(3)  # t(0.975, 2)
    assert (low, high) == pytest.approx((10.0 * math.exp(-half), 10.0 * math.exp(half)))
    with pytest.raises(ValueError):
        stats.log_rate_interval([10.0], 10.0)
