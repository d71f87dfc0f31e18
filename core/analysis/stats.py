"""Statistics over timed steps and trials. Throughput is always a ratio of sums.

- images/sec = images in the timed steps / wall time of those steps (pooled over trials)
- jitter = 1.4826 x median absolute deviation (a robust stdev)
- cv = stdev / mean of step times; above ``CV_WARNING`` the record carries a warning
- 95% CI for images/sec: over trials when there are several (each trial an independent
  process), a Student-t interval on the trials' log-rates (n - 1 degrees of freedom: it holds at
  two trials, where a percentile bootstrap has three distinct resamples and is little more than
  their span); with one trial a percentile bootstrap over its steps (step-to-step noise only)
- two runs of separate invocations: Welch's t-interval on the difference of their log-rates
- paired ratio of two runs interleaved in rounds (or lockstep pairs): t-interval on the log-ratios
- lockstep's blocks per pair: the two-stage sampling optimum from the within- and between-pair variances
- trend: slope of a run's images/sec over its rounds, tested against zero (drift diagnostic)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import numpy.typing as npt

from accelbench.records.blocks import SpendingPlan

CV_WARNING = 0.10
BOOTSTRAP_RESAMPLES = 4000
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class StepTimeSummary:
    """Spread of the timed steps: jitter is 1.4826 x the median absolute deviation (a robust
    stdev), cv the stdev over the mean."""

    median_s: float
    mean_s: float
    stdev_s: float
    iqr_s: float
    jitter_s: float
    cv: float


def step_time_summary(step_times: Sequence[float]) -> StepTimeSummary:
    t = np.asarray(step_times, dtype=float)
    q1, median, q3 = np.percentile(t, [25, 50, 75])
    mean = float(t.mean())
    stdev = float(t.std(ddof=1)) if t.size > 1 else 0.0
    return StepTimeSummary(
        median_s=float(median),
        mean_s=mean,
        stdev_s=stdev,
        iqr_s=float(q3 - q1),
        jitter_s=float(MAD_TO_SIGMA * np.median(np.abs(t - median))),
        cv=stdev / mean if mean > 0 else 0.0,
    )


#: how a record's interval over several trials is computed (``throughput.ci_method``)
TRIALS_METHOD = "t-interval on log trial rates"
STEPS_METHOD = "bootstrap over steps"


def throughput_ci(
    images: Sequence[int], walls: Sequence[float], step_times: Sequence[float], images_per_step: float, seed: int = 0
) -> tuple[tuple[float, float], str]:
    """95% interval for pooled images/sec, and how it was computed: over several trials a
    t-interval on their log-rates, centred on the pooled rate; over one trial's steps a
    percentile bootstrap (many samples, but only step-to-step noise: the method says so)."""
    if len(walls) > 1:
        rates = np.asarray(images, float) / np.asarray(walls, float)
        pooled = float(np.sum(images)) / float(np.sum(walls))
        return log_rate_interval(rates, pooled), TRIALS_METHOD
    rng = np.random.default_rng(seed)
    seconds, steps = _grouped(np.asarray(step_times, float))
    idx = rng.integers(0, len(seconds), size=(BOOTSTRAP_RESAMPLES, len(seconds)))
    samples = images_per_step * steps[idx].sum(axis=1) / seconds[idx].sum(axis=1)
    low, high = np.percentile(samples, [2.5, 97.5])
    return (float(low), float(high)), STEPS_METHOD


#: a bootstrap over steps resamples at most this many groups of consecutive steps
BOOTSTRAP_GROUPS = 1000


def _grouped(times: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(seconds, steps) of up to ``BOOTSTRAP_GROUPS`` groups of consecutive steps: a time box of
    thousands of tiny steps is resampled as a thousand groups (the pooled rate is the same, and
    the resampling costs milliseconds, not a gigabyte of indices)."""
    if times.size <= BOOTSTRAP_GROUPS:
        return times, np.ones(times.size)
    bounds = np.linspace(0, times.size, BOOTSTRAP_GROUPS + 1).astype(int)
    return np.add.reduceat(times, bounds[:-1]), np.diff(bounds).astype(float)


