"""The prepared accelerator check (tests/device/gpu_check.py), tested on the CPU: its arguments,
time budget, summary from records, and a dry run without installs; and the published peaks."""

import copy
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "device" / "gpu_check.py"
PROFILE = Path(__file__).parent / "device" / "torch_profile.py"
FIXTURE = Path(__file__).parent / "fixtures" / "records-1.11.0.json"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_check"]


def run_script(*args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--out is required"),
        (["--out", "x", "--budget", "10"], "--budget must exceed 20 s"),
        (["--out", "x", "--time", "0"], "--time must be positive"),
    ],
)
def test_bad_arguments_are_refused(args, message):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    result = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and message in result.stderr


def test_the_budget_grants_what_is_left_and_keeps_the_summary_reserve(check):
    now = [0.0]
    budget = check.Budget(200.0, clock=lambda: now[0])
    assert budget.grant(95.0) == 95.0
    now[0] = 100.0
    assert budget.grant(95.0) == pytest.approx(80.0)  # 200 - 100 - the 20 s reserve
    now[0] = 170.0
    assert budget.grant(95.0, least_s=45.0) is None


def test_runs_past_the_budget_are_skipped_and_said(check, tmp_path):
    args = check.parse_args(["--out", str(tmp_path), "--budget", "21"])
    line = check.run_one(sys.executable, "tf_benchmarks", "fp32", args, check.Budget(21.0), tmp_path)
    assert (line.status, line.reason) == ("skipped", "time budget spent")


def test_plugin_selection(check):
    args = check.parse_args(["--out", "x", "--plugins", "mxnet_ngc,newframework"])
    assert check.selected_runs(args) == [("mxnet_ngc", "fp32"), ("mxnet_ngc", "fp16"), ("newframework", "fp32")]
    assert len(check.selected_runs(check.parse_args(["--out", "x"]))) == 11


def test_the_cuda_version_is_read_from_nvidia_smis_banner_not_its_driver(check):
    banner = "| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |"
    assert check.cuda_version(banner) == "13.0"
    assert check.cuda_version("| NVIDIA-SMI has failed |") == ""


def test_carried_wheels_and_accelbench_go_into_this_interpreter_from_files_alone(check, tmp_path, monkeypatch, capsys):
    (tmp_path / "jsonschema-4.25.1-py3-none-any.whl").write_bytes(b"")
    commands = []
    monkeypatch.setattr(
        check.subprocess, "run", lambda command, **_: commands.append(command) or subprocess.CompletedProcess(command, 0, "", "")
    )
    assert check.install_offline(str(tmp_path)) == sys.executable
    offline = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    assert commands == [
        [*offline, str(tmp_path / "jsonschema-4.25.1-py3-none-any.whl")],
        [*offline, "--no-build-isolation", "-e", str(check.ROOT)],
    ]
    assert capsys.readouterr().out.splitlines() == [
        "install carried wheels (no registry): ok",
        "install accelbench (no registry): ok",
    ]


def test_the_reference_step_takes_the_selected_plugins_cases(check):
    assert check.selected_cases(check.parse_args(["--out", "x", "--plugins", "torch_ref,mxnet_ngc"])) == [
        "torch-bf16",
        "torch-fp32",
    ]
    assert check.selected_cases(check.parse_args(["--out", "x"])) == ["torch-bf16", "torch-fp32", "jax-bf16", "jax-fp32"]


def test_the_reference_step_asks_for_pairs_of_processes_when_told(check, tmp_path):
    one = check.reference_command("python", "jax-bf16", check.parse_args(["--out", "x"]), tmp_path, 1)
    assert "--pairs" not in one and one[one.index("--rounds") + 1] == "20"
    three = check.reference_command(
        "python", "jax-bf16", check.parse_args(["--out", "x", "--pairs", "3", "--rounds", "4"]), tmp_path, 3
    )
    assert three[three.index("--pairs") + 1] == "3" and three[three.index("--rounds") + 1] == "4"
    assert three[three.index("--device") + 1] == "gpu" and three[three.index("--case") + 1] == "jax-bf16"


