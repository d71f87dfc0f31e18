"""Lockstep in the product: warm workers taking turns in blocks, pairs of processes as the unit of
the interval, and the busy-machine guard -- on backends of known step time (the test plugins),
a simulated drifting clock, and a real CPU hog that these tests start beside the run."""

import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import pytest
from conftest import interrupt_as_from_a_terminal, load_records

from accelbench.analysis import report, stats
from accelbench.analysis.compare import Run, busy_pairs, compare, runs_of
from accelbench.cli.console import ComparisonTable, ResultsTable
from accelbench.execution import busy, lockstep
from accelbench.records.results import Record

#: 20 ms steps in 0.2 s blocks: a pair of the test backends takes about 3 s
QUICK = ("--option", "step_ms=20", "--warmup-steps", "3", "--block-time", "0.2s", "--blocks", "4")


@pytest.fixture(autouse=True)
def _testplugins_on_path(testplugins_path, monkeypatch):
    monkeypatch.syspath_prepend(str(testplugins_path))


def lockstep_run(accelbench_cli, tmp_path, *args, name="run.json", check=True):
    out = tmp_path / name
    result = accelbench_cli("run", "--plugin", "sleepy", "--plugin", "twin", *QUICK, *args, "-o", str(out))
    if check:
        assert result.returncode == 0, result.stderr
    return (load_records(out) if out.exists() else []), result


def drifting(rate: float = 0.03) -> tuple[str, ...]:
    return ("--option", f"drift_per_s={rate}", "--option", f"drift_origin={time.time()}")


def compared(records, tolerance=0.03):
    """The comparison of the records of a results file."""
    [result] = compare(runs_of([Record.from_json(r) for r in records]), tolerance=tolerance)
    return result


