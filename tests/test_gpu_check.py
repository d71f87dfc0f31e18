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
    ],
)
def test_bad_steps_and_reference_sizes_are_refused(args, message):
    result = run_script("--out", "x", *args)
    assert result.returncode == 2 and message in result.stderr


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
    from accelbench import peaks

    peak = peaks.published(kind, name, precision, devices)
    assert (peak.flops_per_s / 1e12 if peak else None) == (pytest.approx(tflops) if tflops else None)
    if peak:
        assert "datasheet" in peak.source or "documentation" in peak.source


def test_a_gpu_record_gets_its_utilisation(monkeypatch, tmp_path):
    import dataclasses

    from accelbench.records import DeviceRef, Flops, Named, add_utilisation, run_peak
    from conftest import a_record

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
    from accelbench import peaks

    anchor = peaks.training_anchor(gpu)
    assert anchor is not None and anchor.images_per_sec == images_per_sec
    assert (anchor.source and anchor.stack) if images_per_sec else "lower power limit" in anchor.why_none
    assert peaks.training_anchor("NVIDIA A100-SXM4-40GB") is None and peaks.training_anchor("") is None


def test_a_gpu_run_is_held_against_the_anchor_and_the_bar(check, tmp_path):
    """The arithmetic of the standing, on a record of the CPU made to say it ran on one H200."""
    from accelbench import peaks

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
