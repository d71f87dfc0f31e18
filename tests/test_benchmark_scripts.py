"""The benchmark scripts' own accounting (the scripts are run by hand on full shapes, not in CI)."""

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import pytest

from accelbench.execution.protocol import Step

sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))
import bench_first_touch  # noqa: E402
import bench_levers  # noqa: E402
import bench_overhead  # noqa: E402
import bench_reference  # noqa: E402
import lockstep  # noqa: E402


def recording(calls, label, results):
    """A runner for ``alternate`` that notes each call and returns the next (images, seconds)."""

    def run():
        calls.append(label)
        return results.pop(0)

    return run


def test_rounds_alternate_and_pool_images_over_wall_time():
    calls = []
    rate, per_round = bench_overhead.alternate(
        "case",
        {
            "accelbench": recording(calls, "accelbench", [(80, 10.0), (80, 30.0)]),
            "bare": recording(calls, "bare", [(80, 20.0), (80, 20.0)]),
        },
        rounds=2,
    )
    assert calls == ["accelbench", "bare", "bare", "accelbench"]
    # pooled: 160 images / 40 s each, although the mean of accelbench's two rates would be 5.33
    assert rate == {"accelbench": 4.0, "bare": 4.0}
    assert per_round == [{"accelbench": 8.0, "bare": 4.0}, {"bare": 4.0, "accelbench": 80 / 30}]


def test_a_burn_in_run_opens_the_rounds_and_is_not_counted():
    calls = []
    rate, per_round = bench_overhead.alternate(
        "case",
        {"accelbench": recording(calls, "accelbench", [(80, 80.0), (80, 10.0)]), "bare": recording(calls, "bare", [(80, 20.0)])},
        rounds=1,
        burn_in=True,
    )
    assert calls == ["accelbench", "accelbench", "bare"]
    # the burn-in's 1 img/s is in neither the pooled rate nor the round's
    assert rate == {"accelbench": 8.0, "bare": 4.0}
    assert per_round == [{"accelbench": 8.0, "bare": 4.0}]


def test_rounds_are_added_while_the_stop_rule_says_go_on():
    calls, seen = [], []

    def go_on(per_round):
        seen.append(len(per_round))
        return len(per_round) < 4

    _, per_round = bench_overhead.alternate(
        "case",
        {"accelbench": recording(calls, "accelbench", [(80, 10.0)] * 4), "bare": recording(calls, "bare", [(80, 20.0)] * 4)},
        rounds=2,
        go_on=go_on,
    )
    # asked only once the fixed rounds ran, then after each added one; the order still alternates
    assert seen == [2, 3, 4] and len(per_round) == 4
    assert calls == ["accelbench", "bare", "bare", "accelbench"] * 2


@pytest.mark.parametrize(
    "ci, expected",
    [
        ((1.004, 1.080), "ahead"),
        ((0.985, 1.120), "not behind"),
        ((0.980, 0.999), "not behind"),
        ((0.930, 0.975), "behind"),
        ((0.950, 1.100), "undecided"),
        ((0.970, 0.990), "undecided"),
        ((1.050, 1.050), "undecided"),
    ],
)  # no interval: nothing is decided
def test_the_verdict_against_the_bar_rests_on_the_whole_interval(ci, expected):
    assert bench_overhead.bar_verdict(ci) == expected


def rounds_of(ratios):
    """Alternating rounds (accelbench first in even rounds) with these accelbench / reference ratios."""
    return [
        {"accelbench": 10.0 * x, "reference": 10.0} if i % 2 == 0 else {"reference": 10.0, "accelbench": 10.0 * x}
        for i, x in enumerate(ratios)
    ]


def test_looks_add_rounds_until_the_verdict_is_decided_at_cores_sequential_confidence():
    from accelbench.analysis.stats import sequential_confidence

    looks = bench_reference.Looks(rounds=4, max_rounds=8)
    assert not looks.go_on("case", rounds_of([1.01, 1.02, 1.00, 1.015]))  # tight above 0.98: not behind
    # look 1 spends what `accelbench run --until-*` spends on its first look
    assert looks.looks == 1 and looks.confidence == sequential_confidence(1) == pytest.approx(0.975)
    assert looks.go_on("case", rounds_of([0.90, 1.10, 1.00, 0.95]))  # wide: another round
    assert looks.confidence == sequential_confidence(2)
    assert not looks.go_on("case", rounds_of([0.90, 1.10, 1.00, 0.95, 1.05, 0.92, 1.08, 0.99]))  # the limit
    # a fixed number of rounds is one look at 95%, and asks for no more
    fixed = bench_reference.Looks(rounds=3, max_rounds=None)
    assert not fixed.go_on("case", rounds_of([0.90, 1.10, 1.00])) and fixed.confidence == 0.95


def test_an_undecided_verdict_says_about_how_many_more_rounds_would_decide_it():
    # half-width 0.05 in log at 4 rounds, 0.0202 from the bar: (0.05 / 0.0202)^2 x 4 = 24.5 rounds in all
    ci = (1.0 / math.exp(0.05), 1.0 * math.exp(0.05))
    assert bench_overhead.more_rounds(1.0, ci, rounds=4) == 21
    assert bench_overhead.more_rounds(0.98, ci, rounds=4) is None  # on the bar: no number of rounds
    assert bench_overhead.more_rounds(1.0, (1.0, 1.0), rounds=2) is None  # no interval yet