def _t_quantile(confidence: float, dof: float) -> float:
    from scipy import stats as scipy_stats

    return float(scipy_stats.t.ppf(0.5 + confidence / 2, dof))


def log_rate_interval(rates: Sequence[float], center: float, confidence: float = 0.95) -> tuple[float, float]:
    """A Student-t interval (n - 1 degrees of freedom) for a rate from n >= 2 independent trials'
    rates, on their logarithms (throughputs vary by factors, and their logs are close to normal),
    centred on ``center`` (the pooled rate)."""
    logs = np.log(np.asarray(rates, float))
    if logs.size < 2:
        raise ValueError("an interval over trials needs two trials or more")
    half = _t_quantile(confidence, logs.size - 1) * float(logs.std(ddof=1)) / math.sqrt(logs.size)
    return center * math.exp(-half), center * math.exp(half)


def welch_ratio_interval(
    a_rates: Sequence[float], b_rates: Sequence[float], ratio: float, confidence: float = 0.95
) -> tuple[float, float]:
    """The interval of A/B from two independent sets of trials (runs of separate invocations, so
    nothing pairs them): Welch's t on the difference of the mean log-rates, with the
    Welch-Satterthwaite degrees of freedom, centred on ``ratio`` (the pooled rates' ratio)."""
    la, lb = np.log(np.asarray(a_rates, float)), np.log(np.asarray(b_rates, float))
    if la.size < 2 or lb.size < 2:
        raise ValueError("Welch's interval needs two trials or more on each side")
    va, vb = float(la.var(ddof=1)) / la.size, float(lb.var(ddof=1)) / lb.size
    se = math.sqrt(va + vb)
    if se == 0:
        return ratio, ratio
    dof = (va + vb) ** 2 / (va**2 / (la.size - 1) + vb**2 / (lb.size - 1))
    half = _t_quantile(confidence, dof) * se
    return ratio * math.exp(-half), ratio * math.exp(half)


@dataclass(frozen=True)
class RatioEstimate:
    """A throughput ratio A/B with its 95% interval and the sample count behind it."""

    ratio: float
    ci95: tuple[float, float]
    samples: int


