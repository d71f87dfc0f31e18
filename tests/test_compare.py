"""`accelbench compare`: ratios, intervals and equivalence verdicts on runs of known speed."""

import json

import pytest

from accelbench.compare import Run, compare, exit_code, verdict
from conftest import load_records


def sleepy_record(scale: float = 1.0, noise: float = 0.0, seed: int = 0, steps: int = 40, trials: int = 1,
                  step_ms: float = 5) -> dict:
    from accelbench import records, runner
    from accelbench.config import RunConfig
    from accelbench.registry import PluginHost

    [ref] = PluginHost().select(backends=["sleepy:fixed-time"])
    config = RunConfig(warmup_steps=2, timed_steps=steps, trials=trials, seed=seed,
                       options={"step_ms": step_ms, "scale": scale, "noise": noise})
    [record] = runner.execute(runner.plan([ref], config), records.check_all)
    return record


@pytest.fixture(autouse=True)
def _testplugins_on_path(testplugins_path, monkeypatch):
    monkeypatch.syspath_prepend(str(testplugins_path))


# 2% from each edge of the 3% band: a verdict on the edge is the fixed-interval test's below
@pytest.mark.parametrize("scale, expected", [(1.00, "within"), (1.01, "within"), (1.05, "outside"), (0.95, "outside")])
def test_verdicts_on_known_ratios(scale, expected):
    # the other backend's step takes `scale` times as long, so base / other = scale; two separate
    # runs of 5 trials each: unpaired, bootstrap over trials. Steps of 20 ms: the OS preempting a
    # worker for a few ms on a loaded 2-core CI machine moves a 0.4 s trial by under 1%; 5 trials
    # a side, so one slow trial cannot stretch the interval past the band (3 once did, at 1.01)
    base = sleepy_record(trials=5, steps=20, step_ms=20)
    other = sleepy_record(scale=scale, trials=5, steps=20, step_ms=20)
    [result] = compare([Run("base", base), Run("other", other)], tolerance=0.03)
    assert result.ratio == pytest.approx(base["throughput"]["images_per_sec"] / other["throughput"]["images_per_sec"])
    assert result.ratio == pytest.approx(scale, rel=0.01)
    assert result.ci95[0] <= result.ratio <= result.ci95[1]
    assert result.verdict == expected, (result.ratio, result.ci95)
    assert result.analysis == "unpaired bootstrap over trials"


def test_large_noise_is_undecided_never_a_false_within():
    verdicts = []
    for seed in range(3):
        noisy = sleepy_record(scale=1.05, noise=0.5, seed=seed, steps=10)
        [result] = compare([Run("base", sleepy_record(noise=0.5, seed=seed + 10, steps=10)),
                            Run("noisy", noisy)], tolerance=0.03)
        verdicts.append(result.verdict)
        assert "one trial per side" in result.note
    assert verdicts == ["undecided"] * 3


def test_trials_are_the_bootstrap_unit_when_there_are_several():
    [result] = compare([Run("a", sleepy_record(trials=3, steps=10)), Run("b", sleepy_record(trials=3, steps=10))], 0.03)
    assert result.samples == "3 vs 3 trials"


@pytest.mark.parametrize("point, ci, expected", [
    (1.0, (0.99, 1.01), "within"), (1.05, (1.04, 1.06), "outside"), (0.95, (0.94, 0.96), "outside"),
    (1.02, (1.0, 1.04), "undecided"), (0.97, (0.95, 0.99), "undecided"),
])
def test_verdict_rules(point, ci, expected):
    assert verdict(point, ci, 0.03, 10, "trials")[0] == expected


def test_undecided_says_how_many_more_samples():
    decision, note = verdict(1.01, (0.98, 1.04), 0.03, 10, "trials")
    # half-width 0.03, margin 0.02: (0.03/0.02)^2 x 10 = 22.5 -> 23 samples, 13 more
    assert decision == "undecided" and note == "about 13 more trials would likely decide it"


def test_exit_codes_gate_on_the_worst_verdict():
    def result(v):
        return type("R", (), {"verdict": v})()
    assert exit_code([result("within")]) == 0
    assert exit_code([result("within"), result("undecided")]) == 3
    assert exit_code([result("undecided"), result("outside")]) == 1


def test_cli_compare_two_files_json_and_exit_code(accelbench_cli, tmp_path):
    # 20 ms steps and 10% apart: a few ms of preemption on a loaded CI machine (5 ms steps, 5%
    # apart) once left the verdict undecided
    for name, scale in (("a", 1.0), ("b", 1.10)):
        done = accelbench_cli("run", "--plugin", "sleepy", "--warmup-steps", "2", "--timed-steps", "20", "--trials", "3",
                              "--option", "step_ms=20", "--option", f"scale={scale}", "-o", str(tmp_path / f"{name}.json"))
        assert done.returncode == 0, done.stderr
    result = accelbench_cli("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--tolerance", "3%", "--json")
    assert result.returncode == 1, result.stderr
    [comparison] = json.loads(result.stdout)["comparisons"]
    assert comparison["a"] == "sleepy:fixed-time [a.json]" and comparison["verdict"] == "outside"
    assert comparison["ratio"] == pytest.approx(1.10, rel=0.02)
    table = accelbench_cli("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--tolerance", "3%")
    assert "outside" in table.stdout and table.returncode == 1


def test_compare_refuses_files_without_pairs(accelbench_cli, tmp_path):
    out = tmp_path / "a.json"
    accelbench_cli("run", "--plugin", "sleepy", "--timed-steps", "3", "-o", str(out))
    result = accelbench_cli("compare", str(out), "--tolerance", "3%")
    assert result.returncode == 2 and "no two ok runs share a config" in result.stderr
    bad = accelbench_cli("compare", str(out), str(out), "--tolerance", "3 percent")
    assert bad.returncode == 2 and "--tolerance must be like 3%" in bad.stderr
    assert len(load_records(out)) == 1