def fake_garden(tmp_path, lines):
    """A stand-in for Model Garden's Python: prints its TimeHistory log lines on stderr."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\ncat >&2 <<'EOF'\n" + "\n".join(lines) + "\nEOF\n")
    script.chmod(0o755)
    return str(script)


def test_garden_figure_counts_only_the_steps_after_the_warm_up(tmp_path):
    python = fake_garden(
        tmp_path,
        [
            "I1130 keras_utils.py:145] TimeHistory: 14.65 seconds, 5.46 examples/second between steps 0 and 10",
            "I1130 keras_utils.py:145] TimeHistory: 9.64 seconds, 8.30 examples/second between steps 10 and 20",
            "I1130 keras_utils.py:145] TimeHistory: 10.36 seconds, 7.72 examples/second between steps 20 and 30",
        ],
    )
    images, seconds = bench_reference.run_garden(python, [], batch=8, warmup=10, timed=20)
    assert images == 160 and seconds == pytest.approx(20.0)  # 8.0 img/s, the warm-up's 14.65 s left out


def test_garden_run_missing_timed_steps_is_an_error(tmp_path):
    python = fake_garden(tmp_path, ["TimeHistory: 9.64 seconds, 8.30 examples/second between steps 10 and 20"])
    with pytest.raises(SystemExit, match="expected 20 steps after 10"):
        bench_reference.run_garden(python, [], batch=8, warmup=10, timed=20)


def test_train_imagenet_figure_pools_the_windows_after_the_first():
    log = "\n".join(
        f"INFO:root:Epoch[0] Batch [{10 * (i + 1)}]\tSpeed: {rate} samples/sec\taccuracy=0.001"
        for i, rate in enumerate([2.0, 8.0, 4.0])
    )
    images, seconds = bench_reference.speedometer_figure(0, log, batch=8, warmup=10, timed=20)
    # windows of 80 images at 8 and 4 img/s: 160 images in 30 s (5.33 img/s, not the mean 6.0)
    assert images == 160 and seconds == pytest.approx(30.0)
    with pytest.raises(SystemExit, match="logged 3 Speedometer windows, expected 4"):
        bench_reference.speedometer_figure(0, log, batch=8, warmup=10, timed=30)


@pytest.mark.parametrize(
    "described, expected",
    [
        ("tcmalloc (/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4)", "tcmalloc"),
        ("system (the C library's malloc)", "system"),
        ("preloaded (/opt/lib/libmymalloc.so)", "/opt/lib/libmymalloc.so"),
    ],
)
def test_bare_loops_get_the_malloc_the_plugins_worker_had(described, expected):
    assert bench_reference.malloc_of({"settings": {"allocator": described}}) == expected


def test_shipped_references_run_as_shipped_unless_asked_for_the_plugins_malloc(tmp_path):
    library = tmp_path / "libmymalloc.so"
    library.write_bytes(b"")
    seen = {"settings": {"allocator": f"preloaded ({library})"}}
    assert bench_reference.shipped_malloc("as-shipped", seen) == {}
    assert bench_reference.shipped_malloc("plugin", seen)["LD_PRELOAD"].split()[0] == str(library)
    assert bench_reference.shipped_malloc("plugin", {"settings": {"allocator": "system (the C library's malloc)"}}) == {}


def test_the_plugins_huge_pages_go_with_its_malloc(monkeypatch):
    from accelbench.execution import allocators

    monkeypatch.setattr(allocators, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(allocators, "_glibc", lambda: "glibc 2.36")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    on = {
        "settings": {
            "allocator": "system (the C library's malloc)",
            "huge_pages": "on (GLIBC_TUNABLES has glibc.malloc.hugetlb=1; the kernel's THP mode: madvise)",
        }
    }
    assert bench_reference.huge_pages_of(on) == "on"
    assert bench_reference.shipped_malloc("plugin", on) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert bench_reference.shipped_malloc("as-shipped", on) == {}
    off = {"settings": {"allocator": "system (the C library's malloc)"}}  # a record from before 1.8
    assert bench_reference.huge_pages_of(off) == "off" and bench_reference.shipped_malloc("plugin", off) == {}


def test_a_failing_case_is_reported_and_loses_no_other(monkeypatch):
    def measure(name, batch, options):
        if name == "broken":
            raise SystemExit("Model Garden logged [], expected 15 steps after 5")
        return {"case": name}

    monkeypatch.setattr(bench_reference, "measure", measure)
    failed = bench_reference.measured_or_failed("broken", 8, None)
    assert failed == {"case": "broken", "batch": 8, "failed": "Model Garden logged [], expected 15 steps after 5"}
    assert bench_reference.table_row(failed).split() == [
        "broken",
        "8",
        "failed:",
        "Model",
        "Garden",
        "logged",
        "[],",
        "expected",
        "15",
        "steps",
        "after",
        "5",
    ]
    assert bench_reference.measured_or_failed("fine", 8, None) == {"case": "fine"}


def test_kept_records_are_the_runs_own(testplugins_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(testplugins_path))
    seen = {}
    images, seconds = bench_overhead.run_accelbench(
        ["--plugin", "sleepy", "--option", "step_ms=5"], 4, 1, 3, seen, keep=tmp_path / "kept"
    )
    [kept] = (tmp_path / "kept").iterdir()
    [record] = json.loads(kept.read_text())["records"]
    assert record["throughput"]["images"] == images == 12 and record["throughput"]["wall_time_s"] == seconds
    assert record["settings"] == seen["settings"]


def test_first_touch_maps_each_page_once_and_times_every_chunk():
    size, chunk = 64 * 2**20, 16 * 2**20
    per_page_us, faults = bench_first_touch.touch_pass(size, chunk)
    assert len(per_page_us) == 4 and all(us > 0 for us in per_page_us)
    pages = size // bench_first_touch.PAGE
    # one minor fault per 4 KiB page (fewer where the kernel backs the mapping with huge pages)
    assert pages // 512 <= faults <= pages + 1000


def test_a_lever_is_measured_against_a_baseline_it_changes(monkeypatch):
    from accelbench.execution import allocators

    # a machine that gives huge pages (the answer must not depend on the one the tests run on)
    monkeypatch.setattr(allocators, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(allocators, "_glibc", lambda: "glibc 2.36")
    monkeypatch.setattr(bench_levers, "IOMP", None)  # nor on whether Intel's OpenMP is installed
    # on the C library's malloc: its huge pages, and jemalloc with them; not "system-thp" (= "thp")
    assert {"thp", "jemalloc-thp", "jemalloc", "tcmalloc"} <= set(bench_levers.default_levers("mxnet", "system"))
    assert "system-thp" not in bench_levers.default_levers("mxnet", "system")
    # on jemalloc (mxnet_ngc's kept one): jemalloc's huge pages, never jemalloc against itself
    on_jemalloc = bench_levers.default_levers("mxnet", "jemalloc")
    assert "thp" in on_jemalloc and "system-thp" in on_jemalloc
    assert "jemalloc" not in on_jemalloc and "jemalloc-thp" not in on_jemalloc
    assert "onednn-amx" in on_jemalloc  # a lever of another kind stays
    # tcmalloc has no huge-page setting: "thp" on it would be refused, the other mallocs' stay
    on_tcmalloc = bench_levers.default_levers("jax", "tcmalloc")
    assert set(on_tcmalloc) == {"jemalloc", "system-thp", "jemalloc-thp"}
    assert bench_levers.default_levers("tpu", "tcmalloc") == ["tf-onednn", "tf-primitive-reuse"]  # no "thp" on it
    # a kernel without them: no huge-page lever at all (each would be refused), the others stay
    monkeypatch.setattr(allocators, "thp_mode", lambda: "never")
    assert bench_levers.default_levers("mxnet", "system") == ["jemalloc", "tcmalloc", "onednn-amx", "omp-bind", "mx-aggregate"]
    # Intel's OpenMP where it is installed, for the frameworks that run on OpenMP
    monkeypatch.setattr(bench_levers, "IOMP", "/opt/lib/libiomp5.so")
    assert "iomp" in bench_levers.default_levers("torch", "tcmalloc")
    assert "iomp" not in bench_levers.default_levers("tf", "system")


def test_the_per_unit_column_is_named_for_what_it_holds():
    """Pairs of processes under "per pair", rounds under "per round", both where a table mixes
    lockstep cases over pairs with shipped references' rounds; a failed case has no unit."""
    rounds, pairs, failed = {"unit": "round"}, {"unit": "pair"}, {"case": "x", "failed": "gone"}
    assert bench_reference.units_of([pairs, pairs, failed]) == "pair"
    assert bench_reference.units_of([rounds]) == "round" and bench_reference.units_of([failed]) == "round"
    assert bench_reference.units_of([rounds, pairs]) == "pair or round"
    assert "| pooled | per pair | GFLOP/s |" in bench_reference.markdown_header("pair")
    assert "per pair or round" in bench_reference.table_header("pair or round")


