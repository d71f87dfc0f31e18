"""``accelbench rerun``: a results file's configurations run again, then compared with now (#56)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import load_records


@pytest.fixture(scope="module")
def made_once(testplugins_path, tmp_path_factory):
    """One results file of a two-point sweep (2 trials each), made once for these tests."""
    out = tmp_path_factory.mktemp("then") / "then.json"
    env = {k: v for k, v in os.environ.items() if k != "ACCELBENCH_PLUGINS"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelbench",
            "run",
            "--backend",
            "sleepy:fixed-time",
            "--batch-sizes",
            "8,16",
            "--trials",
            "2",
            "--warmup-steps",
            "2",
            "--timed-steps",
            "10",
            "--option",
            "step_ms=5",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(testplugins_path)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return out.read_text()


def sweep(made_once, tmp_path):
    """This test's copy of the results file."""
    out = tmp_path / "then.json"
    out.write_text(made_once)
    return out


@pytest.mark.slow
def test_a_rerun_runs_the_same_configurations_and_compares_then_with_now(accelbench_cli, made_once, tmp_path):
    then = sweep(made_once, tmp_path)
    done = accelbench_cli("rerun", str(then), "-o", str(tmp_path / "now.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    before, after = load_records(then), load_records(tmp_path / "now.json")
    assert [r["config_hash"] for r in after] == [r["config_hash"] for r in before]
    assert done.stdout.count("rerun sleepy:fixed-time: the same config hash") == 2
    assert "sleepy:fixed-time then" in done.stdout and "unpaired trials" in done.stdout
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith(("lock ", "machine "))]  # same Python, same machine
    assert after[0]["environment"]["lock"] == before[0]["environment"]["lock"]


@pytest.mark.slow
def test_rerun_names_what_changed_in_the_lock_and_the_machine(accelbench_cli, made_once, tmp_path):
    then = sweep(made_once, tmp_path)
    document = json.loads(then.read_text())
    for record in document["records"]:
        environment = record["environment"]
        environment["cpu_model"] = "AMD EPYC 7B13"
        environment["cpu_flags"] = [f for f in environment["cpu_flags"] if not f.startswith("avx512")] + ["avx9"]
        for lock in (environment["lock"], environment["worker"]["lock"]):  # the host's, and the one its worker read
            lock["distributions"] = [p if not p.startswith("pluggy==") else "pluggy==0.1" for p in lock["distributions"]]
            lock["sha256"] = "0" * 64
    then.write_text(json.dumps(document))
    done = accelbench_cli(
        "rerun", str(then), "--record", document["records"][1]["config_hash"][:10], "-o", str(tmp_path / "now.json")
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(load_records(tmp_path / "now.json")) == 1
    assert "lock pluggy 0.1 -> " in done.stdout
    assert "machine cpu_model: AMD EPYC 7B13 -> " in done.stdout
    assert "machine cpu_flags: lost avx9; gained " in done.stdout


@pytest.mark.slow  # makes a worker environment with pip
def test_a_framework_at_another_version_is_pinned_for_the_rerun(accelbench_cli, made_once, tmp_path):
    then = sweep(made_once, tmp_path)
    document = json.loads(then.read_text())
    document["records"] = document["records"][:1]
    document["records"][0]["environment"]["packages"]["fakeframework"] = "1.0"
    then.write_text(json.dumps(document))
    done = accelbench_cli("rerun", str(then), "--no-create-env", "-o", str(tmp_path / "now.json"))
    assert "rerun sleepy:fixed-time: the same config hash, pinned fakeframework==1.0" in done.stdout, done.stderr
    [record] = load_records(tmp_path / "now.json")
    # an environment with the pin added, which --no-create-env does not make
    assert record["status"] == "unavailable" and "--no-create-env" in record["reason"]


def test_a_record_named_by_no_hash_is_refused_in_one_line(accelbench_cli, made_once, tmp_path):
    then = sweep(made_once, tmp_path)
    done = accelbench_cli("rerun", str(then), "--record", "ffffffff", "-o", str(tmp_path / "now.json"))
    assert done.returncode == 2 and done.stderr.startswith("error: --record 'ffffffff' matches no record")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "now.json").exists()


@pytest.mark.slow
def test_a_sweeps_machine_differences_print_once(accelbench_cli, made_once, tmp_path):
    then = sweep(made_once, tmp_path)
    document = json.loads(then.read_text())
    for record in document["records"]:
        record["environment"]["cpu_cores"] = 96
    then.write_text(json.dumps(document))
    done = accelbench_cli("rerun", str(then), "-o", str(tmp_path / "now.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(load_records(tmp_path / "now.json")) == 2
    assert [line for line in done.stdout.splitlines() if line.startswith("machine ")] == [
        f"machine cpu_cores: 96 -> {os.cpu_count()}"
    ]