@pytest.fixture
def cpu_hog():
    """A busy-looping process on every CPU this test may use, outside the run's process tree (the
    run is started by the test, the hogs beside it): what a user's other job does to a shared box."""
    hogs = []

    def start():
        for cpu in sorted(os.sched_getaffinity(0)):
            hogs.append(subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"]))
        time.sleep(0.3)

    yield start
    for hog in hogs:
        hog.kill()
        hog.wait()


@pytest.mark.slow
def test_two_runs_are_compared_in_lockstep_by_default(accelbench_cli, tmp_path):
    records, result = lockstep_run(accelbench_cli, tmp_path, "--trials", "3")
    schedule = records[0]["schedule"]
    assert schedule["kind"] == "lockstep" and schedule["rounds"] == 3
    settings = {key: schedule["lockstep"][key] for key in ("blocks_per_pair", "block_s", "when_busy", "busy_share")}
    assert settings == {"blocks_per_pair": 4, "block_s": 0.2, "when_busy": "wait", "busy_share": busy.BUSY_SHARE}
    # every second of the run accounted for: its parts add up to the run's wall time
    split = schedule["lockstep"]["time"]
    parts = [value for key, value in split.items() if key != "wall_s"]
    assert sum(parts) == pytest.approx(split["wall_s"], rel=1e-6) and split["other_s"] >= 0
    assert split["counted_s"] == pytest.approx(sum(t["wall_time_s"] for r in records for t in r["trials"]), rel=1e-6)
    assert split["wall_s"] == pytest.approx(schedule["elapsed_s"], abs=0.5)
    assert 0 < schedule["lockstep"]["efficiency"]["efficiency"] <= 1
    for record in records:
        assert [t["round"] for t in record["trials"]] == [0, 1, 2]
        for trial in record["trials"]:
            blocks = trial["blocks"]
            assert [b["round"] for b in blocks] == [0, 1, 2, 3] and all(b["counted"] for b in blocks)
            # a block is whole 20 ms steps filling about 0.2 s; the trial's figures are its blocks'
            assert all(b["steps"] == 10 and b["seconds"] == pytest.approx(0.2, rel=0.2) for b in blocks)
            assert trial["images"] == 8 * sum(b["steps"] for b in blocks)
            assert trial["wall_time_s"] == pytest.approx(sum(b["seconds"] for b in blocks))
            assert all(b["foreign_share"] is not None and 0 <= b["foreign_share"] < 1 for b in blocks)
    # the side that blocks first alternates from pair to pair (its sides start at once); within a pair, ABBA
    assert [t["position"] for t in records[0]["trials"]] == [0, 1, 0]  # what compare reads of that order
    assert [t["position"] for t in records[1]["trials"]] == [1, 0, 1]
    a0, b0 = records[0]["trials"][0]["blocks"], records[1]["trials"][0]["blocks"]
    assert a0[0]["started_s"] < b0[0]["started_s"] < b0[1]["started_s"] < a0[1]["started_s"] < a0[2]["started_s"]
    assert "accelbench results (lockstep, 3 pairs)" in result.stdout
    assert "by pair:" in result.stdout


@pytest.mark.slow
def test_blocks_are_timed_in_the_worker_and_the_idle_side_is_parked(accelbench_cli, tmp_path):
    # 20 ms steps: images/sec is 8 / 0.020 = 400 when the blocks time only the steps (no pipe,
    # no parking); a side that kept running while parked would show CPU time during the other's blocks
    records, _ = lockstep_run(accelbench_cli, tmp_path, "--trials", "2")
    for record in records:
        assert record["throughput"]["images_per_sec"] == pytest.approx(400, rel=0.03)
        for trial in record["trials"]:
            # the worker's CPU during its timed blocks is its blocks' wall time: it spins only then
            assert trial["process"]["cpu_user_s"] + trial["process"]["cpu_system_s"] == pytest.approx(
                trial["wall_time_s"], rel=0.15
            )
    # on a quiet machine a block starts as soon as the other side's ends and its worker has settled
    # (about 52 ms apart here): the one just run is the latest watch of the machine, so the run does
    # not watch it again (a fifth of QUIET_CHECK_S) before each block
    for pair in range(2):
        blocks = sorted((b for r in records for b in r["trials"][pair]["blocks"]), key=lambda b: b["started_s"])
        gaps = [b["started_s"] - (a["started_s"] + a["seconds"]) for a, b in zip(blocks, blocks[1:])]
        assert statistics.median(gaps) < lockstep.SETTLE_S + busy.QUIET_CHECK_S * 0.2 / 2, gaps


@pytest.mark.slow
def test_identical_backends_on_a_drifting_machine_compare_within(accelbench_cli, tmp_path):
    records, result = lockstep_run(
        accelbench_cli, tmp_path, "--until-decided", "3%", "--max-time", "120", "--option", "noise=0.02", *drifting()
    )
    comparison = compared(records)
    assert comparison.analysis.startswith("lockstep pairs of processes")
    assert comparison.verdict == "within", comparison
    assert records[0]["schedule"]["stop_reason"].startswith("decided: ")
    assert "stopped: decided" in result.stdout


@pytest.mark.slow
def test_lockstep_decides_where_rounds_in_the_same_time_cannot(accelbench_cli, tmp_path):
    """Identical backends on a machine whose speed swings by 20% every 6 s (a neighbour's load
    coming and going), each process taking 0.5 s to prepare: rounds of fresh processes time their
    trials seconds apart, at other phases of the swing, and pay the start-up every trial; lockstep's
    blocks are a tenth of a second apart. On the 2-core Xeon VM (2026-12-06) lockstep decided
    ``within`` in 6-24 s (2-8 pairs, ten runs) and the test took 32-42 s (four runs); with a 3 s
    swing, whose curvature within a pair's blocks ABBA does not cancel, it needed 5-13 pairs and
    the test 54-179 s (CI). Rounds of the same time either run out of it undecided or, where a
    round's length locks its trials to the swing's phase (one side always timed nearer its crest),
    decide the wrong way: on 2026-12-06 they said ``outside`` at 0.793 (0.788-0.798)."""
    swing = (
        "--option",
        "step_ms=10",
        "--warmup-steps",
        "3",
        "--option",
        "noise=0.02",
        "--option",
        "wave=0.2",
        "--option",
        "wave_period_s=6",
        "--option",
        "prepare_s=0.5",
        "--option",
        f"drift_origin={time.time()}",
        "--until-decided",
        "3%",
    )
    out = tmp_path / "lockstep.json"
    done = accelbench_cli(
        "run",
        "--plugin",
        "sleepy",
        "--plugin",
        "twin",
        *swing,
        "--block-time",
        "0.1s",
        "--blocks",
        "4",
        "--max-time",
        "90",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    lockstep = load_records(out)
    assert lockstep[0]["schedule"]["stop_reason"].startswith("decided: ") and compared(lockstep).verdict == "within"
    spent = lockstep[0]["schedule"]["elapsed_s"]
    out = tmp_path / "rounds.json"
    done = accelbench_cli(
        "run",
        "--plugin",
        "sleepy",
        "--plugin",
        "twin",
        *swing,
        "--schedule",
        "interleaved",
        "--time",
        "0.4s",
        "--max-time",
        f"{spent:.1f}",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    rounds = load_records(out)
    stop = rounds[0]["schedule"]["stop_reason"]
    assert stop.startswith(("time budget", "decided: ")), stop
    # the backends are identical: rounds reach the truth (within) only where lockstep's edge is gone
    assert compared(rounds).verdict != "within", stop


@pytest.mark.slow
def test_a_true_five_percent_gap_is_outside(accelbench_cli, tmp_path):
    records, _ = lockstep_run(accelbench_cli, tmp_path, "--trials", "4", "--option", "twin_scale=1.05", *drifting())
    comparison = compared(records)
    assert comparison.ratio == pytest.approx(1.05, rel=0.015)
    assert comparison.verdict == "outside", comparison
    assert comparison.samples == "4 pairs (lockstep)" and len(comparison.per_unit) == 4


@pytest.mark.slow
def test_a_busy_machine_withholds_the_verdict_and_says_why(accelbench_cli, tmp_path, cpu_hog):
    cpu_hog()
    # a 10% gap that the quiet machine decides at once: beside the hog it must not be decided
    records, result = lockstep_run(accelbench_cli, tmp_path, "--trials", "3", "--when-busy", "go", "--option", "twin_scale=1.10")
    shares = [b["foreign_share"] for r in records for t in r["trials"] for b in t["blocks"]]
    assert min(shares) > busy.BUSY_SHARE, shares
    comparison = compared(records)
    assert comparison.verdict == "undecided"
    assert re.fullmatch(
        r"verdict withheld: the machine was busy: \d+% of CPU time went to other processes "
        r"during sleepy:fixed-time's blocks, \d+% during twin:fixed-time-twin's",
        comparison.note,
    ), comparison.note
    assert "the machine was busy during a block" in result.stderr  # the terminal warned meanwhile
    verdict = accelbench_cli("compare", str(tmp_path / "run.json"), "--tolerance", "3%", "--json")
    assert verdict.returncode == 3 and json.loads(verdict.stdout)["comparisons"][0]["busy"]
    # the report draws the pairs, each marked busy
    assert busy_pairs(Record.from_json(records[0])) == {0, 1, 2} and comparison.busy_units == [0, 1, 2]
    shown = accelbench_cli("report", str(tmp_path / "run.json"), "--out", str(tmp_path / "report"))
    assert shown.returncode == 0, shown.stderr
    assert (tmp_path / "report" / report.PAIRS_PNG).stat().st_size > 0
    assert "red cross" in (tmp_path / "report" / "index.html").read_text()


@pytest.mark.slow
def test_a_run_that_waits_for_quiet_gives_up_at_its_budget_without_a_verdict(accelbench_cli, tmp_path, cpu_hog):
    cpu_hog()
    started = time.monotonic()
    records, result = lockstep_run(accelbench_cli, tmp_path, "--until-decided", "3%", "--max-time", "6s", check=False)
    assert time.monotonic() - started < 60
    assert result.returncode == 0, result.stderr
    assert "waiting for it to quieten" in result.stderr
    stop = records[0]["schedule"]["stop_reason"]
    assert stop.startswith("time budget of 6 s spent waiting for a quiet machine"), stop
    assert "decided" not in result.stdout.splitlines()[-1]


@pytest.mark.slow
def test_a_busy_block_is_run_again_once_the_machine_is_quiet(accelbench_cli, tmp_path):
    """A hog that starts in the middle of one of the twin's blocks (the twin creates a file at its
    30th step, in a block of pair 1; the hog, outside the run, waits for it) and loads
    every CPU for 1.5 s: that block is kept in the record, not counted, and run again once the
    machine is quiet; every counted block was quiet."""
    flag = tmp_path / "flag"
    hog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.001)\n"
            "end = time.time() + 1.5\n"
            "pids = [os.fork() for _ in range(len(os.sched_getaffinity(0)) - 1)]\n"
            "while time.time() < end: pass\n",
            str(flag),
        ]
    )
    try:
        records, _ = lockstep_run(
            accelbench_cli, tmp_path, "--trials", "2", "--option", f"twin_flag_file={flag}", "--option", "twin_flag_at=30"
        )
    finally:
        hog.kill()
        hog.wait()
    blocks = [b for r in records for t in r["trials"] for b in t["blocks"]]
    assert all(b["foreign_share"] <= busy.BUSY_SHARE for b in blocks if b["counted"])
    twin_blocks = records[1]["trials"][0]["blocks"]
    busy_ones = [i for i, b in enumerate(twin_blocks) if not b["counted"]]
    assert len(busy_ones) == 1 and twin_blocks[busy_ones[0]]["foreign_share"] > busy.BUSY_SHARE, twin_blocks
    again = twin_blocks[busy_ones[0] + 1]  # the same round, run again once the machine was quiet
    assert again["counted"] and again["round"] == twin_blocks[busy_ones[0]]["round"]
    for record in records:
        for trial in record["trials"]:
            assert sum(b["counted"] for b in trial["blocks"]) == 4
            assert trial["images"] == 8 * sum(b["steps"] for b in trial["blocks"] if b["counted"])
    assert compared(records).busy == ""