def test_every_lever_is_named_in_the_docs():
    page = (Path(__file__).parent.parent / "docs" / "evidence" / "benchmarks.md").read_text()
    assert [lever for lever in bench_levers.LEVERS if f"`{lever}`" not in page] == []


def test_a_result_prints_as_a_readme_table_row():
    result = {
        "case": "torch-fp32",
        "batch": 8,
        "accelbench": 8.88,
        "reference": 8.90,
        "ratio": 0.997,
        "pooled_ratio": 0.9971,
        "ci95": (0.986, 1.009),
        "round_ratios": [1.019, 0.990, 0.983],
        "gflops_per_s": 217.84,
        "utilisation": 0.491,
        "reference_utilisation": 0.4925,
        "what": "bare loop",
        "allocator": "tcmalloc",
        "huge_pages": "off",
        "steps": "5 + 15",
        "label": "`torch_ref` v1.5 fp32",
        "measured_utc": "22:49-22:55",
        "verdict": "not behind",
        "verdict_ci": (0.986, 1.009),
        "verdict_confidence": 0.95,
        "unit": "round",
    }
    cells = [c.strip() for c in bench_reference.markdown_row(result).split("|")[1:-1]]
    assert len(cells) == len(bench_reference.markdown_header().splitlines()[0].split("|")[1:-1]) == 14
    assert cells == [
        "`torch_ref` v1.5 fp32 (tcmalloc)",
        "8",
        "5 + 15",
        "8.88",
        "8.90",
        "0.997",
        "0.986–1.009",
        "not behind",
        "0.997",
        "1.019 0.990 0.983",
        "217.8",
        "49% / 49%",
        "bare loop `bare_torch.py --precision fp32`",
        "22:49-22:55",
    ]
    # a look of --max-rounds names the interval its verdict rests on
    looked = {**result, "verdict_ci": (0.981, 1.014), "verdict_confidence": 1 - 0.05 / 6}
    assert "| not behind (99.17% CI 0.981–1.014) |" in bench_reference.markdown_row(looked)
    assert "not behind (99.17% CI 0.981–1.014); bare loop" in bench_reference.table_row(looked)
    # an undecided one, about how many more rounds would decide it
    wide = {**result, "verdict": "undecided", "ci95": (0.95, 1.05), "verdict_ci": (0.95, 1.05)}
    assert "| undecided (~23 more rounds) |" in bench_reference.markdown_row(wide)
    assert "| undecided (~23 more pairs) |" in bench_reference.markdown_row({**wide, "unit": "pair"})
    near = {**wide, "unit": "pair", "ratio": 1.012, "verdict_ci": (0.979, 1.047), "round_ratios": [1.0] * 8}
    assert "| undecided (~1 more pair) |" in bench_reference.markdown_row(near)
    # bold only where the interval excludes 1, on either side; no interval under 3 rounds
    assert "| **1.041** |" in bench_reference.markdown_row({**result, "ratio": 1.041, "ci95": (1.033, 1.049)})
    assert "| **0.950** |" in bench_reference.markdown_row({**result, "ratio": 0.950, "ci95": (0.94, 0.96)})
    assert "| 1.041 | – |" in bench_reference.markdown_row({**result, "ratio": 1.041, "ci95": (1.041, 1.041)})
    failed = bench_reference.markdown_row({"case": "tf-bf16", "batch": 32, "failed": "Model Garden failed:\n..."})
    assert failed == "| tf-bf16 | 32 | failed: Model Garden failed: ... |"


