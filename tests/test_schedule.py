"""Interleaved trials, paired ratios and runs that stop when decided, on a simulated drifting machine.

The drifting clock: the test backends' step time grows by ``drift_per_s`` of itself per second of
wall time since ``drift_origin`` (one origin for every worker of a test), as on a machine that
slows down steadily. Two backends of identical true speed must then still compare as equal.
"""

import json
import math
import re
import time

import numpy as np
import pytest
from conftest import load_records

from accelbench.analysis import stats
from accelbench.analysis.compare import Run, compare
from accelbench.errors import UsageError
from accelbench.execution import schedule

# 0.4 s trials: at 0.1 s (5 ms steps) a 2-core Zen 3 VM's few-ms stalls moved single trials by
# 5-10% and left a true 1.00 undecided and a true 1.10 undecided for 17 looks
FAST = ("--warmup-steps", "2", "--timed-steps", "20", "--option", "step_ms=20")


@pytest.fixture(autouse=True)
def _testplugins_on_path(testplugins_path, monkeypatch):
    monkeypatch.syspath_prepend(str(testplugins_path))


def twin_run(accelbench_cli, tmp_path, *args, name="run.json"):
    """Run the fixed-time backend and its twin in one invocation, in interleaved rounds unless
    ``args`` name another schedule (lockstep, the default for two runs, has tests of its own in
    test_lockstep.py); their records and the CLI result."""
    out = tmp_path / name
    schedule = () if "--schedule" in args else ("--schedule", "interleaved")
    result = accelbench_cli("run", "--plugin", "sleepy", "--plugin", "twin", *FAST, *schedule, *args, "-o", str(out))
    assert result.returncode == 0, result.stderr
    return load_records(out), result


def drifting(rate: float = 0.03) -> tuple[str, ...]:
    return ("--option", f"drift_per_s={rate}", "--option", f"drift_origin={time.time()}")


def paired(records):
    """The comparison of two records read from a results file."""
    from accelbench.records.results import Record

    [result] = compare([Run("a", Record.from_json(records[0])), Run("b", Record.from_json(records[1]))], tolerance=0.03)
    return result


def test_interleaved_rounds_reverse_the_order_every_other_round():
    order = list(schedule.slots(schedule.Schedule(rounds=4), 2))
    assert order == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1), (3, 1), (3, 0)]
    assert schedule.round_order(3, 1) == [2, 1, 0]
    sequential = list(schedule.slots(schedule.Schedule(kind="sequential", rounds=2), 2))
    assert sequential == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_paired_ratio_is_a_t_interval_on_log_ratios():
    a, b = [100.0, 104.0, 98.0, 101.0], [99.0, 100.0, 99.0, 100.0]
    logs = np.log(np.array(a) / np.array(b))
    half = 3.182446305284263 * logs.std(ddof=1) / 2  # t(0.975, 3 degrees of freedom) x s / sqrt(4)
    estimate = stats.paired_ratio(a, b)
    assert estimate.ratio == pytest.approx(math.exp(logs.mean()))
    assert estimate.ci95 == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert stats.paired_ratio([100.0], [99.0]).ci95 == pytest.approx((100 / 99, 100 / 99))


def test_repeated_looks_spend_five_percent_in_all():
    looks = [stats.sequential_confidence(k) for k in range(1, 100_001)]
    assert looks[0] == pytest.approx(0.975) and looks[1] == pytest.approx(1 - 0.05 / 6)
    assert sum(1 - c for c in looks) == pytest.approx(0.05, rel=1e-4)  # the error, over any number of looks
    wide = stats.paired_ratio([1.0, 1.1, 1.05], [1.0, 1.0, 1.0], confidence=0.99)
    narrow = stats.paired_ratio([1.0, 1.1, 1.05], [1.0, 1.0, 1.0])
    assert wide.ci95[0] < narrow.ci95[0] and narrow.ci95[1] < wide.ci95[1]


def test_paired_ratio_removes_the_order_effect_of_alternating_rounds():
    # equal speeds, but whoever runs second in a round is 2% slower (a machine slowing down)
    a_first = [True, False, True, False, True, False]
    a = [100.0 if first else 98.0 for first in a_first]
    b = [98.0 if first else 100.0 for first in a_first]
    plain = stats.paired_ratio(a, b)
    assert plain.ci95[0] < 0.99 and plain.ci95[1] > 1.01  # the alternation counted as noise
    adjusted = stats.paired_ratio(a, b, a_first)
    assert adjusted.ratio == pytest.approx(1.0) and adjusted.ci95 == pytest.approx((1.0, 1.0))
    noisy = [x * f for x, f in zip(a, (1.01, 0.99, 1.0, 1.005, 0.995, 1.0))]
    estimate = stats.paired_ratio(noisy, b, a_first)
    assert estimate.ci95[0] < estimate.ratio < estimate.ci95[1] and estimate.ci95[1] - estimate.ci95[0] < 0.03