@pytest.mark.slow
def test_a_side_that_dies_mid_lockstep_fails_alone_and_the_other_keeps_its_blocks(accelbench_cli, tmp_path):
    # the twin's process exits after 40 steps: in pair 1, after its warm-up and a few blocks
    records, result = lockstep_run(accelbench_cli, tmp_path, "--trials", "3", "--option", "twin_exit_after=40", check=False)
    assert result.returncode == 1  # a failed run, as in any schedule
    sleepy, twin = records
    assert twin["status"] == "failed" and "exited with code 3" in twin["reason"]
    assert len(twin["trials"]) == 1 and twin["trials"][0]["blocks"]  # the blocks it ran before it died
    # the other side kept the blocks of the pair the twin died in, and went on alone for the rest
    assert sleepy["status"] == "ok" and [t["round"] for t in sleepy["trials"]] == [0, 1, 2]
    kept = sleepy["trials"][0]["blocks"]
    assert kept and all(b["counted"] for b in kept)
    assert sleepy["trials"][0]["images"] == 8 * sum(b["steps"] for b in kept)
    assert records[0]["schedule"]["stop_reason"] == "every trial ran"


@pytest.mark.slow
def test_ctrl_c_mid_lockstep_keeps_the_finished_pairs(testplugins_path, tmp_path):
    out = tmp_path / "run.json"
    env = dict(os.environ, PYTHONPATH=str(testplugins_path))
    env.pop("ACCELBENCH_PLUGINS", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "accelbench",
            "run",
            "--plugin",
            "sleepy",
            "--plugin",
            "twin",
            *QUICK,
            "--trials",
            "50",
            "-o",
            str(out),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interrupt_as_from_a_terminal,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out.exists() and len(load_records(out)[0]["trials"]) >= 2):
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    records = load_records(out)
    assert len(records) == 2 and all(r["status"] == "ok" and len(r["trials"]) >= 2 for r in records)
    assert "kept 2 finished record(s)" in stderr