#: a bare loop whose step busy-waits a known time, timed by the bare loops' own code
BARE_SPIN = """
import argparse, time
from bare_timing import time_steps
parser = argparse.ArgumentParser()
for flag in ("--step-ms", "--batch", "--warmup", "--timed"):
    parser.add_argument(flag, type=float if flag == "--step-ms" else int)
args = parser.parse_args()
def step():
    end = time.perf_counter() + args.step_ms / 1000
    while time.perf_counter() < end:
        pass
    return 0.0
time_steps(step, args.batch, args.warmup, args.timed)
"""


def spinning_bare_loop(script, batch, warmup):
    """``lockstep.sides``' reference_side: the spinning bare loop, in the plugin's Python, beside bare_timing."""
    beside_bare_timing = {"PYTHONPATH": str(Path(__file__).parent / "benchmarks")}
    return lambda seen: lockstep.BareSide([str(script), "--step-ms", "40"], batch, warmup, seen["python"], beside_bare_timing)


def test_lockstep_sides_take_turns_in_blocks_and_keep_their_own_times(testplugins_path, tmp_path, monkeypatch):
    """The plugin's warm worker (20 ms steps, core's lockstep side) and a warm bare loop (40 ms)
    take turns, two steps a block, each parked (stopped) while the other runs: each block is timed
    by its own side, the pooled ratio is their speeds' (2), and the plugin's kept record holds
    exactly the blocks' steps."""
    monkeypatch.syspath_prepend(str(testplugins_path))
    script = tmp_path / "bare_spin.py"
    script.write_text(BARE_SPIN)
    seen, states = {}, []
    with lockstep.sides(
        ["--plugin", "sleepy", "--option", "step_ms=20"], spinning_bare_loop(script, 2, 2), 2, 2, seen, keep=tmp_path / "kept"
    ) as (plugin, bare):

        def plugin_block():
            states.append(settled_state(bare.process.pid))  # the bare loop, parked meanwhile
            return plugin.block(2)

        rate, per_round = bench_overhead.alternate("spin", {"accelbench": plugin_block, "reference": lambda: bare.block(2)}, 4)
        worker_state = settled_state(plugin.side.worker.process.pid)
        bare_process = bare.process
    assert bare_process.poll() == 0  # the end of its stdin ended it
    assert set(states) == {"T"} and worker_state == "T"  # each side stopped between its blocks
    assert [list(r) for r in per_round] == [["accelbench", "reference"], ["reference", "accelbench"]] * 2
    assert rate["accelbench"] == pytest.approx(2 / 0.020, rel=0.1)
    assert rate["reference"] == pytest.approx(2 / 0.040, rel=0.1)
    assert seen["flops_per_image"] == 1e9 and seen["settings"]["step_s"] == 0.020
    [kept] = (tmp_path / "kept").iterdir()
    [record] = json.loads(kept.read_text())["records"]
    assert record["throughput"]["images"] == 4 * 2 * 2 and record["steps"]["timed"] == 8
    assert record["throughput"]["images_per_sec"] == pytest.approx(rate["accelbench"])
    assert len(record["trials"][0]["blocks"]) == 4  # core's blocks, as accelbench run keeps them


