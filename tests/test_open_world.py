"""An open plugin world: a framework, model, variants, precision and engine core has never heard
of (``tests/openworld``, a numpy MLP with its own all-reduce), and plugins that break the contract.

Everything goes through the installed command, as a user of a third-party plugin would run it.
"""

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import load_records

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--image-size", "16", "--num-classes", "10", "--warmup-steps", "2", "--timed-steps", "30"]


@pytest.fixture
def toy_cli(openworld_path, tmp_path):
    def run(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(openworld_path), **(env or {}))
        env.pop("ACCELBENCH_PLUGINS", None)
        return subprocess.run(
            [sys.executable, "-m", "accelbench", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout
        )

    return run


@pytest.mark.slow
def test_a_model_variant_and_precision_of_its_own(toy_cli, tmp_path):
    out = tmp_path / "r.json"
    done = toy_cli("run", "--plugin", "toy", "--model", "mlp", "--variant", "wide", "--precision", "fp64", *TINY, "-o", str(out))
    assert done.returncode == 0, done.stderr
    [record] = load_records(out)
    assert record["status"] == "ok", record["reason"]
    assert record["model"] == {"name": "mlp", "variant": "wide"} and record["precision"] == "fp64"
    assert record["settings"]["dtype"] == "float64" and record["settings"]["layers"] == 2
    # provenance without the plugin saying: the version of the distribution of its first module
    assert record["framework"] == {"name": "numpy", "version": metadata.version("numpy")}
    assert record["environment"]["packages"]["accelbench-toy"] == "0.3.0"
    assert record["throughput"]["images_per_sec"] == pytest.approx(32 * 30 / record["throughput"]["wall_time_s"])
    losses = record["trials"][0]["losses"]
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])  # SGD on a fixed batch: the loss falls
    assert toy_cli("validate", str(out)).returncode == 0