@pytest.mark.parametrize("granted, wanted, fit", [(410.0, 3, 1), (600.0, 3, 2), (900.0, 3, 3), (2000.0, 3, 3), (250.0, 1, 1)])
def test_a_pairs_case_asks_for_the_pairs_that_fit_its_share(check, granted, wanted, fit):
    """Pairs of 236 s (140 s of start-ups, 16 rounds of 6 s): a case stopped midway prints no
    table, so it is asked for the pairs that fit (on the H200 the third of three did not)."""
    pair_s = check.REFERENCE_OVERHEAD_S + check.REFERENCE_ROUND_S * 16
    assert pair_s == 236.0
    assert check.pairs_that_fit(granted, pair_s, wanted) == fit


def test_a_case_given_fewer_pairs_than_asked_says_so(check, tmp_path, monkeypatch, capsys):
    commands = []
    monkeypatch.setattr(check.subprocess, "run", lambda command, **kw: commands.append(command))
    args = check.parse_args(["--out", str(tmp_path), "--pairs", "3", "--rounds", "16"])
    check.reference_case("python", "jax-bf16", args, check.Budget(500.0), tmp_path)
    [command] = commands
    assert command[command.index("--pairs") + 1] == "2"
    assert "reference jax-bf16: 2 of 3 pairs fit its 480 s share" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "runs,warp"], "--steps: no step warp"),
        (["--rounds", "0"], "must be at least 1"),
        (["--pairs", "0"], "--pairs must be at least 1"),
        (["--lever-pairs", "0"], "--lever-pairs, --lever-blocks and --pairs must be at least 1"),
        (["--lever-block-time", "0"], "--lever-block-time must be positive"),
        (["--levers", "torch_ref:bf16"], "--levers: 'torch_ref:bf16' is not PLUGIN:PRECISION:KEY=VALUE"),
    ],
)
def test_bad_steps_and_reference_sizes_are_refused(args, message):
    result = run_script("--out", "x", *args)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.slow
def test_a_dry_run_brings_back_validated_records_and_a_summary(testplugins_path, tmp_path):
    result = run_script(
        "--out",
        str(tmp_path),
        "--dry-run",
        "--plugins",
        "sleepy",
        "--device",
        "cpu",
        "--time",
        "1",
        "--budget",
        "120",
        env={"PYTHONPATH": str(testplugins_path)},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0].startswith(("GPU: ", "nvidia-smi: not found"))
    assert any(line.startswith("sleepy fp32 b8: ok ") and "img/s" in line for line in out), out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["records_valid"] is True
    [run] = summary["runs"]
    assert run["status"] == "ok" and run["images_per_sec"] == pytest.approx(8 / 0.020, rel=0.05)
    [record] = json.loads((tmp_path / run["record_file"]).read_text())["records"]
    assert record["throughput"]["images_per_sec"] == run["images_per_sec"]
    rows = (tmp_path / "summary.md").read_text().splitlines()
    assert rows[0] == "| plugin | precision | batch | images/sec | utilisation | of the per-GPU anchor | date | GPU |"
    assert rows[2].startswith(f"| sleepy | fp32 | 8 | {run['images_per_sec']:.1f} | - | - | ")
    assert "anchor: none (no GPU)" in out and run["anchor_share"] is None and summary["standings"] == []


def test_a_failed_run_is_a_row_with_its_reason(check, tmp_path):
    done = subprocess.CompletedProcess([], 2, "", "error: unknown plugin 'nope'\n")
    line = check.line_from_record("nope", "fp32", tmp_path / "missing.json", done)
    assert (line.status, line.reason) == ("failed", "error: unknown plugin 'nope'")
    (tmp_path / "records").mkdir()
    check.summarize(sys.executable, tmp_path, {"gpu": "", "driver": "", "cuda": "", "line": ""}, [line])
    assert "| nope | fp32 | - | failed: error: unknown plugin 'nope' |" in (tmp_path / "summary.md").read_text()


def test_the_summary_holds_the_reference_rows_under_one_header(check, tmp_path):
    (tmp_path / "records").mkdir()
    header = ["| plugin | batch |", "|---|---|"]
    rows = [*header, "| `torch_ref` v1.5 bf16 | 256 |", *header, "| jax-fp32 | 256 | failed: no GPU |"]
    check.summarize(sys.executable, tmp_path, {"gpu": "NVIDIA H200", "driver": "", "cuda": "", "line": ""}, [], rows)
    text = (tmp_path / "summary.md").read_text().split("Beside the bare loops on NVIDIA H200, in lockstep:")[1]
    assert text.split() == [
        "|",
        "plugin",
        "|",
        "batch",
        "|",
        "|---|---|",
        "|",
        "`torch_ref`",
        "v1.5",
        "bf16",
        "|",
        "256",
        "|",
        "|",
        "jax-fp32",
        "|",
        "256",
        "|",
        "failed:",
        "no",
        "GPU",
        "|",
    ]