@pytest.mark.slow
def test_the_runs_last_line_and_compare_agree(accelbench_cli, tmp_path):
    records, result = lockstep_run(
        accelbench_cli, tmp_path, "--until-decided", "3%", "--max-time", "60", "--option", "twin_scale=1.08"
    )
    stop = records[0]["schedule"]["stop_reason"]
    assert stop.startswith("decided: ") and "outside" in stop
    schedule = records[0]["schedule"]
    confidence, plan = schedule["confidence"], schedule["spending"]
    assert confidence == pytest.approx(
        stats.Spending(plan["first"], plan["last"], plan["error"]).confidence_at(schedule["rounds"])
    )
    again = accelbench_cli("compare", str(tmp_path / "run.json"), "--tolerance", "3%", "--json")
    [comparison] = json.loads(again.stdout)["comparisons"]
    assert again.returncode == 1 and comparison["verdict"] == "outside"
    assert comparison["confidence"] == confidence  # the interval the run stopped on, not a fresh 95%
    assert f"{comparison['ci95'][0]:.3f}–{comparison['ci95'][1]:.3f}" in stop
    assert "outside" in result.stdout.split("accelbench comparison")[1]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--schedule", "lockstep", "--workers", "2"), "--schedule lockstep compares single-worker runs"),
        (("--schedule", "interleaved", "--blocks", "3"), "--blocks is a lockstep setting"),
        (("--when-busy", "never"), "'never' is not one of 'wait', 'go'"),
        (("--blocks", "0"), "--blocks"),
        (("--block-time", "soon"), "--block-time must be a duration"),
        (("--block-time", "1s", "--time", "10s"), "give one of --block-time and --time/--timed-steps"),
    ],
)
def test_bad_lockstep_input_is_one_line_and_exit_2(accelbench_cli, tmp_path, args, message):
    out = tmp_path / "never.json"
    result = accelbench_cli("run", "--plugin", "sleepy", "--plugin", "twin", *args, "-o", str(out))
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_names_print_verbatim_however_they_look(accelbench_cli, tmp_path):
    """A plugin's names, reasons and warnings are data: ``:b:`` is not an emoji code, ``[bold]`` not
    markup, in any console (this one has both on)."""
    import io

    from rich.console import Console

    records, _ = lockstep_run(accelbench_cli, tmp_path, "--trials", "2")
    odd = [
        {
            **r,
            "plugin": {**r["plugin"], "name": "abdrift"},
            "backend": {**r["backend"], "name": "b"},
            "warnings": ["[bold]not bold[/bold] :x: as written"],
        }
        for r in records
    ]
    odd[1] = {**odd[1], "backend": {**odd[1]["backend"], "name": "[red]c"}}
    odd = [Record.from_json(r) for r in odd]
    shown = io.StringIO()
    ResultsTable(odd).print(Console(file=shown, width=300))
    ComparisonTable(compare([Run("abdrift:b", odd[0]), Run("[red]c :smile:", odd[1])], 0.03), 0.03).print(
        Console(file=shown, width=300)
    )
    text = shown.getvalue()
    assert "abdrift:b: [bold]not bold[/bold] :x: as written" in text
    assert "abdrift:[red]c" in text and "[red]c :smile:" in text and "😄" not in text and "🅱" not in text