def paired_ratio(
    a_rates: Sequence[float], b_rates: Sequence[float], a_first: Sequence[bool] | None = None, confidence: float = 0.95
) -> RatioEstimate:
    """A/B from paired rounds (the two trials of one round ran next to each other).

    The estimate works on the per-round log-ratios, with a Student-t interval. Why t and not a
    bootstrap: a comparison typically rests on 3-20 rounds, where a percentile bootstrap has only
    a handful of distinct resamples and covers too rarely; the log-ratio of two throughputs is
    close to normal, and the t-interval is exact for normal data at any sample size.

    Drift common to both sides of a round cancels in its ratio, except for the part that comes
    from one side running a little later than the other: on a machine slowing down, the second
    trial of every round is slower. The interleaved schedule reverses the order every other round,
    so that part changes sign with the order. When ``a_first`` says which side ran first in each
    round and both orders occur, the log-ratios are regressed on +1 (A first) / -1 (B first), as
    the period effect of a crossover design: the intercept is the ratio free of it, and its
    interval (n - 2 degrees of freedom) leaves it out of the noise. Otherwise: the mean log-ratio
    with n - 1 degrees of freedom. With too few rounds for either there is no interval: it is
    the point itself, and nothing may be decided from it.
    """
    logs = np.log(np.asarray(a_rates, float) / np.asarray(b_rates, float))
    n = int(logs.size)
    order = None if a_first is None else np.where(np.asarray(a_first, bool), 1.0, -1.0)
    if order is not None and n >= 3 and np.ptp(order) > 0:
        design = np.column_stack([np.ones(n), order])
        coef, *_ = np.linalg.lstsq(design, logs, rcond=None)
        residual = logs - design @ coef
        dof = n - 2
        variance = float(residual @ residual) / dof if dof else 0.0
        center = float(coef[0])
        se = math.sqrt(variance * float(np.linalg.inv(design.T @ design)[0, 0])) if dof else 0.0
    else:
        center, dof = float(logs.mean()), n - 1
        se = float(logs.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    if dof < 1:
        return RatioEstimate(math.exp(center), (math.exp(center), math.exp(center)), n)
    half = _t_quantile(confidence, dof) * se
    return RatioEstimate(math.exp(center), (math.exp(center - half), math.exp(center + half)), n)


def ideal_half_width(sides: Sequence[tuple[float, float]], wall_s: float, confidence: float = 0.95) -> float:
    """The relative half-width of a two-sided ratio's interval had all of ``wall_s`` been counted
    steps, split evenly between the sides: each side given as (coefficient of variation of its
    step times, seconds a step), its log-rate's variance is cv^2 over the steps it would have
    timed, and the ratio's is their sum (a normal quantile: a design that counted every second
    would have its spread from thousands of steps)."""
    from scipy import stats as scipy_stats

    share = wall_s / len(sides)
    variance = sum(cv**2 * step_s / share for cv, step_s in sides if step_s > 0)
    return float(scipy_stats.norm.ppf(0.5 + confidence / 2)) * math.sqrt(variance)


@dataclass(frozen=True)
class Allocation:
    """How a lockstep run should spend its time, from what its pairs so far measured."""

    blocks: int
    #: variance of one round's log-ratio (one block of each side), within a pair
    within: float
    #: variance of a pair's log-ratio that no number of blocks removes (process to process)
    between: float
    startup_s: float
    round_s: float

    def describe(self) -> str:
        return (
            f"{self.blocks} rounds of blocks a pair: within-pair sd {math.sqrt(self.within):.2%} a round, "
            f"between-pair sd {math.sqrt(self.between):.2%}, {self.startup_s:.0f} s to open a pair, "
            f"{self.round_s:.1f} s a round"
        )


#: bounds of the rounds of blocks a pair is given: two for the ABBA order, and few enough that a
#: pair still ends within minutes on a slow side
MIN_BLOCKS, MAX_BLOCKS = 2, 40


def blocks_per_pair(
    round_logs: Sequence[Sequence[float]], startup_s: float, round_s: float, current: int | None = None
) -> Allocation | None:
    """The rounds of blocks per pair that narrow the interval fastest per second of machine time.

    A pair costs ``startup_s`` (start, prepare and warm up every side) plus ``b`` rounds of
    ``round_s``; its log-ratio varies as ``between + within / b``: the process-level part no block
    removes, and the rounds' part, averaged over ``b`` rounds. In a fixed time ``T`` the pairs
    number ``T / (startup_s + b round_s)``, so the variance of their mean is proportional to
    ``(between + within / b) (startup_s + b round_s)``, least at ``b = sqrt(within startup_s /
    (between round_s))`` (the optimum of two-stage sampling). ``round_logs`` holds each pair's
    per-round log-ratios; ``within`` is their pooled variance about each pair's mean, ``between``
    the variance of the pairs' means less ``within / b``. None with fewer than 3 pairs, or too
    few rounds to say.

    Variances from a handful of pairs are rough (the between-pair one is often estimated as 0, which
    alone would ask for the longest pairs), and fewer, longer pairs leave the t-interval fewer
    degrees of freedom, which the formula does not see: so from ``current`` rounds a pair the
    choice moves at most twofold at a time."""
    pairs = [np.asarray(logs, float) for logs in round_logs if len(logs) >= 2]
    if len(pairs) < 3 or startup_s <= 0 or round_s <= 0:
        return None
    dof = sum(p.size - 1 for p in pairs)
    within = float(sum(((p - p.mean()) ** 2).sum() for p in pairs)) / dof
    rounds = float(np.mean([p.size for p in pairs]))
    between = max(0.0, float(np.var([p.mean() for p in pairs], ddof=1)) - within / rounds)
    if between == 0.0:
        best = MAX_BLOCKS  # no process-level spread seen: longer pairs cost nothing in precision
    else:
        best = round(math.sqrt(within * startup_s / (between * round_s)))
    if current is not None:
        best = min(max(best, math.ceil(current / 2)), 2 * current)
    # an even number: the A B | B A order then balances which side runs first inside every pair,
    # so the pairs' ratios need no order term (``compare``)
    best = 2 * math.ceil(min(MAX_BLOCKS, max(MIN_BLOCKS, best)) / 2)
    return Allocation(best, within, between, startup_s, round_s)


@dataclass(frozen=True)
class Spending:
    """How a run that stops once it decides spends its error over its looks (one look after each
    pair of processes or round, from ``first`` to ``last`` samples): repeated confidence
    intervals whose *simultaneous* coverage over every look is ``1 - error``, so that the
    procedure as a whole decides wrongly at most ``error`` of the time, however many looks it
    takes (a wrong verdict needs one look's interval to miss the truth).

    Each look reads a Student-t interval over the samples so far at its own confidence: look
    ``k`` (``k - first`` from 0) is given the share ``((k + 1)^2 - k^2) / n^2`` of ``scale *
    error`` (``n`` looks). The quadratic shape saves the error for the late looks, where a
    t-interval has the degrees of freedom to decide (at three samples its multiplier is 4.3 at
    95%, and a look there decides next to never); ``scale`` is the largest factor for which the
    looks' intervals still cover the truth together at least ``1 - error`` of the time, found by
    simulating normal samples (``calibrated_scale``): the looks of one run share their samples, so
    they miss together, and a union bound (``scale`` 1) would leave most of the error unspent.
    The t-statistic's joint law over the looks depends on neither the mean nor the spread, so one
    simulation holds for every run with the same looks.

    ``last`` is the number of samples that fit the run's budget, fixed at its first look from the
    pace of its first samples (which the ratio does not move) and never changed: a plan that
    moved with the data would lose the guarantee. A look past ``last`` spends nothing."""

    first: int
    last: int
    error: float = 0.05

    def error_at(self, samples: int) -> float:
        """The error the look after ``samples`` samples may spend (0: that look cannot decide)."""
        if not self.first <= samples <= self.last:
            return 0.0
        return min(0.5, calibrated_scale(self.first, self.last, self.error) * self.error * _share(self.first, self.last, samples))

    def confidence_at(self, samples: int) -> float:
        return 1 - self.error_at(samples)

    def plan(self) -> SpendingPlan:
        """What a record keeps of it."""
        return SpendingPlan(self.first, self.last, self.error, self.describe())

    def describe(self) -> str:
        return (
            f"repeated intervals over the looks at {self.first} to {self.last} samples, "
            f"{1 - self.error:.0%} simultaneous coverage (simulated), error saved for the late looks"
        )


def _share(first: int, last: int, samples: int) -> float:
    k, looks = samples - first, last - first + 1
    return ((k + 1) ** 2 - k**2) / looks**2


#: numbers simulated to calibrate a spending plan (paths x looks), and their seed (fixed: a plan
#: is a constant); a plan is held to its error less three standard errors of the simulation
CALIBRATION_SIZE = 8_000_000
CALIBRATION_SEED = 20261207


@functools.lru_cache(maxsize=64)
def calibrated_scale(first: int, last: int, error: float = 0.05) -> float:
    """The largest factor on the looks' error shares for which the repeated t-intervals of normal
    samples, looked at after ``first`` .. ``last`` samples, all cover the mean together at least
    ``1 - error`` of the time (bisection over ``CALIBRATION_PATHS`` simulated runs). At least 1:
    the union bound alone guarantees that much."""
    from scipy import stats as scipy_stats

    paths = max(20_000, min(200_000, CALIBRATION_SIZE // last))
    target = error - 3 * math.sqrt(error * (1 - error) / paths)
    rng = np.random.default_rng(CALIBRATION_SEED)
    x = rng.standard_normal((paths, last))
    counts = np.arange(1, last + 1)
    means = np.cumsum(x, axis=1) / counts
    variances = (np.cumsum(x * x, axis=1) - counts * means**2) / np.maximum(counts - 1, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(means) / np.sqrt(variances / counts)
    looks = range(first, last + 1)

    def misses(scale: float) -> float:
        missed = np.zeros(paths, bool)
        for k in looks:
            spent = min(0.5, scale * error * _share(first, last, k))
            missed |= t[:, k - 1] > scipy_stats.t.ppf(1 - spent / 2, k - 1)
        return float(missed.mean())

    low, high = 1.0, 1.0 / (error * _share(first, last, last))  # high: the last look alone spends all
    for _ in range(25):
        middle = (low + high) / 2
        low, high = (middle, high) if misses(middle) <= target else (low, middle)
    return low


#: the fewest samples (pairs or rounds) at which a look may spend error: with two, a t-interval
#: has one degree of freedom (a multiplier of 12.7 at 95%) and decides next to never
FIRST_SPENDING_LOOK = 3


def spending_for(budget_s: float | None, sample_s: float, round_limit: int, error: float = 0.05) -> Spending:
    """The spending plan of an ``until`` run, fixed at its first look: its looks end with the
    samples that fit its time budget at the pace of its samples so far (at most the round limit)."""
    fit = round_limit if budget_s is None or sample_s <= 0 else math.floor(budget_s / sample_s)
    return Spending(FIRST_SPENDING_LOOK, max(FIRST_SPENDING_LOOK, min(round_limit, fit)), error)


def sequential_confidence(look: int, error: float = 0.05) -> float:
    """The confidence of an interval read at the ``look``-th look (1, 2, ...) of a run that stops as
    soon as one decides: look k may spend error / (k (k + 1)) of the error, and these sum to exactly
    ``error`` over any number of looks, so the procedure as a whole decides wrongly at most that
    often (a union bound). A fixed 95% interval read after every round would not: at a tolerance
    bound it decides wrongly about one time in six over 40 looks (simulated)."""
    return 1 - error / (look * (look + 1))


@dataclass(frozen=True)
class Trend:
    """Least-squares slope of images/sec against round index, relative to the mean per round."""

    slope_per_round: float
    p_value: float
    rounds: int

    @property
    def change_over_run(self) -> float:
        """The fitted change in images/sec from the first round to the last, relative to the mean."""
        return self.slope_per_round * (self.rounds - 1)

    @property
    def significant(self) -> bool:
        # both tests: with steady busy-wait steps, p < 0.05 still comes one run in twenty, on
        # slopes of a few hundredths of a percent -- a drift no comparison would notice
        return self.p_value < TREND_P_VALUE and abs(self.change_over_run) >= TREND_MIN_CHANGE


#: a trend with a two-sided p-value below this is reported as drift ...
TREND_P_VALUE = 0.05
#: ... if its fitted change over the run is at least this (1%: a third of the default tolerance)
TREND_MIN_CHANGE = 0.01
#: rounds before a trend is tested at all
TREND_MIN_ROUNDS = 4


def trend(rounds: Sequence[int], rates: Sequence[float]) -> Trend | None:
    """The drift of one run's trials over rounds (None with too few rounds to test)."""
    x, y = np.asarray(rounds, float), np.asarray(rates, float)
    if x.size < TREND_MIN_ROUNDS or np.ptp(x) == 0:
        return None
    from scipy import stats as scipy_stats

    fit = scipy_stats.linregress(x, y)
    p_value = float(fit.pvalue) if math.isfinite(fit.pvalue) else 1.0
    return Trend(float(fit.slope / y.mean()), p_value, int(x.size))