@pytest.mark.parametrize(
    "kind, name, precision, devices, tflops",
    [
        ("gpu", "NVIDIA H200", "bf16", 1, 989.5),
        ("gpu", "NVIDIA H200 NVL", "bf16", 1, 835.5),
        ("gpu", "NVIDIA H100 80GB HBM3", "fp32", 1, 494.5),
        ("gpu", "NVIDIA H100 PCIe", "fp16", 2, 1513.0),
        ("gpu", "NVIDIA H100 NVL", "bf16", 1, 835.5),
        ("gpu", "Tesla V100-SXM2-16GB", "fp16", 4, 500.0),
        ("gpu", "Tesla V100-SXM2-16GB", "bf16", 1, None),
        ("tpu", "v2-8", "bf16", 4, 180.0),
        ("gpu", "AMD Instinct MI300X", "bf16", 1, None),
        ("cpu", "AMD EPYC", "fp32", 1, None),
    ],
)
def test_published_peaks(kind, name, precision, devices, tflops):
    from accelbench.analysis import peaks

    peak = peaks.published(kind, name, precision, devices)
    assert (peak.flops_per_s / 1e12 if peak else None) == (pytest.approx(tflops) if tflops else None)
    if peak:
        assert "datasheet" in peak.source or "documentation" in peak.source


def test_a_gpu_record_gets_its_utilisation(monkeypatch, tmp_path):
    import dataclasses

    from conftest import a_record

    from accelbench.records.results import DeviceRef, Flops, Named, add_utilisation, run_peak

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no peak measured on this machine
    environment = dataclasses.replace(
        a_record().environment, accelerators=[], cpu_model="AMD EPYC", cpu_cores=2, cpu_flags=["avx2"]
    )
    tensorflow = Named("tensorflow", "2.21.0")
    peak = run_peak("fp16", DeviceRef("gpu", 4, "Tesla V100-SXM2-16GB"), tensorflow, environment, devices=4)
    flops = Flops(per_image=2.3e10, achieved_per_s=1.0e14)
    assert add_utilisation(flops, peak) is None
    assert flops.peak_per_sec == pytest.approx(4 * 125e12) and flops.utilisation == pytest.approx(0.2)
    # no invented peak for a CPU (none measured here either)
    assert run_peak("fp16", DeviceRef("cpu", 1, "AMD EPYC"), tensorflow, environment, devices=1) is None


@pytest.mark.parametrize(
    "gpu, images_per_sec",
    [
        ("NVIDIA H200", 7950),
        ("NVIDIA H100 80GB HBM3", 7160),
        ("NVIDIA A100-SXM4-80GB", 3411),
        ("NVIDIA H100 PCIe", None),  # an anchor entry that says why there is none
        ("NVIDIA H200 NVL", None),
    ],
)
def test_each_gpu_gets_its_tuned_stacks_anchor_or_why_it_has_none(gpu, images_per_sec):
    from accelbench.analysis import peaks

    anchor = peaks.training_anchor(gpu)
    assert anchor is not None and anchor.images_per_sec == images_per_sec
    assert (anchor.source and anchor.stack) if images_per_sec else "lower power limit" in anchor.why_none
    assert peaks.training_anchor("NVIDIA A100-SXM4-40GB") is None and peaks.training_anchor("") is None