@pytest.mark.slow
def test_defaults_come_from_the_backend_and_a_model_without_variants_has_none(toy_cli, tmp_path):
    first, linear = tmp_path / "first.json", tmp_path / "linear.json"
    assert toy_cli("run", "--plugin", "toy", *TINY, "-o", str(first)).returncode == 0
    [record] = load_records(first)
    assert (record["model"], record["precision"]) == ({"name": "mlp", "variant": "narrow"}, "fp64")
    assert record["batch"] == {"global": 32, "per_device": 32, "source": "backend default", "semantics": "per_device"}
    assert toy_cli("run", "--plugin", "toy", "--model", "linear", "--precision", "fp32", *TINY, "-o", str(linear)).returncode == 0
    [record] = load_records(linear)
    assert record["model"] == {"name": "linear", "variant": None} and record["settings"]["dtype"] == "float32"
    assert record["settings"]["layers"] == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--model", "linear", "--variant", "wide"],
            "variant 'wide': no selected backend offers it (variants offered: toy:mlp-sgd: none)",
        ),
        (["--model", "resnet50"], "model 'resnet50': no selected backend offers it (models offered: toy:mlp-sgd: mlp, linear)"),
        (
            ["--precision", "bf16"],
            "precision 'bf16': no selected backend offers it (precisions offered: toy:mlp-sgd: fp64, fp32)",
        ),
    ],
)
def test_a_request_the_backend_does_not_offer_is_one_line_listing_what_it_does(toy_cli, tmp_path, args, message):
    done = toy_cli("run", "--plugin", "toy", *args, "-o", str(tmp_path / "r.json"))
    assert done.returncode == 2 and done.stderr == f"error: {message}\n"
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_two_workers_on_the_plugins_own_engine(toy_cli, tmp_path):
    out = tmp_path / "r.json"
    done = toy_cli(
        "run",
        "--plugin",
        "toy",
        "--workers",
        "2",
        "--per-device-batch",
        "16",
        "--threads",
        "1",
        "--schedule",
        "sequential",
        *TINY,
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    baseline, merged = load_records(out)
    assert baseline["status"] == merged["status"] == "ok", merged["reason"]
    dist = merged["distributed"]
    assert dist["engine"] == "toy_allreduce" and dist["workers"] == 2
    # gradients averaged every step from the same initial weights: both workers end identical
    checksums = {w["final"]["weights_checksum"] for w in dist["per_worker"]}
    assert len(checksums) == 1
    assert merged["throughput"]["images"] == 2 * 16 * 30
    assert dist["baseline_images_per_sec"] == baseline["throughput"]["images_per_sec"]
    assert dist["scaling_efficiency"] == pytest.approx(
        merged["throughput"]["images_per_sec"] / (2 * baseline["throughput"]["images_per_sec"])
    )


def test_broken_plugins_are_listed_with_their_errors_and_never_stop_the_others(toy_cli):
    done = toy_cli("plugins")
    assert done.returncode == 0, done.stderr
    listing = {p["name"]: p for p in json.loads(done.stdout)}
    assert listing["exploding"]["error"] == "register_backends raised RuntimeError: registrar exploded"
    broken = listing["broken"]["error"]
    assert "backend 'wrong-types': models must be a tuple of names, not str" in broken
    assert "variants name model 'cnn', which is not in models" in broken
    assert "registered str, which is not an accelbench.Backend" in broken
    assert {b["name"] for b in listing["broken"]["backends"]} == {"bad-prepared", "bad-record", "unpicklable"}
    assert listing["toy"]["error"] == "" and listing["toy"]["backends"][0]["engine"] == "toy_allreduce"


@pytest.mark.slow
def test_a_contract_breach_in_a_run_is_a_failed_record_and_the_next_backend_runs(toy_cli, tmp_path):
    out = tmp_path / "r.json"
    done = toy_cli(
        "run",
        "--backend",
        "broken:bad-prepared",
        "--backend",
        "broken:bad-record",
        "--backend",
        "broken:unpicklable",
        "--backend",
        "toy:mlp-sgd",
        "--schedule",
        "sequential",
        *TINY,
        "-o",
        str(out),
    )
    assert done.returncode == 1, done.stderr  # failed runs: exit 1, with every record written
    assert "Traceback" not in done.stderr
    typed, bad, unpicklable, good = load_records(out)
    assert typed["status"] == "failed" and typed["throughput"] is None
    assert typed["reason"].startswith("ContractError: prepare() broke the contract: device_name must be a string")
    assert bad["status"] == "failed" and bad["throughput"] is None and bad["flops"] is None
    assert bad["reason"].startswith("the backend's results broke the result schema: $.flops.per_image: -5.0 is less than")
    assert unpicklable["status"] == "failed"
    assert "cannot be sent to its worker process: pickling it raised TypeError" in unpicklable["reason"]
    assert good["status"] == "ok"
    assert toy_cli("validate", str(out)).returncode == 0


# what the built-in plugins bring, and what this test distribution brings: core knows neither
# (the launchers core reads a rank from are named: torchrun, its TORCHELASTIC_* variables, Kubeflow's PyTorchJob)
BUILT_IN_NAMES = r"tensorflow|tf_keras|keras|mxnet|gluon|tf_config|TF_CONFIG|dmlc|DMLC|ps-lite|torch(?!run|elastic|job)|jax"
OPEN_WORLD_NAMES = r"accelbench_toy|toy_allreduce|\bmlp\b|\bfp64\b|TOY_"


@pytest.mark.parametrize("pattern", [BUILT_IN_NAMES, OPEN_WORLD_NAMES])
def test_core_and_schemas_name_no_framework_and_no_engine(pattern):
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in ("core", "schemas")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".json") and "data" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(pattern, line, re.IGNORECASE)
    ]
    assert found == []


@pytest.mark.slow
def test_a_measured_peak_gives_every_later_record_its_utilisation(toy_cli, tmp_path):
    """accelbench peak times the plugin's matrix product in a worker; a later run's record is
    measured against it, on this machine only."""
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = toy_cli("peak", "--plugin", "toy", "--size", "128", "--repeats", "2", env=cache)
    assert done.returncode == 0, done.stderr
    stored = json.loads((tmp_path / "cache" / "accelbench" / "peaks.json").read_text())["measurements"]
    assert [(m["framework"], m["precision"], m["size"]) for m in stored] == [("numpy", "fp64", 128), ("numpy", "fp32", 128)]
    fp64 = stored[0]
    assert fp64["flops_per_s"] > 0 and fp64["device_kind"] == "cpu"
    done = toy_cli(
        "run", "--plugin", "toy", "--timed-steps", "5", "--warmup-steps", "1", "-o", str(tmp_path / "r.json"), env=cache
    )
    assert done.returncode == 0, done.stderr
    [record] = load_records(tmp_path / "r.json")
    flops = record["flops"]
    assert flops["peak_per_sec"] == fp64["flops_per_s"]
    assert flops["utilisation"] == pytest.approx(flops["achieved_per_s"] / fp64["flops_per_s"])
    assert flops["peak_source"].startswith("measured on this machine by accelbench peak")
    assert "numpy" in flops["peak_source"] and "128x128 fp64" in flops["peak_source"]
    # another machine's measurement is not this one's peak
    for m in stored:
        m["machine"] = "another CPU / 64 cores / flags 000000000000"
    (tmp_path / "cache" / "accelbench" / "peaks.json").write_text(json.dumps({"measurements": stored}))
    done = toy_cli(
        "run", "--plugin", "toy", "--timed-steps", "5", "--warmup-steps", "1", "-o", str(tmp_path / "r2.json"), env=cache
    )
    [record] = load_records(tmp_path / "r2.json")
    assert "peak_per_sec" not in record["flops"]