@pytest.mark.slow
def test_identical_backends_on_a_drifting_machine_compare_within(accelbench_cli, tmp_path):
    records, _ = twin_run(accelbench_cli, tmp_path, "--trials", "6", *drifting())
    assert {r["schedule"]["run_id"] for r in records} == {records[0]["schedule"]["run_id"]}
    assert [t["round"] for t in records[0]["trials"]] == list(range(6))
    assert [t["position"] for t in records[0]["trials"]] == [0, 1, 0, 1, 0, 1]  # the order reversed each round
    assert [t["position"] for t in records[1]["trials"]] == [1, 0, 1, 0, 1, 0]
    result = paired(records)
    # the order of each round is read from the positions, not the clock: one start time for every
    # trial leaves the same answer (by start times, A would never have run first)
    same_start = [{**r, "trials": [{**t, "started_utc": "2026-01-01T00:00:00.000Z"} for t in r["trials"]]} for r in records]
    assert (paired(same_start).ratio, paired(same_start).ci95) == (result.ratio, result.ci95)
    assert result.analysis.startswith("paired rounds") and result.samples == "6 paired rounds"
    # not "1.0 lies in the interval": a 95% interval misses the truth one run in twenty by design,
    # so that is a property of many runs; one run can hold the estimate to the truth
    assert result.ratio == pytest.approx(1.0, abs=0.01), result
    assert result.verdict == "within", result


@pytest.mark.slow
def test_the_sequential_schedule_puts_the_drift_into_the_ratio(accelbench_cli, tmp_path):
    # the old order: all of A's trials, then all of B's; B ran later on a slower machine
    records, _ = twin_run(accelbench_cli, tmp_path, "--trials", "6", "--schedule", "sequential", *drifting())
    result = paired(records)
    assert result.analysis == "unpaired trials (Welch t-interval on log-rates)"
    assert result.ratio > 1.03 and result.ci95[0] > 1.0, result
    assert result.verdict != "within"


@pytest.mark.slow
def test_a_backend_five_percent_slower_is_outside(accelbench_cli, tmp_path):
    # 10 rounds, not 6: on a 2-core Zen 3 VM two of six pairs came out near 1.01, leaving the
    # interval over 1.03 undecided (the estimate itself was 1.05); ten pairs tighten it by a fifth
    records, _ = twin_run(accelbench_cli, tmp_path, "--trials", "10", "--option", "twin_scale=1.05", *drifting())
    result = paired(records)
    assert result.ratio == pytest.approx(1.05, rel=0.015)
    assert result.verdict == "outside", result


@pytest.mark.slow
def test_heavy_noise_never_gives_a_false_within(accelbench_cli, tmp_path):
    # the twin is 6% slower, outside the 3% tolerance: "within" would be false. (A true ratio inside
    # the tolerance, as 1.02 once was here, makes "within" correct, and 4 noisy rounds leave an
    # interval that is now and then narrow by chance: CI once drew one, 0.995-1.008, for a 0.980.)
    records, _ = twin_run(
        accelbench_cli, tmp_path, "--trials", "4", "--option", "twin_scale=1.06", "--option", "noise=0.4", *drifting()
    )
    assert paired(records).verdict in ("undecided", "outside")


@pytest.mark.slow
def test_one_trial_per_side_is_never_decided(accelbench_cli, tmp_path):
    records, _ = twin_run(accelbench_cli, tmp_path, "--option", "twin_scale=1.10")
    result = paired(records)
    assert result.verdict == "undecided" and "one round" in result.note
    unpaired = [{**r, "schedule": {**r["schedule"], "run_id": str(i)}} for i, r in enumerate(records)]
    result = paired(unpaired)
    assert result.analysis == "unpaired bootstrap over timed steps"
    assert result.verdict == "undecided" and "one trial per side" in result.note


@pytest.mark.slow
def test_until_decided_stops_as_soon_as_the_answer_is_known(accelbench_cli, tmp_path):
    records, result = twin_run(
        accelbench_cli, tmp_path, "--until-decided", "3%", "--max-time", "120", "--option", "twin_scale=1.10"
    )
    block = records[0]["schedule"]
    assert block["stop_reason"].startswith("decided: ") and "outside" in block["stop_reason"]
    assert block["stop_rule"] == "every comparison decided at ±3.0%"
    # the first look comes after three rounds (two give a t-interval one degree of freedom), then
    # one per round: it stopped at the look that decided, within a few (0.4 s trials on a shared
    # 2-core machine vary by a few %)
    found = re.search(r"CI at look (\d+) after (\d+) rounds", block["stop_reason"])
    look, rounds = int(found.group(1)), int(found.group(2))
    assert look <= 4 and rounds == look + 2
    assert block["rounds"] == len(records[0]["trials"]) == len(records[1]["trials"]) == rounds
    assert block["spending"]["first"] == 3 and block["confidence"] < 1
    assert "stopped: decided" in result.stdout and "outside" in result.stdout