def test_a_gpu_run_is_held_against_the_anchor_and_the_bar(check, tmp_path):
    """The arithmetic of the standing, on a record of the CPU made to say it ran on one H200."""
    from accelbench.analysis import peaks

    anchor = dataclasses.asdict(peaks.training_anchor("NVIDIA H200"))
    source = json.loads(FIXTURE.read_text())
    (tmp_path / "records").mkdir()
    lines = []
    for precision, images_per_sec in (("bf16", 6360.0), ("fp16", 6996.0), ("fp32", 3180.0)):
        record = copy.deepcopy(source["records"][0])
        record["device"] = {**record["device"], "kind": "gpu", "count": 1, "name": "NVIDIA H200"}
        record["throughput"]["images_per_sec"] = images_per_sec
        path = tmp_path / "records" / f"torch_ref-{precision}.json"
        path.write_text(json.dumps({**source, "records": [record]}))
        lines.append(check.line_from_record("torch_ref", precision, path, subprocess.CompletedProcess([], 0), anchor))
    assert [line.anchor_share for line in lines] == pytest.approx([0.8, 0.88, 0.4])
    assert lines[0].text().endswith("; 80.0% of the per-GPU anchor")
    assert check.standings(lines, anchor) == ["standing torch_ref: best fp16 6996.0 img/s, 88.0% of 7,950 (meets the 85% bar)"]
    lines.pop(1)
    assert check.standings(lines, anchor) == ["standing torch_ref: best bf16 6360.0 img/s, 80.0% of 7,950 (below the 85% bar)"]
    assert check.standings(lines, None) == []
    assert check.anchor_text("NVIDIA H200", anchor).startswith("anchor: 7,950 img/s per GPU, NVIDIA's MXNet")


def test_the_levers_step_takes_the_selected_plugins_levers_or_those_given(check):
    torch_only = check.selected_levers(check.parse_args(["--out", "x", "--plugins", "torch_ref"]))
    assert torch_only and {plugin for plugin, _, _ in torch_only} == {"torch_ref"}
    assert torch_only[0] == ("torch_ref", "bf16", "cuda_graph=true")
    assert len(check.selected_levers(check.parse_args(["--out", "x"]))) == len(check.LEVERS)
    given = check.parse_args(["--out", "x", "--levers", "jax_flax:bf16:xla_flags=--a=1 --b=2; torch_ref:fp16:fused_sgd=true"])
    assert check.selected_levers(given) == [
        ("jax_flax", "bf16", "xla_flags=--a=1 --b=2"),
        ("torch_ref", "fp16", "fused_sgd=true"),
    ]
    command = check.lever_command("python", given.levers[0], given, 2, 300.0, Path("out.json"))
    assert command[command.index("--lever") + 1] == "xla_flags=--a=1 --b=2"
    assert [command[command.index(flag) + 1] for flag in ("--schedule", "--trials", "--blocks", "--block-time")] == [
        "lockstep",
        "2",
        "6",
        "2s",
    ]


def test_a_lever_pair_pays_both_start_ups_and_its_blocks_and_a_compile_more(check):
    args = check.parse_args(["--out", "x", "--lever-blocks", "5", "--lever-block-time", "3"])
    assert check.lever_pair_s("torch_ref", "fused_sgd=true", args) == 60.0 + 2 * 5 * 3
    assert check.lever_pair_s("jax_flax", "learning_rate_on_device=true", args) == 140.0 + 30
    assert check.lever_pair_s("torch_ref", "compile_mode=reduce-overhead", args) == 60.0 + 180.0 + 30


def test_a_lever_that_does_not_fit_the_budget_is_skipped_and_said(check, tmp_path, capsys):
    args = check.parse_args(["--out", str(tmp_path)])
    line = check.measure_lever(
        "python", ("jax_flax", "bf16", "learning_rate_on_device=true"), args, check.Budget(100.0), tmp_path
    )
    assert (line.status, line.reason) == ("skipped", "time budget spent")
    assert "lever jax_flax bf16 learning_rate_on_device=true: skipped time budget spent" in capsys.readouterr().out