@pytest.mark.parametrize(
    "within_sd, between_sd, startup_s, round_s, best",
    [
        (0.04, 0.01, 40.0, 4.0, 13),  # rounds noisy, processes alike, start-up dear: long pairs
        (0.01, 0.03, 40.0, 4.0, 1),  # processes differ, rounds alike: the shortest pairs (ABBA: 2)
        (0.02, 0.02, 10.0, 10.0, 1),
    ],
)
def test_blocks_per_pair_is_the_two_stage_optimum_of_measured_variances(within_sd, between_sd, startup_s, round_s, best):
    """b* = sqrt(within * startup / (between * round)), from variances estimated on simulated pairs
    whose true spreads are known (many pairs, so the estimates sit near the truth)."""
    import numpy as np

    from accelbench.analysis import stats

    rng = np.random.default_rng(7)
    rounds = 8
    logs = [rng.normal(rng.normal(0, between_sd), within_sd, rounds) for _ in range(4000)]
    found = stats.blocks_per_pair(logs, startup_s, round_s)
    assert found.within == pytest.approx(within_sd**2, rel=0.05)
    assert found.between == pytest.approx(between_sd**2, rel=0.1)
    formula = round(math.sqrt(found.within * startup_s / (found.between * round_s)))
    assert found.blocks == max(stats.MIN_BLOCKS, formula)
    assert abs(found.blocks - max(stats.MIN_BLOCKS, best)) <= 1  # and near the true variances' optimum
    assert "rounds of blocks a pair" in found.describe()
    assert stats.blocks_per_pair(logs[:2], startup_s, round_s) is None  # too few pairs to say
    # from a current choice, at most twofold a step
    moved = stats.blocks_per_pair(logs, startup_s, round_s, current=4).blocks
    assert moved == min(max(found.blocks, 2), 8)


