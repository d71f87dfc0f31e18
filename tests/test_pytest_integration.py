"""pytest-benchmark runs: the shipped benchmark module, the JSON hook, and the contract fixture."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from accelbench.authoring.contract import ContractViolation
from accelbench.records import validation


def run_pytest(testplugins_path, tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=str(testplugins_path))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )


@pytest.mark.slow
def test_benchmark_json_holds_valid_records_with_true_throughput(testplugins_path, tmp_path):
    out = tmp_path / "out.json"
    result = run_pytest(
        testplugins_path,
        tmp_path,
        "--pyargs",
        "accelbench.benchmarks",
        "--benchmark-only",
        "--benchmark-json",
        str(out),
        "--accelbench-backend",
        "sleepy:fixed-time",
        "--accelbench-batch-sizes",
        "8,16",
        "--accelbench-rounds",
        "20",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(out.read_text())
    records = document["accelbench"]["records"]
    assert [r["batch"]["global"] for r in records] == [8, 16]
    for record in records:
        assert validation.errors("result", record) == []
        # 20 ms steps, timed in the worker: the true rate within 2%
        assert record["throughput"]["images_per_sec"] == pytest.approx(record["batch"]["global"] / 0.020, rel=0.02)
        assert len(record["trials"][0]["step_times_s"]) == 20
        assert record["settings"]["timed_by"].startswith("pytest-benchmark")
        # the session worker's start-up to its first call's end; its energy is not metered, and says so
        startup = record["startup"]
        assert startup["worker_to_first_step_s"] > startup["first_step_s"] >= 0.020 and startup["trials"] == 1
        assert record["energy"]["joules"] is None and "session" in record["energy"]["reason"]
    bench = document["benchmarks"][0]
    # pytest-benchmark's own host-side timing: one 20 ms step plus the pipe round-trip to the worker
    # (under a millisecond on an idle machine, 1.3 ms once in CI on two loaded cores); a round
    # that timed no step, or two, is far outside
    assert bench["stats"]["rounds"] == 20 and 0.020 <= bench["stats"]["median"] < 0.025
    assert bench["extra_info"]["images_per_sec"] == records[0]["throughput"]["images_per_sec"]
    assert {"global_batch", "per_device_batch", "precision", "framework", "device"} <= set(bench["extra_info"])


@pytest.mark.framework
@pytest.mark.skipif(importlib.util.find_spec("mxnet") is None, reason="MXNet not installed")
def test_benchmark_module_on_a_real_framework_then_compare(testplugins_path, tmp_path, accelbench_cli):
    outs = []
    for name in ("first", "second"):
        out = tmp_path / f"{name}.json"
        result = run_pytest(
            testplugins_path,
            tmp_path,
            "--pyargs",
            "accelbench.benchmarks",
            "--benchmark-only",
            "--benchmark-json",
            str(out),
            "--accelbench-backend",
            "mxnet_ngc:resnet50",
            "--accelbench-image-size",
            "32",
            "--accelbench-rounds",
            "5",
        )
        assert result.returncode == 0, result.stdout + result.stderr
        [record] = json.loads(out.read_text())["accelbench"]["records"]
        assert record["framework"]["name"] == "mxnet" and record["status"] == "ok"
        outs.append(str(out))
    compared = accelbench_cli("compare", *outs, "--tolerance", "50%", "--json")
    # one pytest-benchmark record a side is one trial a side: its interval holds step-to-step noise
    # only, so even at ±50% nothing is decided (exit 3), and the note says why
    assert compared.returncode == 3, compared.stderr
    [comparison] = json.loads(compared.stdout)["comparisons"]
    assert comparison["a"] == "mxnet_ngc:resnet50 [first.json]"
    assert comparison["verdict"] == "undecided" and "one trial per side" in comparison["note"]


def test_contract_passes_for_a_good_backend_and_catches_an_async_step(testplugins_path, monkeypatch):
    from accelbench.authoring import contract

    monkeypatch.syspath_prepend(str(testplugins_path))
    record = contract.check_all("sleepy:fixed-time", options={"step_ms": 2})
    assert record.status == "ok"
    with pytest.raises(ContractViolation, match="look asynchronous"):
        contract.step_syncs("misbehaving:async-step", timed_steps=20)


@pytest.mark.slow
def test_the_contract_catches_work_that_spills_past_its_step(testplugins_path, monkeypatch):
    """Back to back a spilling step looks synced (each waits for the last one's work), so the
    step-time check passes it; a step after an idle pause returns early, and that is caught."""
    from accelbench.authoring import contract

    monkeypatch.syspath_prepend(str(testplugins_path))
    contract.step_syncs("misbehaving:spilling-step", timed_steps=20)
    with pytest.raises(ContractViolation, match="spills past step"):
        contract.work_stays_in_its_step("misbehaving:spilling-step")
    back_to_back, paused = contract.work_stays_in_its_step("sleepy:fixed-time", options={"step_ms": 20})
    assert paused >= 0.7 * back_to_back
    with pytest.raises(ContractViolation, match="run ended failed"):
        contract.record_validates("misbehaving:raises")


@pytest.mark.framework
@pytest.mark.skipif(importlib.util.find_spec("mxnet") is None, reason="MXNet not installed")
def test_contract_holds_for_mxnet_ngc(accelbench_contract):
    accelbench_contract.describes_without_framework("mxnet_ngc:resnet50")
    reasons = accelbench_contract.refuses_bad_config("mxnet_ngc:resnet50")
    assert any("GPU" in reason for reason in reasons)
    accelbench_contract.step_syncs("mxnet_ngc:resnet50", image_size=32, global_batch=4)


def test_the_main_jobs_install_carries_what_the_readmes_pytest_benchmark_tour_runs():
    """#66: the README's tour runs `pytest --pyargs accelbench.benchmarks` after the main job's
    install (`pip install -e '.[all]'`): that install must bring pytest and pytest-benchmark,
    not leave the shell's other pytest to answer."""
    import re
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    main_job = next(line for line in readme.splitlines() if line.startswith("python3 -m venv") and "accelbench run" in line)
    [extras] = re.findall(r"pip install -e '\.\[([a-z,]+)\]'", main_job)
    assert "pytest --pyargs accelbench.benchmarks --benchmark-only" in readme
    optional = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def installed_by(extra: str) -> set[str]:
        found = set()
        for text in optional[extra]:
            requirement = Requirement(text)
            found |= (
                {n for e in requirement.extras for n in installed_by(e)}
                if requirement.name == "accelbench"
                else {requirement.name}
            )
        return found

    brought = set().union(*(installed_by(e) for e in extras.split(",")))
    assert {"pytest", "pytest-benchmark"} <= brought, brought