@pytest.fixture(scope="session")
def env_cache(tmp_path_factory):
    """One cache of worker environments for this session's environment tests."""
    return {"XDG_CACHE_HOME": str(tmp_path_factory.mktemp("envcache"))}


@pytest.mark.slow
def test_a_backend_runs_in_its_own_environment_with_its_own_package_versions(toy_cli, tmp_path, env_cache):
    """The host has six 1.17 (its frameworks' dependency); the backend declares six==1.16.0."""
    from importlib import metadata

    assert metadata.version("six") != "1.16.0"
    done = toy_cli(
        "run", "--plugin", "pinned", "--timed-steps", "5", "--warmup-steps", "1", "-o", str(tmp_path / "r.json"), env=env_cache
    )
    assert done.returncode == 0, done.stderr
    assert "making a worker environment for six==1.16.0" in done.stderr and "environment ready in" in done.stderr
    assert "  installing six==1.16.0" in done.stderr and "  installed: six 1.16.0" in done.stderr
    [record] = load_records(tmp_path / "r.json")
    assert record["status"] == "ok", record["reason"]
    worker = record["environment"]["worker"]
    assert worker["kind"] == "environment" and worker["requirements"] == ["six==1.16.0"]
    assert worker["packages"]["six"] == "1.16.0" == record["environment"]["packages"]["six"]
    assert record["framework"]["version"] == "1.16.0"  # read by the backend in its worker
    assert record["settings"]["six_file"].startswith(env_cache["XDG_CACHE_HOME"])
    # the second run finds the environment made
    again = toy_cli(
        "run", "--plugin", "pinned", "--timed-steps", "3", "--warmup-steps", "1", "-o", str(tmp_path / "r2.json"), env=env_cache
    )
    assert again.returncode == 0 and "making a worker environment" not in again.stderr
    listed = toy_cli("env", "list", env=env_cache)
    assert worker["key"] in listed.stdout and "six==1.16.0" in listed.stdout and "[six 1.16.0]" in listed.stdout


@pytest.mark.slow
def test_an_environment_that_cannot_be_made_is_unavailable_with_the_installers_reason(toy_cli, tmp_path, env_cache):
    done = toy_cli(
        "run",
        "--plugin",
        "pinned",
        "--plugin",
        "toy",
        "--env",
        "accelbench-no-such-package==9.9",
        "--timed-steps",
        "3",
        "--warmup-steps",
        "1",
        "-o",
        str(tmp_path / "r.json"),
        env=env_cache,
    )
    records = load_records(tmp_path / "r.json")
    assert [r["status"] for r in records] == ["unavailable", "unavailable"]
    for record in records:  # the installer's own line
        assert record["reason"].startswith("no worker environment: installing ")
        assert record["reason"].endswith("failed: ERROR: No matching distribution found for accelbench-no-such-package==9.9")
    assert done.returncode == 0  # unavailable is not a failure
    env_root = Path(env_cache["XDG_CACHE_HOME"]) / "accelbench" / "envs"
    assert not list(env_root.glob("*.partial"))


@pytest.mark.slow
def test_an_env_matrix_gives_one_record_per_version_and_compare_pairs_them(toy_cli, tmp_path, env_cache):
    done = toy_cli(
        "run",
        "--plugin",
        "pinned",
        "--env",
        "six==1.16.0",
        "--env",
        "six==1.17.0",
        "--trials",
        "3",
        "--timed-steps",
        "5",
        "--warmup-steps",
        "1",
        "-o",
        str(tmp_path / "r.json"),
        env=env_cache,
    )
    assert done.returncode == 0, done.stderr
    old, new = load_records(tmp_path / "r.json")
    assert (old["framework"]["version"], new["framework"]["version"]) == ("1.16.0", "1.17.0")
    assert old["environment"]["worker"]["added"] == ["six==1.16.0"]
    assert old["schedule"]["run_id"] == new["schedule"]["run_id"]  # one lockstep run: paired by pair
    compared = toy_cli("compare", str(tmp_path / "r.json"), "--json")
    [pair] = json.loads(compared.stdout)["comparisons"]
    assert {pair["a"], pair["b"]} == {"pinned:pinned [six==1.16.0]", "pinned:pinned [six==1.17.0]"}
    assert pair["samples"] == "3 pairs (lockstep)"