def test_a_lockstep_block_of_the_plugin_is_one_timing_loop_in_its_worker(testplugins_path, monkeypatch):
    """The plugin's block crosses the pipe once, as the bare loop times its block in its own
    process: three 20 ms steps are one ``step`` command of three calls, timed in the worker."""
    monkeypatch.syspath_prepend(str(testplugins_path))
    plugin = lockstep.PluginSide(["--plugin", "sleepy", "--option", "step_ms=20"], 2, warmup=1)
    try:
        commands = []
        call = plugin.side.worker.call
        plugin.side.worker.call = lambda request, **kw: commands.append(request) or call(request, **kw)
        images, seconds = plugin.block(3)
    finally:
        plugin.close()
    assert commands == [Step(3, 1)]  # three calls, each a sample of its own (20 ms is no tiny step)
    [block] = plugin.side.blocks
    assert images == 6 and block.steps == 3 and seconds == block.seconds == pytest.approx(0.060, rel=0.25)
    assert seconds == pytest.approx(sum(plugin.side.timings[-1].step_times))


def test_a_plugin_that_runs_loops_of_steps_takes_its_lockstep_blocks_in_whole_loops(testplugins_path, monkeypatch):
    """A backend that runs 5 steps a call (as tpu_official's steps_per_loop): its warm-up and
    blocks are whole calls, a block's images and seconds are its calls', and a block or warm-up
    that is not whole calls is refused, not rounded."""
    monkeypatch.syspath_prepend(str(testplugins_path))
    args = ["--plugin", "sleepy", "--option", "step_ms=10", "--option", "steps_per_call=5"]
    plugin = lockstep.PluginSide(args, 2, warmup=5)
    try:
        images, seconds = plugin.block(10)
        with pytest.raises(ValueError, match="not whole calls of 5"):
            plugin.block(3)
        record = plugin.record("test")
    finally:
        plugin.close()
    assert images == 20 and seconds == pytest.approx(2 * 0.050, rel=0.25)
    # the warm-up's call, and core's one timed call after it that sizes blocks
    assert record.steps.warmup == 5 + 5 and record.steps.timed == 10
    assert record.images_per_sec() == pytest.approx(images / seconds)
    assert record.settings["timed_by"] == "test"
    with pytest.raises(SystemExit, match="runs 5 steps a call; a warm-up of 3 is not whole calls"):
        lockstep.PluginSide(args, 2, warmup=3)


def test_a_bare_loop_that_dies_in_lockstep_fails_its_case_with_its_own_words(tmp_path):
    script = tmp_path / "bare_dies.py"
    script.write_text("import sys\nsys.exit('no such framework here')\n")
    with pytest.raises(SystemExit, match="the bare loop exited \\(1\\): no such framework here"):
        lockstep.BareSide([str(script)], 2, 1, sys.executable, {})


def test_a_cases_arguments_become_its_run_config():
    plugin, config = lockstep.run_config(
        [
            "--plugin",
            "torch_ref",
            "--precision",
            "bf16",
            "--variant",
            "v1.5",
            "--option",
            "steps_per_loop=10",
            "--option",
            "memory_format=contiguous",
        ],
        32,
    )
    assert plugin == "torch_ref"
    assert (config.global_batch, config.precision, config.variant) == (32, "bf16", "v1.5")
    assert config.options == {"steps_per_loop": 10, "memory_format": "contiguous"}
    assert config.timeout_s == lockstep.SESSION_TIMEOUT_S
    with pytest.raises(ValueError, match="no RunConfig field for --timed-steps"):
        lockstep.run_config(["--plugin", "torch_ref", "--timed-steps", "5"], 8)


def test_a_case_on_a_gpu_asks_both_sides_for_it():
    args, kind, reference = bench_reference.on_device("torch-bf16", "gpu")
    assert args[-2:] == ["--device", "gpu"] and reference[-2:] == ["--device", "gpu"] and kind == "bare"
    assert lockstep.run_config(args, 256)[1].device == "gpu"
    assert bench_reference.on_device("tf-fp32", "cpu") == bench_reference.CASES["tf-fp32"]
    assert [c for c in bench_reference.CASES if bench_reference.takes_device(c)] == [
        "torch-fp32",
        "torch-bf16",
        "jax-bf16",
        "jax-fp32",
    ]


