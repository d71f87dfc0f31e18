"""The host end to end, through the installed CLI and a third-party plugin distribution."""

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import load_records, start_with_a_hang

BUILTINS = {"tf_benchmarks", "mxnet_ngc", "tpu_official"}


def test_plugins_lists_builtins_and_thirdparty(accelbench_cli):
    result = accelbench_cli("plugins")
    assert result.returncode == 0, result.stderr
    listing = {p["name"]: p for p in json.loads(result.stdout)}
    assert BUILTINS | {"sleepy", "misbehaving"} <= set(listing)
    sleepy = listing["sleepy"]
    assert sleepy["version"] == "1.2.3"
    assert [b["id"] for b in sleepy["backends"]] == ["sleepy:fixed-time"]
    missing = next(b for b in listing["misbehaving"]["backends"] if b["name"] == "needs-framework")
    assert missing["available"] is False and "accelbench_nonexistent_framework" in missing["reason"]


def test_listing_plugins_imports_no_framework(testplugins_path):
    code = (
        "import sys, contextlib, io\n"
        "from accelbench.cli import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['plugins'], standalone_mode=False)\n"
        "print(sorted(m for m in ('tensorflow', 'mxnet', 'tf_keras', 'keras', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(testplugins_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == "[]"


def test_allow_list_restricts_loaded_plugins(accelbench_cli):
    result = accelbench_cli("plugins", plugins="sleepy,tf_benchmarks")
    assert {p["name"] for p in json.loads(result.stdout)} == {"sleepy", "tf_benchmarks"}


@pytest.mark.slow
def test_thirdparty_images_per_sec_matches_true_step_time(accelbench_cli, tmp_path):
    out = tmp_path / "r.json"
    result = accelbench_cli(
        "run",
        "--plugin",
        "sleepy",
        "--global-batch",
        "16",
        "--warmup-steps",
        "3",
        "--timed-steps",
        "60",
        "--option",
        "step_ms=25",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    [record] = load_records(out)
    assert record["status"] == "ok"
    truth = 16 / 0.025
    assert record["throughput"]["images_per_sec"] == pytest.approx(truth, rel=0.02)
    assert record["throughput"]["images"] == 16 * 60
    assert len(record["trials"][0]["step_times_s"]) == 60
    assert record["plugin"] == {"name": "sleepy", "version": "1.2.3"}
    low, high = record["throughput"]["ci95"]
    assert low <= record["throughput"]["images_per_sec"] <= high
    assert accelbench_cli("validate", str(out)).returncode == 0


@pytest.mark.slow
def test_each_trial_records_what_its_timed_steps_cost_the_worker(accelbench_cli, tmp_path):
    """The sleepy backend's step busy-waits on one thread: the worker's CPU time over the timed
    steps must be their wall time, give or take the scheduler."""
    out = tmp_path / "r.json"
    result = accelbench_cli(
        "run",
        "--plugin",
        "sleepy",
        "--backend",
        "sleepy:fixed-time",
        "--global-batch",
        "4",
        "--warmup-steps",
        "2",
        "--timed-steps",
        "40",
        "--option",
        "step_ms=25",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    [trial] = load_records(out)[0]["trials"]
    cpu = trial["process"]["cpu_user_s"] + trial["process"]["cpu_system_s"]
    assert 0.8 * trial["wall_time_s"] <= cpu <= 1.25 * trial["wall_time_s"], (cpu, trial["wall_time_s"])
    assert trial["process"]["minor_page_faults"] >= 0


@pytest.mark.slow
def test_trials_run_in_separate_processes_and_bootstrap_over_trials(accelbench_cli, tmp_path):
    out = tmp_path / "r.json"
    result = accelbench_cli(
        "run",
        "--backend",
        "sleepy:fixed-time",
        "--trials",
        "3",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "10",
        "--option",
        "step_ms=5",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    [record] = load_records(out)
    assert [t["index"] for t in record["trials"]] == [0, 1, 2]
    assert record["throughput"]["ci_method"] == "t-interval on log trial rates"
    assert record["throughput"]["images"] == 3 * 10 * 8


FAILURES = {
    "raises": ("failed", "RuntimeError: deliberate failure"),
    "exits": ("failed", "exited with code 3"),
    "segfaults": ("failed", "killed by SIGSEGV"),
    "hangs": ("timeout", "no result within the 8 s timeout"),
    "oom": ("failed", "MB limit (--memory-limit-mb), during run"),
    "needs-gpu": ("unavailable", "no GPU here"),
    "needs-framework": ("unavailable", "nonexistent is not installed"),
}


@pytest.mark.slow
@pytest.mark.parametrize("schedule, phase", [("interleaved", "run"), ("lockstep", "step")])
def test_every_failure_becomes_a_record_and_other_runs_go_on(accelbench_cli, tmp_path, schedule, phase):
    """In fresh trials and in lockstep pairs alike (where the failing backends fail in their
    first step, as their sides start, before any block, and the fixed-time backend goes on alone)."""
    out = tmp_path / "r.json"
    started = time.monotonic()
    result = accelbench_cli(
        "run",
        "--plugin",
        "misbehaving",
        "--plugin",
        "sleepy",
        "--timeout",
        "8",
        "--schedule",
        schedule,
        # 1 GB, not 2: the oom backend's pages reach it in half the faults, which
        # the 8 s timeout absorbs on a balloon VM whose faults are slow under load
        "--memory-limit-mb",
        "1024",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "5",
        "-o",
        str(out),
    )
    assert time.monotonic() - started < 60
    assert result.returncode == 1  # some runs failed
    by_backend = {r["backend"]["name"]: r for r in load_records(out)}
    for name, (status, reason) in FAILURES.items():
        assert by_backend[name]["status"] == status, by_backend[name]["reason"]
        assert reason.replace("during run", f"during {phase}") in by_backend[name]["reason"]
        assert by_backend[name]["throughput"] is None
    assert by_backend["fixed-time"]["status"] == "ok"
    assert accelbench_cli("validate", str(out)).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--plugin", "nope"], "unknown plugin 'nope'"),
        (["--backend", "sleepy:nope"], "unknown backend 'sleepy:nope'"),
        (["--plugin", "sleepy", "--global-batch", "0"], "invalid config: --global-batch must be at least 1 (got 0)"),
        (["--plugin", "sleepy", "--global-batch", "9", "--device-count", "2"], "global batch 9 does not divide by 2 devices"),
        (
            ["--plugin", "sleepy", "--precision", "fp8"],
            "precision 'fp8': no selected backend offers it (precisions offered: sleepy:fixed-time: fp32, bf16)",
        ),
        (
            ["--plugin", "sleepy", "--model", "mlp"],
            "model 'mlp': no selected backend offers it (models offered: sleepy:fixed-time: resnet50)",
        ),
        (
            ["--plugin", "sleepy", "--variant", "v2"],
            "variant 'v2': no selected backend offers it (variants offered: sleepy:fixed-time: v1, v1.5)",
        ),
        (
            ["--plugin", "sleepy", "--device", "tpu"],
            "device 'tpu': no selected backend offers it (devices offered: sleepy:fixed-time: cpu)",
        ),
        (["--plugin", "sleepy", "--model", "bad name"], "--model must match"),
        (["--plugin", "sleepy", "--batch-sizes", "8,x"], "--batch-sizes must be comma-separated integers"),
        (["--plugin", "sleepy", "--option", "novalue"], "--option must be KEY=VALUE"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(accelbench_cli, tmp_path, args, message):
    out = tmp_path / "r.json"
    result = accelbench_cli("run", *args, "-o", str(out))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not out.exists() and not list(tmp_path.glob("results*"))


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "--config {tmp}/c.json: not JSON (Expecting property name"),
        ('{"precision": "fp64"}', "precision 'fp64': no selected backend offers it"),
        ('{"precision": "fp 64"}', "--precision must match ^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$ (got 'fp 64')"),
        ('{"warmup_steps": 1, "colour": "red"}', "--config {tmp}/c.json: 'colour' is not a run field"),
    ],
)
def test_bad_config_file_is_refused(accelbench_cli, tmp_path, content, message):
    config = tmp_path / "c.json"
    config.write_text(content)
    result = accelbench_cli("run", "--plugin", "sleepy", "--config", str(config), "-o", str(tmp_path / "r.json"))
    assert result.returncode == 2 and message.replace("{tmp}", str(tmp_path)) in result.stderr, result.stderr
    assert not (tmp_path / "r.json").exists()


def test_toml_config_file_with_flag_override(accelbench_cli, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("per_device_batch = 4\nwarmup_steps = 1\ntimed_steps = 5\n[options]\nstep_ms = 2\n")
    out = tmp_path / "r.json"
    result = accelbench_cli("run", "--plugin", "sleepy", "--config", str(config), "--timed-steps", "7", "-o", str(out))
    assert result.returncode == 0, result.stderr
    [record] = load_records(out)
    assert record["batch"] == {"global": 4, "per_device": 4, "source": "config", "semantics": "per_device"}
    assert record["steps"]["timed"] == 7 and record["settings"]["step_s"] == 0.002


def test_ctrl_c_keeps_finished_records(testplugins_path, tmp_path):
    proc, out, _ = start_with_a_hang(testplugins_path, tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "kept 1 finished record" in err
    [record] = load_records(out)
    assert record["backend"]["name"] == "fixed-time" and record["status"] == "ok"