@pytest.mark.slow
def test_more_than_two_sides_take_turns_round_robin_and_every_pair_is_compared(accelbench_cli, tmp_path):
    # two backends at two batch sizes: four warm workers in each pair of processes
    records, _ = lockstep_run(
        accelbench_cli, tmp_path, "--batch-sizes", "8,16", "--trials", "2", "--blocks", "2", "--option", "twin_scale=1.10"
    )
    assert len(records) == 4 and all(len(r["trials"]) == 2 for r in records)
    # round 0 in plan order, round 1 reversed (pair 0); pair 1 opens from the other end
    starts = [[t["blocks"][i]["started_s"] for r in records for t in r["trials"][:1]] for i in (0, 1)]
    assert starts[0] == sorted(starts[0]) and starts[1] == sorted(starts[1], reverse=True)
    second = [r["trials"][1]["blocks"][0]["started_s"] for r in records]
    assert second == sorted(second, reverse=True)
    results = compare(runs_of([Record.from_json(r) for r in records]), 0.03)
    assert sorted(r.config.split(" batch ")[1] for r in results) == ["16 224px", "8 224px"]
    assert all(r.samples == "2 pairs (lockstep)" and r.ratio == pytest.approx(1.10, rel=0.02) for r in results), results


@pytest.mark.slow
def test_an_adaptive_run_sizes_its_last_pair_to_end_within_its_budget(accelbench_cli, tmp_path):
    # a bound no noisy run meets (0.1%), so only the budget stops it; pairs grow as the rule asks,
    # and the last one is cut to what is left rather than started whole past the budget
    out = tmp_path / "run.json"
    done = accelbench_cli(
        "run",
        "--plugin",
        "sleepy",
        "--plugin",
        "twin",
        "--option",
        "step_ms=20",
        "--warmup-steps",
        "3",
        "--block-time",
        "0.2s",
        "--until-decided",
        "0.1%",
        "--max-time",
        "12s",
        "--option",
        "noise=0.05",
        "-o",
        str(out),
    )  # no --blocks: the run chooses them
    assert done.returncode == 0, done.stderr
    schedule = load_records(out)[0]["schedule"]
    assert schedule["stop_reason"] in (
        "time budget of 12 s: too little left for another pair before the answer was decided",
        "time budget of 12 s spent before the answer was decided",
    )
    assert schedule["elapsed_s"] < 12 + 2.5, schedule
    assert "allocation" in schedule["lockstep"] or schedule["rounds"] < 4


@pytest.mark.parametrize(
    "devices, workers, mode, expected",
    [
        (("cpu", "cpu"), 1, "throughput", "lockstep"),
        (("cpu",), 1, "throughput", "interleaved"),  # one run: nothing to take turns with
        (("gpu", "gpu"), 1, "throughput", "interleaved"),  # warm frameworks would share one device
        (("cpu", "cpu"), 2, "throughput", "interleaved"),  # multi-worker: counted, not blocks
        (("cpu", "cpu"), 1, "train", "interleaved"),  # train mode runs epochs
    ],
)
def test_lockstep_is_the_default_where_warm_sides_can_take_turns(devices, workers, mode, expected):
    from types import SimpleNamespace

    from accelbench.cli.run import _default_schedule

    plans = [SimpleNamespace(precheck=None, config=SimpleNamespace(device=d)) for d in devices]
    assert _default_schedule(plans, SimpleNamespace(workers=workers, mode=mode)) == expected


@pytest.mark.slow
def test_a_lever_runs_beside_the_backend_as_configured_and_is_compared(accelbench_cli, tmp_path):
    """``--lever``: the backend with the lever's options added runs beside the backend as
    configured, in lockstep (two CPU runs), labelled by its lever; compare decides the lever."""
    out = tmp_path / "lever.json"
    result = accelbench_cli("run", "--plugin", "sleepy", *QUICK, "--lever", "scale=0.8", "--trials", "2", "-o", str(out))
    assert result.returncode == 0, result.stderr
    base, lever = load_records(out)
    assert (base["config"]["lever"], lever["config"]["lever"]) == ({}, {"scale": 0.8})
    assert lever["config"]["options"] == {**base["config"]["options"], "scale": 0.8}
    assert base["schedule"]["kind"] == lever["schedule"]["kind"] == "lockstep"
    comparison = compared([base, lever])
    assert {comparison.a, comparison.b} == {"sleepy:fixed-time", "sleepy:fixed-time [lever scale=0.8]"}
    lever_over_base = comparison.ratio if "lever" in comparison.a else 1 / comparison.ratio
    assert lever_over_base == pytest.approx(1 / 0.8, rel=0.05)  # 16 ms steps against 20 ms
    assert "[lever scale=0.8]" in result.stdout
    assert report.run_label(Record.from_json(lever)).endswith(" [lever scale=0.8]")  # its own series in a report