def test_a_case_whose_reference_cannot_run_on_a_gpu_is_refused_there():
    import subprocess

    result = subprocess.run(
        [sys.executable, str(Path(bench_reference.__file__)), "--device", "gpu", "--case", "mxnet-fp32"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].endswith(
        "error: --device gpu: only the cases whose reference is a bare "
        "loop that takes a device run there (torch-fp32, torch-bf16, "
        "jax-bf16, jax-fp32)"
    )


def test_a_markdown_row_lists_a_dozen_rounds_and_sums_up_more():
    assert bench_reference.rounds_text([1.0, 0.98, 1.02]) == "1.000 0.980 1.020"
    many = [1.0 + i / 100 for i in range(-6, 7)]  # 13 rounds, 0.94-1.06
    assert bench_reference.rounds_text(many) == "13 rounds: 0.940–1.060, median 1.000"
    assert bench_reference.rounds_text(many, "pair") == "13 pairs: 0.940–1.060, median 1.000"


class FakeSide:
    """A side of a pair whose block takes a known time a step, and notes who ran."""

    def __init__(self, label, step_s, log):
        self.label, self.step_s, self.log = label, step_s, log

    def block(self, steps):
        self.log.append(self.label)
        return 4 * steps, self.step_s * steps


def test_pairs_alternate_which_side_starts_and_each_pair_is_one_unit(monkeypatch):
    """Three pairs of two rounds: the bare loop starts and blocks first in the second pair only;
    each pair is one unit with its sides' speeds in the order they started; the pooled speeds are
    over every block of every pair."""
    import contextlib

    monkeypatch.setattr(lockstep, "SETTLE_S", 0.0)
    opened, blocks = [], []
    speeds = iter([(0.010, 0.020), (0.010, 0.025), (0.010, 0.022)])  # each pair's step seconds: plugin, bare

    @contextlib.contextmanager
    def open_pair(reference_first):
        opened.append(reference_first)
        plugin_s, bare_s = next(speeds)
        yield FakeSide("accelbench", plugin_s, blocks), FakeSide("reference", bare_s, blocks)

    rate, units = lockstep.in_pairs("case", open_pair, steps=2, rounds=2, pairs=3)
    assert opened == [False, True, False]
    assert blocks == [
        "accelbench",
        "reference",
        "reference",
        "accelbench",
        "reference",
        "accelbench",
        "accelbench",
        "reference",
        "accelbench",
        "reference",
        "reference",
        "accelbench",
    ]
    assert [list(u) for u in units] == [["accelbench", "reference"], ["reference", "accelbench"], ["accelbench", "reference"]]
    assert [u["accelbench"] / u["reference"] for u in units] == pytest.approx([2.0, 2.5, 2.2])
    assert rate["accelbench"] == pytest.approx(4 / 0.010)
    assert rate["reference"] == pytest.approx(3 * 16 / (0.080 + 0.100 + 0.088))
    # the interval is over the three pairs, the order of each pair's start regressed out (1 degree
    # of freedom): the pairs that opened with the plugin (2.0, 2.2) against the one that did not (2.5)
    estimate = bench_overhead.paired(units, "accelbench", "reference")
    assert estimate.samples == 3 and estimate.ratio == pytest.approx((2.0 * 2.2) ** 0.25 * 2.5**0.5)
    assert estimate.ci95[0] < estimate.ratio < estimate.ci95[1]


def test_pairs_are_added_while_the_stop_rule_says_go_on(monkeypatch):
    import contextlib

    monkeypatch.setattr(lockstep, "SETTLE_S", 0.0)

    @contextlib.contextmanager
    def open_pair(reference_first):
        yield FakeSide("accelbench", 0.010, []), FakeSide("reference", 0.010, [])

    looked = []
    _, units = lockstep.in_pairs(
        "case", open_pair, 1, 2, pairs=2, go_on=lambda units: looked.append(len(units)) or len(units) < 4
    )
    assert len(units) == 4 and looked == [2, 3, 4]


def test_a_pair_opened_reference_first_starts_its_bare_loop_before_the_worker(testplugins_path, tmp_path, monkeypatch):
    """The second pair of a real lockstep case: its bare loop comes up from what the first pair's
    record left in ``seen``, before the plugin's worker starts (each side's start noted as it
    begins)."""
    monkeypatch.syspath_prepend(str(testplugins_path))
    script = tmp_path / "bare_spin.py"
    script.write_text(BARE_SPIN)
    started = []
    for side, cls in (("plugin", lockstep.PluginSide), ("bare", lockstep.BareSide)):

        def noting(self, *args, _side=side, _init=cls.__init__):
            started.append(_side)
            _init(self, *args)

        monkeypatch.setattr(cls, "__init__", noting)
    seen = {}

    def open_pair(reference_first):
        return lockstep.sides(
            ["--plugin", "sleepy", "--option", "step_ms=20"],
            spinning_bare_loop(script, 2, 1),
            2,
            1,
            seen,
            reference_first=reference_first,
        )

    with pytest.raises(KeyError):  # nothing seen yet: a first pair cannot open with its bare loop
        with open_pair(True):
            pass
    started.clear()
    monkeypatch.setattr(lockstep, "SETTLE_S", 0.0)
    rate, units = lockstep.in_pairs("spin", open_pair, steps=2, rounds=2, pairs=2)
    assert started == ["plugin", "bare", "bare", "plugin"]
    assert [list(u) for u in units] == [["accelbench", "reference"], ["reference", "accelbench"]]
    assert [u["accelbench"] / u["reference"] for u in units] == pytest.approx([2.0, 2.0], rel=0.15)
    assert seen["settings"]["step_s"] == 0.020


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--pairs", "3"], "--pairs takes --lockstep"),
        (["--lockstep", "1", "--pairs", "0"], "--pairs must be at least 1"),
        (["--lockstep", "1", "--pairs", "3", "--max-rounds", "6"], "--max-rounds with --pairs"),
        (["--lockstep", "1", "--max-pairs", "6"], "--max-pairs takes --pairs of 2 or more"),
        (["--lockstep", "1", "--pairs", "4", "--max-pairs", "3"], "--max-pairs takes --pairs of 2 or more"),
    ],
)
def test_pairs_misused_are_refused_before_anything_starts(flags, message):
    import subprocess

    result = subprocess.run(
        [sys.executable, str(Path(bench_reference.__file__)), "--case", "torch-bf16", *flags], capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stdout == ""
    assert message in result.stderr.splitlines()[-1]


#: a program that runs its own loop as a shipped reference does, printing a line a step among
#: others; each step is 30 ms of its own CPU time, so time it spends stopped does not advance it
SHIPPED_SPIN = """
import time
print("Step\\tImg/sec\\ttotal_loss")
for step in range(1, 10**6):
    end = time.process_time() + 0.030
    while time.process_time() < end:
        pass
    print(f"{step}\\timages/sec: 33.3 +/- 0.0 (jitter = 0.0)\\t7.000")
    print("a log line between steps")
"""


def process_state(pid):
    """The one-letter state /proc gives a process (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def settled_state(pid, within=2.0):
    """The state once a signal just sent has taken effect: SIGSTOP is delivered asynchronously,
    so a process read at once may still show R (a CI run on a loaded VM did)."""
    deadline = time.monotonic() + within
    while (state := process_state(pid)) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


def test_a_shipped_reference_takes_turns_stopped_between_its_blocks(tmp_path):
    """Between its blocks the program is stopped: it makes no progress while the other side runs,
    that wait is not in its seconds, and a block is the steps asked for, timed by its step lines."""
    script = tmp_path / "shipped.py"
    script.write_text(SHIPPED_SPIN)
    side = lockstep.ShippedSide(
        [sys.executable, str(script)],
        bench_reference.STEP_LINES["tf_cnn"],
        batch=4,
        warmup=2,
        scratch=(scratch := tempfile.TemporaryDirectory()),
    )
    try:
        states = [settled_state(side.process.pid)]
        time.sleep(0.5)  # ~16 steps, were it running
        first = side.block(3)
        states.append(settled_state(side.process.pid))
        time.sleep(0.3)
        second = side.block(2)
    finally:
        side.close()
    assert states == ["T", "T"]
    assert first[0] == 12 and first[1] == pytest.approx(0.090, rel=0.3)
    assert second[0] == 8 and second[1] == pytest.approx(0.060, rel=0.3)
    assert side.process.poll() is not None and not Path(scratch.name).exists()


SHIPPED_LOOPS = """
import time
for loop in range(1, 10**6):
    for _ in range(5):
        end = time.process_time() + 0.010
        while time.process_time() < end:
            pass
    print(f"TimeHistory: 0.05 seconds, 100.0 examples/second between steps {5 * (loop - 1)} and {5 * loop}")
"""


def test_a_shipped_reference_that_logs_a_line_a_loop_takes_its_blocks_in_whole_loops(tmp_path):
    """A program that prints one line a loop of 5 steps (the Model Garden with steps_per_loop):
    a block of 10 steps waits for two of its lines, its seconds are theirs, and a block that is
    not whole loops is refused."""
    script = tmp_path / "shipped_loops.py"
    script.write_text(SHIPPED_LOOPS)
    side = lockstep.ShippedSide(
        [sys.executable, str(script)], bench_reference.STEP_LINES["garden"], batch=4, warmup=1, steps_per_line=5
    )
    try:
        images, seconds = side.block(10)
        with pytest.raises(ValueError, match="not whole lines of 5"):
            side.block(5 + 1)
    finally:
        side.close()
    assert images == 40 and seconds == pytest.approx(0.100, rel=0.3)


def test_a_shipped_reference_that_dies_in_lockstep_fails_its_case_with_its_own_words(tmp_path):
    script = tmp_path / "shipped_dies.py"
    script.write_text("import sys\nprint('loading')\nsys.exit('no such framework here')\n")
    with pytest.raises(SystemExit, match="the reference exited \\(1\\): loading \\| no such framework here"):
        lockstep.ShippedSide([sys.executable, str(script)], bench_reference.STEP_LINES["tf_cnn"], 2, 1)


@pytest.mark.parametrize(
    "kind, line",
    [
        ("tf_cnn", "1\timages/sec: 6.8 +/- 0.0 (jitter = 0.0)\t7.000"),
        ("mxnet_script", "INFO:root:Epoch[0] Batch [1-2]\tSpeed: 7.01 samples/sec\taccuracy=0.000000"),
        ("garden", "I1204 TimeHistory: 4.61 seconds, 6.94 examples/second between steps 1 and 2"),
    ],
)
def test_each_shipped_references_step_line_is_found_and_nothing_else(kind, line):
    others = ["Step\tImg/sec\ttotal_loss", "total images/sec: 6.83", "Done warm up", "Running warm up"]
    assert bench_reference.STEP_LINES[kind].search(line)
    assert not any(bench_reference.STEP_LINES[kind].search(other) for other in others)


def test_a_shipped_reference_in_lockstep_prints_a_line_a_step_as_it_ships(monkeypatch, tmp_path):
    """tf_cnn_benchmarks, train_imagenet.py and the Model Garden are started for their million
    steps, a step line each (a line a loop of 10 for tpu-bf16, whose warm-up is rounded up to a
    whole loop), with what they need to run here."""
    started = []
    monkeypatch.setattr(
        lockstep,
        "ShippedSide",
        lambda command, step_line, batch, warmup, cwd, env, scratch, steps_per_line: (
            started.append((command, cwd, env, Path(scratch.name), warmup, steps_per_line)) or scratch
        ),
    )
    (tmp_path / "numpy_alias_shim_sitecustomize.py").write_text("# shim\n")
    options = bench_reference.argparse.Namespace(
        references=tmp_path,
        shipped_malloc="as-shipped",
        shipped_onednn="as-shipped",
        warmup=3,
        lockstep=1,
        garden_python="/garden/bin/python",
    )
    seen = {"settings": {"allocator": "system"}}
    for name in ("tfcnn-v1-fp32", "mxscript-v1-fp32", "tf-bf16", "tpu-bf16"):
        _, kind, reference = bench_reference.CASES[name]
        warmup, _ = bench_reference.whole_loops(name, options.warmup, options.lockstep)
        bench_reference.lockstep_reference(kind, reference, 32, options, warmup, bench_reference.LOOP_STEPS.get(name, 1))(
            seen
        ).cleanup()
    (
        (tf_cnn, tf_cwd, tf_env, _, tf_lines, _),
        (mx, mx_cwd, mx_env, mx_scratch, mx_lines, _),
        (garden, garden_cwd, _, garden_scratch, garden_lines, _),
        (loops, _, _, _, loop_lines, per_line),
    ) = started
    # both sides' first block follows 3 steps: MXNet's batch 0 prints no line, so 2 more of its lines;
    # tpu-bf16's follows one loop of 10, one line
    assert (tf_lines, mx_lines, garden_lines, loop_lines) == (3, 2, 3, 1)
    assert per_line == 10 and loops[loops.index("--steps_per_loop") + 1] == "10"
    assert {"--display_every=1", "--num_batches=1000000", "--num_warmup_batches=0", "--batch_size=32", "--model=resnet50"} <= set(
        tf_cnn
    ) and tf_env == {"TF_USE_LEGACY_KERAS": "1"}
    assert mx[mx.index("--disp-batches") + 1] == "1" and mx[mx.index("--num-examples") + 1] == str(32 * 10**6)
    assert mx_cwd == tmp_path / "mxnet_image_classification" and mx_env["PYTHONPATH"] == str(mx_scratch)
    assert garden[0] == "/garden/bin/python" and Path(garden_cwd) == garden_scratch
    assert {"--log_steps=1", "--train_steps=1000000", "--dtype", "bf16", f"--model_dir={garden_scratch}"} <= set(garden)
    assert bench_reference.whole_loops("tpu-bf16", 3, 1, 12) == [10, 10, 20]
    assert bench_reference.whole_loops("tf-bf16", 3, 1, 12) == [3, 1, 12]


def test_the_plugins_worker_is_stopped_between_its_blocks(testplugins_path, monkeypatch):
    """Every side spends the other's block alike: stopped. The worker's block is still its own
    timing loop's, and the side's close ends a stopped worker too."""
    monkeypatch.syspath_prepend(str(testplugins_path))
    plugin = lockstep.PluginSide(["--plugin", "sleepy", "--option", "step_ms=20"], 2, warmup=1)
    worker = plugin.side.worker.process
    try:
        states = [settled_state(worker.pid)]
        images, seconds = plugin.block(2)
        states.append(settled_state(worker.pid))
    finally:
        plugin.close()
    assert states == ["T", "T"]
    assert images == 4 and seconds == pytest.approx(0.040, rel=0.25)
    assert worker.wait(10) is not None


STOPPED_SIDES = {
    "shipped reference": """side = lockstep.ShippedSide([sys.executable, {script!r}], re.compile(r"images/sec"), 2, 1)
pid = side.process.pid""",
    "plugin worker": """sys.path.insert(0, {plugins!r})
side = lockstep.PluginSide(["--plugin", "sleepy", "--option", "step_ms=20"], 2, warmup=1)
pid = side.side.worker.process.pid""",
}


@pytest.mark.parametrize("side", STOPPED_SIDES)
def test_a_side_left_stopped_dies_with_the_benchmark(side, testplugins_path, tmp_path):
    """Killed outright (no finally runs), the benchmark takes its stopped sides with it: the
    reference by the parent-death signal lockstep sets, the plugin's worker by core's."""
    import subprocess

    script = tmp_path / "shipped.py"
    script.write_text(SHIPPED_SPIN)
    start = STOPPED_SIDES[side].format(script=str(script), plugins=str(testplugins_path))
    driver = tmp_path / "driver.py"
    driver.write_text(f"""import re, sys, time
sys.path.insert(0, {str(Path(__file__).parent / "benchmarks")!r})
import lockstep
{start}
print(pid, flush=True)
time.sleep(60)
""")
    benchmark = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
    stopped = int(benchmark.stdout.readline())
    assert settled_state(stopped) == "T"
    benchmark.kill()
    benchmark.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{stopped}").exists() and process_state(stopped) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{stopped}").exists() or process_state(stopped) == "Z"


def test_a_terminated_benchmark_unwinds_through_its_sides_and_is_no_cases_failure(monkeypatch):
    """SIGTERM ends the run (it is not one case's failure, after which the sweep would go on), and
    as an exception, so every side's close runs and nothing is left stopped."""

    def measure(name, batch, options):
        bench_reference.terminated(15, None)

    monkeypatch.setattr(bench_reference, "measure", measure)
    with pytest.raises(bench_reference.Terminated, match="signal 15"):
        bench_reference.measured_or_failed("tfcnn-v1-fp32", 32, None)