@pytest.mark.parametrize(
    "a, ratio, ci, per_unit, expected",
    [
        ("torch_ref:resnet50 [lever cuda_graph=true]", 1.20, [1.10, 1.30], [1.1, 1.3], (1.20, (1.10, 1.30), "wins")),
        ("torch_ref:resnet50", 1.25, [1.20, 1.30], [1.2, 1.3], (0.8, (1 / 1.30, 1 / 1.20), "loses")),
        ("torch_ref:resnet50", 1.0, [0.95, 1.05], [0.97, 1.03, 1.0], (1.0, (1 / 1.05, 1 / 0.95), "undecided")),
        ("torch_ref:resnet50 [lever cuda_graph=true]", 1.2, [1.2, 1.2], [1.2], (1.2, None, "one pair (no interval)")),
    ],
)
def test_a_levers_line_is_its_speed_over_the_plugin_as_shipped(check, a, ratio, ci, per_unit, expected):
    """``accelbench compare`` orders the two runs as it finds them: the line turns the ratio (and
    its interval) to lever over shipped, and says wins/loses only where the interval says so."""
    other = "torch_ref:resnet50" if "lever" in a else "torch_ref:resnet50 [lever cuda_graph=true]"
    comparison = {"a": a, "b": other, "ratio": ratio, "ci95": ci, "per_unit": per_unit, "single_sample": len(per_unit) < 2}
    line = check.lever_from_comparison(("torch_ref", "bf16", "cuda_graph=true"), comparison, "records/x.json")
    want_ratio, want_ci, verdict = expected
    assert line.ratio == pytest.approx(want_ratio) and line.verdict == verdict and line.pairs == len(per_unit)
    assert (line.ci95 is None) if want_ci is None else line.ci95 == pytest.approx(want_ci)


@pytest.mark.slow
def test_a_dry_run_of_the_levers_step_decides_a_lever_and_tables_it(testplugins_path, tmp_path):
    """Steps twice as fast with the lever: two pairs (one degree of freedom) decide it even where the
    pairs' ratios differ by several percent on a noisy machine."""
    levers = "--steps levers --levers sleepy:fp32:scale=0.5 --lever-pairs 2 --lever-blocks 3 --lever-block-time 0.2"
    result = run_script(
        "--out", str(tmp_path), "--dry-run", "--device", "cpu", "--budget", "200", *levers.split(),
        env={"PYTHONPATH": str(testplugins_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("lever sleepy fp32 scale=0.5: ")]
    assert "over 2 pair(s): wins" in line, line
    [lever] = json.loads((tmp_path / "summary.json").read_text())["levers"]
    assert lever["ratio"] == pytest.approx(2.0, rel=0.05) and lever["ci95"][0] > 1
    records = json.loads((tmp_path / lever["record_file"]).read_text())["records"]
    assert [r["config"]["lever"] for r in records] == [{}, {"scale": 0.5}]
    rows = (tmp_path / "summary.md").read_text().splitlines()
    assert any(row.startswith("| sleepy | fp32 | `scale=0.5` | ") and row.endswith("| 2 | wins |") for row in rows), rows


@pytest.mark.parametrize(
    "name, expected",
    [
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "convolution"),
        ("void cudnn::bn_fw_tr_1C11_singleread<__nv_bfloat16, 512, true, 1, 2, 0>", "batch norm"),
        ("cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>", "matrix product"),
        ("void at::native::multi_tensor_apply_kernel<at::native::FusedSgdMathFunctor<float, 1>>", "optimizer update"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::direct_copy_kernel_cuda>", "copy and layout"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::launch_clamp_scalar>", "elementwise"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>", "reduction and loss"),
        ("aten::mkldnn_convolution", "convolution"),
        ("aten::native_batch_norm_backward", "batch norm"),
        ("aten::_fused_sgd_", "optimizer update"),
        ("aten::addmm", "matrix product"),
        ("aten::relu_", "elementwise"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"),
        ("void at::native::im2col_kernel<float>", "other"),
    ],
)
def test_a_kernel_is_filed_under_its_category_by_its_name(name, expected):
    spec = importlib.util.spec_from_file_location("torch_profile", PROFILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.category(name) == expected


@pytest.mark.framework
def test_the_torch_profile_sums_a_steps_time_by_category_at_each_precision(tmp_path):
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, str(PROFILE), "--out", str(tmp_path), "--device", "cpu", "--precisions", "fp32,bf16"]
        + ["--model", "resnet_small", "--batch", "4", "--image-size", "16", "--warmup", "1", "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "torch-profile.json").read_text())["results"]
    assert [results[p]["settings"]["autocast_dtype"] for p in ("fp32", "bf16")] == [None, "bfloat16"]
    for precision, result in results.items():
        categories = result["categories"]
        assert {"convolution", "batch norm", "optimizer update"} <= set(categories), (precision, categories)
        assert sum(c["share"] for c in categories.values()) == pytest.approx(1.0, abs=0.01)
        assert result["measured"] == "operators' own CPU time" and result["step_ms"] > 0
    assert done.stdout.startswith("fp32: ") and "\nbf16: " in done.stdout and "convolution" in done.stdout