@pytest.mark.slow
@pytest.mark.parametrize(
    "lever, message",
    [
        ("scale", "--lever must be KEY=VALUE"),
        ("nope=1", "--lever nope=1: unknown option 'nope'"),
        ("step_ms=20", "--lever step_ms=20: the run as configured already has it"),
        ("scale=0.8,scale=0.9", "sets scale twice"),
        (
            "huge_pages=sometimes",
            "--lever huge_pages=sometimes: invalid config: --huge-pages must be one of auto, on, off (got 'sometimes')",
        ),
        ("allocator=/nowhere/libmalloc.so", "--lever allocator=/nowhere/libmalloc.so: "),
        # what "auto" resolves to for the test backend already: the same run twice
        ("allocator=system,huge_pages=off", "every selected backend runs so as configured, so it changes nothing"),
    ],
)
def test_a_lever_that_cannot_be_a_lever_is_refused_before_any_worker(accelbench_cli, tmp_path, lever, message):
    out = tmp_path / "refused.json"
    result = accelbench_cli("run", "--plugin", "sleepy", *QUICK, "--lever", lever, "-o", str(out))
    assert result.returncode == 2 and message in result.stderr and not out.exists(), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line


def test_a_lever_sets_run_fields_that_change_how_not_what_and_options_for_the_rest():
    from accelbench.planning.config import LEVER_FIELDS, RunConfig, expand_sweep

    base, lever = expand_sweep(RunConfig(options={"step_ms": 20}, levers=({"inter_op_threads": 1, "scale": 0.8},)))
    assert (base.lever, base.inter_op_threads, base.options) == ({}, None, {"step_ms": 20})
    assert lever.lever == {"inter_op_threads": 1, "scale": 0.8} and lever.inter_op_threads == 1
    assert lever.options == {"step_ms": 20, "scale": 0.8} and lever.levers is None
    # never the work: no model, batch, precision, image or step count is a lever's to change
    assert set(LEVER_FIELDS) == {"allocator", "huge_pages", "threads", "inter_op_threads"}


@pytest.mark.slow
def test_a_seconds_long_step_with_a_quick_start_counts_most_of_the_run(accelbench_cli, tmp_path):
    """1 s steps, 0.2 s to prepare: the sides start at once, warm up until the step time stops
    falling, and take turns in whole-step blocks, so that most of the run is counted steps."""
    out = tmp_path / "run.json"
    result = accelbench_cli(
        "run", "--plugin", "sleepy", "--plugin", "twin", "--option", "step_ms=1000", "--option", "prepare_s=0.2",
        "--block-time", "2s", "--blocks", "4", "--trials", "1", "-o", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = load_records(out)
    split = records[0]["schedule"]["lockstep"]["time"]
    assert split["counted_s"] / split["wall_s"] >= 0.6, split
    assert all(b["steps"] == 2 for r in records for b in r["trials"][0]["blocks"])
    # the two sides' start-ups (to their first step's end) overlapped: the run's opening is about one side's
    startups = [r["startup"]["worker_to_first_step_s"] for r in records]
    assert split["opening_s"] < 0.75 * sum(startups), (split, startups)
    assert "counted" in result.stdout


@pytest.mark.slow
def test_a_true_five_percent_gap_is_decided_outside(accelbench_cli, tmp_path):
    records, result = lockstep_run(
        accelbench_cli, tmp_path, "--until-decided", "3%", "--max-time", "90", "--option", "noise=0.02",
        "--option", "twin_scale=1.05",
    )  # fmt: skip
    assert compared(records).verdict == "outside"
    assert records[0]["schedule"]["stop_reason"].startswith("decided: ")