@pytest.mark.slow
def test_run_with_peak_measures_the_frameworks_peak_first_and_the_record_carries_its_utilisation(toy_cli, tmp_path):
    out, cache = tmp_path / "r.json", tmp_path / "cache"
    fresh = toy_cli("run", "--plugin", "toy", *TINY, "-o", str(tmp_path / "before.json"), env={"XDG_CACHE_HOME": str(cache)})
    assert fresh.returncode == 0 and "`accelbench peak` measures" in fresh.stdout  # no peak yet: the note says how
    [before] = load_records(tmp_path / "before.json")
    assert "utilisation" not in before["flops"] and "accelbench peak" in before["flops"]["peak_reason"]
    done = toy_cli("run", "--plugin", "toy", *TINY, "--peak", "-o", str(out), env={"XDG_CACHE_HOME": str(cache)})
    assert done.returncode == 0, done.stderr
    [record] = load_records(out)
    assert record["flops"]["utilisation"] > 0 and "measured" in record["flops"]["peak_source"]
    assert "peak_reason" not in record["flops"]
    assert (cache / "accelbench").exists()


# -- what each record's worker ran, read in that worker, on every path that starts workers (#70) --

SHORT = ["--timed-steps", "5", "--warmup-steps", "1"]
#: every way a run starts its workers: a new path gets a line here, or its records go unchecked
WORKER_PATHS = {
    "sequential": ["run", "--plugin", "pinned", "--schedule", "sequential", "--trials", "2", *SHORT],
    "interleaved": ["run", "--plugin", "pinned", "--plugin", "toy", "--schedule", "interleaved", *SHORT, *TINY[:4]],
    "lockstep": [
        "run",
        "--plugin",
        "pinned",
        "--plugin",
        "toy",
        "--schedule",
        "lockstep",
        "--blocks",
        "2",
        "--block-time",
        "0.2",
        *TINY[:4],
    ],
    "multi-worker": ["run", "--plugin", "toy", "--workers", "2", "--threads", "1", "--schedule", "sequential", *TINY],
    "pytest-benchmark": ["pytest-benchmark"],
    "rerun": ["rerun"],
}


def assert_names_what_its_worker_read(record: dict) -> None:
    """The worker block read in the worker: its Python's version and lock; ``packages`` names the
    worker's versions, and the environment's six (1.16.0) where the worker ran there."""
    environment, worker = record["environment"], record["environment"]["worker"]
    assert worker["python_version"] and worker["lock"]["sha256"], worker
    read = dict(pin.split("==", 1) for pin in worker["lock"]["distributions"])
    if worker["kind"] == "environment":
        assert read["six"] == "1.16.0" == environment["packages"]["six"] == worker["packages"]["six"]
        assert worker["lock"]["sha256"] != environment["lock"]["sha256"]  # not the host's
    else:
        assert worker["kind"] == "host" and worker["lock"]["sha256"] == environment["lock"]["sha256"]
        assert read["six"] == metadata.version("six") != "1.16.0"
    for name, version in worker["packages"].items():
        assert environment["packages"][name] == version


@pytest.mark.slow
@pytest.mark.parametrize("path", WORKER_PATHS)
def test_every_path_records_the_packages_and_lock_its_worker_read(path, toy_cli, openworld_path, tmp_path, env_cache):
    out = tmp_path / "r.json"
    if path == "pytest-benchmark":
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "accelbench.benchmarks"]
            + ["--benchmark-only", "--benchmark-json", str(out), "--accelbench-backend", "pinned:pinned"]
            + ["--accelbench-batch-sizes", "4", "--accelbench-rounds", "3"],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(openworld_path), **env_cache),
            cwd=tmp_path,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        records = json.loads(out.read_text())["accelbench"]["records"]
    elif path == "rerun":
        first = toy_cli(*WORKER_PATHS["lockstep"], "-o", str(tmp_path / "first.json"), env=env_cache)
        assert first.returncode == 0, first.stderr
        pinned = next(r for r in load_records(tmp_path / "first.json") if r["backend"]["name"] == "pinned")
        done = toy_cli(
            "rerun", str(tmp_path / "first.json"), "--record", pinned["config_hash"][:12], "-o", str(out), env=env_cache
        )
        assert done.returncode == 0, done.stdout + done.stderr
        # the environment as the record's worker had it (its lock), not the host's six 1.17
        assert "pinned six==1.16.0" in done.stdout.replace("\n", " ") or "six==1.16.0" in done.stdout, done.stdout
        records = load_records(out)
    else:
        done = toy_cli(*WORKER_PATHS[path], "-o", str(out), env=env_cache)
        assert done.returncode == 0, done.stderr
        records = load_records(out)
    assert records and all(r["status"] == "ok" for r in records), [r["reason"] for r in records]
    for record in records:
        assert_names_what_its_worker_read(record)
    if path in ("lockstep", "interleaved"):
        assert {r["environment"]["worker"]["kind"] for r in records} == {"environment", "host"}