@pytest.mark.slow
def test_until_decided_respects_the_time_budget(accelbench_cli, tmp_path):
    started = time.monotonic()
    # the first look comes after --trials rounds: 1000 cannot fit in 4 s, so only the budget can
    # stop it (noisy equal speeds could, rarely, be decided at an early look: 5% error is allowed)
    records, _ = twin_run(
        accelbench_cli, tmp_path, "--until-decided", "3%", "--max-time", "4s", "--trials", "1000", "--option", "noise=0.5"
    )
    elapsed = time.monotonic() - started
    block = records[0]["schedule"]
    assert block["stop_reason"] == "time budget of 4 s spent before the answer was decided"
    assert 4 <= block["elapsed_s"] < 4 + 3 and elapsed < 30
    assert block["rounds"] >= 2


@pytest.mark.slow
def test_until_halfwidth_reaches_the_requested_precision(accelbench_cli, tmp_path):
    records, _ = twin_run(accelbench_cli, tmp_path, "--until-halfwidth", "2%", "--max-time", "60", "--option", "noise=0.03")
    assert records[0]["schedule"]["stop_reason"].startswith("precise: ")
    result = paired(records)
    assert max(result.ratio - result.ci95[0], result.ci95[1] - result.ratio) / result.ratio <= 0.02


@pytest.mark.slow
def test_a_drifting_run_warns_of_its_trend(accelbench_cli, tmp_path):
    records, _ = twin_run(accelbench_cli, tmp_path, "--trials", "6", *drifting(0.2))
    trend = records[0]["throughput"]["trend"]
    assert trend["rounds"] == 6 and trend["slope_per_round"] < 0 and trend["p_value"] < 0.05
    assert any("trended" in w and "drifted" in w for w in records[0]["warnings"])


@pytest.mark.parametrize(
    "rates, warned",
    [
        ([100.0, 99.0, 98.0, 97.0, 96.0, 95.0], True),  # -1% a round, 5% in all
        ([100.0, 99.99, 99.98, 99.97, 99.96, 99.95], False),  # as steady a fit, 0.05% in all
        ([100.0, 102.0, 99.0, 101.0, 100.0, 98.0], False),  # noise, no slope
        ([100.0, 99.0, 98.0], False),  # too few rounds to test
    ],
)
def test_only_a_significant_drift_of_at_least_one_percent_warns(rates, warned):
    found = stats.trend(range(len(rates)), rates)
    assert (found is not None and found.significant) is warned
    if found is not None:
        assert found.change_over_run == pytest.approx((rates[-1] - rates[0]) / np.mean(rates), rel=0.3)


@pytest.mark.slow
def test_cli_compare_reads_the_pairing_from_one_file(accelbench_cli, tmp_path):
    # 4 rounds, not 3: the order correction leaves 3 rounds one degree of freedom (t = 12.7), so a
    # 1% wobble on a shared machine could leave even a 10% gap undecided
    twin_run(accelbench_cli, tmp_path, "--trials", "4", "--option", "twin_scale=1.10")
    result = accelbench_cli("compare", str(tmp_path / "run.json"), "--tolerance", "3%", "--json")
    assert result.returncode == 1, result.stderr
    [comparison] = json.loads(result.stdout)["comparisons"]
    assert comparison["analysis"] == "paired rounds (t-interval on log-ratios, order effect removed)"
    assert comparison["samples"] == "4 paired rounds" and comparison["verdict"] == "outside"
    assert comparison["ratio"] == pytest.approx(1.10, rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (("--until-decided", "3 percent"), "--until-decided must be like 3% or 0.03"),
        (("--until-decided", "0%"), "--until-decided must be between 0 and 100%"),
        (("--until-decided", "3%", "--until-halfwidth", "1%"), "give one of --until-decided and --until-halfwidth"),
        (("--until-decided", "3%", "--schedule", "sequential"), "need paired trials: --schedule lockstep or interleaved"),
        (("--max-time", "soon"), "--max-time must be a duration like 300, 90s, 5m or 1h"),
        (("--max-time", "0"), "--max-time must be more than 0 seconds"),
    ],
)
def test_bad_schedule_input_is_one_line_and_exit_2(accelbench_cli, tmp_path, args, message):
    out = tmp_path / "never.json"
    result = accelbench_cli("run", "--plugin", "sleepy", "--plugin", "twin", *args, "-o", str(out))
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1
    assert not out.exists()


def test_until_decided_needs_two_runs(accelbench_cli, tmp_path):
    result = accelbench_cli("run", "--plugin", "sleepy", "--until-decided", "3%", "-o", str(tmp_path / "x.json"))
    assert result.returncode == 2 and "select at least two" in result.stderr


@pytest.mark.parametrize("text, seconds", [("300", 300), ("90s", 90), ("5m", 300), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert schedule.parse_duration(text, "--max-time") == seconds
    with pytest.raises(UsageError):
        schedule.parse_duration("inf", "--max-time")
