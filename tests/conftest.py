import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_report_header(config):
    """The machine the suite runs on, first in its output: the README's test line gives the suite's
    time per CPU kind, and a CI log's time means nothing without the machine that took it."""
    from accelbench.environments.machine import cpu_flags, cpu_model

    flags = cpu_flags()
    bf16 = "bf16 in AMX" if "amx_bf16" in flags else "bf16 in AVX-512" if "avx512_bf16" in flags else "bf16 emulated"
    return f"machine: {cpu_model()}, {len(os.sched_getaffinity(0))} CPUs, {bf16}"


#: markers that name one framework; each implies ``framework``, so that the fast subset,
#: ``pytest -m "not framework and not slow"``, leaves every test that starts one out
FRAMEWORK_MARKERS = ("tf", "mxnet", "torch", "jax")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(item.get_closest_marker(name) for name in FRAMEWORK_MARKERS):
            item.add_marker(pytest.mark.framework)


@pytest.fixture(autouse=True)
def _temporary_files_kept_by_pytest(tmp_path_factory, monkeypatch):
    """The host's and the workers' temporary files (a failed worker's log, which its record names
    and so the host keeps; a job's scratch directory) go to a folder of pytest's, which it prunes,
    not to the machine's /tmp, where every test session would leave its failure logs."""
    folder = str(tmp_path_factory.mktemp("tempfiles"))
    monkeypatch.setenv("TMPDIR", folder)
    monkeypatch.setattr(tempfile, "tempdir", folder)


@pytest.fixture(scope="session")
def testplugins_path(tmp_path_factory) -> Path:
    """The third-party test plugin distribution, pip-installed into its own folder for this session."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(target),
            str(HERE / "thirdparty"),
        ],
        check=True,
        cwd=tmp_path_factory.mktemp("build"),
    )
    return target


@pytest.fixture(scope="session")
def openworld_path(tmp_path_factory) -> Path:
    """``openworld/``: a framework, model, variants, precision and engine core has never heard of,
    plus plugins that break the contract; pip-installed into a folder of its own for this session
    (kept off the other tests' path, so their runs of every backend stay as they were)."""
    target = tmp_path_factory.mktemp("openworld")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(target),
            str(HERE / "openworld"),
        ],
        check=True,
        cwd=tmp_path_factory.mktemp("build"),
    )
    return target


@pytest.fixture
def accelbench_cli(testplugins_path, tmp_path):
    """Run the installed ``accelbench`` command with the test plugins on the path."""

    def run(*args: str, plugins: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(testplugins_path))
        env.pop("ACCELBENCH_PLUGINS", None)
        if plugins is not None:
            env["ACCELBENCH_PLUGINS"] = plugins
        return subprocess.run(
            [sys.executable, "-m", "accelbench", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout
        )

    return run


def load_records(path: Path) -> list[dict]:
    return json.loads(Path(path).read_text())["records"]


def executed(plans) -> list[dict]:
    """Run the plans through the host as ``accelbench run`` does; their records' JSON form."""
    from accelbench.execution import runner
    from accelbench.records import results as records

    return [record.to_json() for record in runner.execute(plans, records.check_all)]


def a_record(**changes):
    """A real, typed record (the 1.10.0 fixture's first: the fixed-time backend at batch 8) with
    these fields replaced, for tests that give core known inputs."""
    import dataclasses

    from accelbench.records.results import Record

    fixture = Path(__file__).parent / "fixtures" / "records-1.10.0.json"
    return dataclasses.replace(Record.from_json(json.loads(fixture.read_text())["records"][0]), **changes)


def throughput_of(images_per_sec: float):
    """A record's throughput block holding just this rate (no interval: one sample)."""
    from accelbench.records.results import Throughput

    return Throughput(images_per_sec, 100, 100 / images_per_sec, (images_per_sec, images_per_sec), "one sample")


def run_backend(plugin: str, **config) -> dict:
    """Run one built-in backend through the host (worker process, timing loop) and return its
    schema-checked record in its JSON form, as a results file holds it. Small shapes by default,
    so tests take seconds."""
    from accelbench.execution import runner
    from accelbench.planning.config import RunConfig
    from accelbench.records import results as records
    from accelbench.registry import PluginHost

    defaults = dict(image_size=32, num_classes=10, global_batch=8, warmup_steps=1, timed_steps=5)
    refs = PluginHost().select([plugin])
    [record] = runner.execute(runner.plan(refs, RunConfig(**{**defaults, **config})), records.check_all)
    return record.to_json()


def assert_cpu_footprint(record: dict) -> None:
    """A framework's CPU record says what it cost besides time (#56): the worker's peak memory (a
    framework and ResNet weights: over 100 MiB), no device figure because the device is the host,
    a start-up that ends after the first step, and energy or the reason there is none."""
    memory, startup, spent = record["memory"], record["startup"], record["energy"]
    assert memory["host_peak_bytes"] > 100 * 2**20 and memory["device_peak_bytes"] is None
    assert memory["device_reason"] == "a CPU run: its device memory is the host's (memory.host_peak_bytes)"
    assert startup["worker_to_first_step_s"] > startup["first_step_s"] > 0 and startup["trials"] == 1
    assert (spent["joules"] is None) == bool(spent.get("reason"))


def assert_onednn_read_back(bf16: dict) -> None:
    """What a framework's oneDNN ran a bf16 convolution with, as its own verbose log says: on a CPU
    with native bf16 a bf16 kernel (AMX where the CPU has it) and no emulation warning."""
    from accelbench.environments.machine import cpu_flags
    from accelbench.plugins.shared.cpu_features import onednn_ceiling

    flags, settings = cpu_flags(), bf16["settings"]
    emulated = [w for w in bf16["warnings"] if "emulated" in w]
    if not flags & {"avx512_bf16", "amx_bf16"} or onednn_ceiling():
        return  # told by the tests of emulation
    kernel, isa = settings["onednn_convolution"], settings["onednn_isa"]
    assert "bfloat16" in isa and ("amx" in kernel if "amx_bf16" in flags else "bf16" in kernel), (kernel, isa)
    assert emulated == [], bf16["warnings"]


def assert_emulated_under_plain_avx512(record: dict, framework: str) -> None:
    """A bf16 record run under a oneDNN ceiling of plain AVX-512: oneDNN's own log says it ran its
    bf16 convolution in emulation (whatever the CPU has beyond that ceiling), and the record warns
    of exactly that, from what oneDNN ran."""
    assert record["status"] == "ok", record["reason"]
    kernel, isa = record["settings"]["onednn_convolution"], record["settings"]["onednn_isa"]
    assert kernel.endswith(":avx512_core"), kernel
    assert "bfloat16" not in isa and "AMX" not in isa, isa
    assert [w for w in record["warnings"] if "emulated" in w] == [
        f"bf16 is emulated: {framework}'s oneDNN ran its bf16 convolution with {kernel!r} on {isa!r} (read back "
        "from oneDNN), without bf16 instructions; the figure measures the emulation"
    ]


def assert_measured_huge_pages(record: dict, measured: bool) -> None:
    """A plugin that measured its allocator faster in transparent huge pages
    (``BackendInfo.huge_pages``) runs with them where this machine can give them, and its worker's
    memory is in them; any other runs with its allocator not asked for them."""
    from accelbench.execution import allocators

    expected = "on" if measured and allocators.huge_pages_problem(record["config"]["allocator"]) is None else "off"
    assert record["config"]["huge_pages"] == expected, record["config"]
    assert record["settings"]["huge_pages"].startswith(f"{expected} ("), record["settings"]["huge_pages"]
    if expected == "on":
        assert record["trials"][0]["process"]["anon_huge_pages_bytes"] > 0, record["trials"][0]["process"]
    # off asserts no figure: a framework may mark memory of its own for huge pages (a jax_flax
    # worker had 2 MiB of them with its allocator not asked); the held-memory test checks off


def assert_measured_allocator(record: dict, name: str) -> None:
    """A plugin's measured allocator (``BackendInfo.allocator``) ran when this machine has it;
    otherwise the system's malloc ran and the record warns that it is missing."""
    from accelbench.execution import allocators

    mapped, chosen = record["settings"]["allocator"], record["config"]["allocator"]
    if allocators.installed(name):
        assert mapped.startswith(f"{name} (/") and chosen == name, (mapped, chosen)
    else:
        assert mapped.startswith("system") and chosen == "system", (mapped, chosen)
        assert any(f"ran fastest with {name}" in w for w in record["warnings"]), record["warnings"]


def loss_falls(losses: list[float], window: int = 5, factor: float = 0.7) -> bool:
    first, last = losses[:window], losses[-window:]
    return sum(last) / window < factor * sum(first) / window


def worker_pids(host: int) -> set[int]:
    """The accelbench worker processes whose parent is ``host``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == host and b"accelbench.execution.worker_main" in cmdline:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def interrupt_as_from_a_terminal() -> None:
    # a shell starts a background job (a CI script's `pytest &`) with SIGINT ignored, which its
    # children inherit: the host would never see the Ctrl-C these tests send
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_with_a_hang(testplugins_path, tmp_path) -> tuple[subprocess.Popen, Path, set[int]]:
    out = tmp_path / "r.json"
    (tmp_path / "tmp").mkdir()  # the workers' logs go to the host's temp folder
    env = dict(os.environ, PYTHONPATH=str(testplugins_path), TMPDIR=str(tmp_path / "tmp"))
    # interleaved trials: the sleepy trial finishes (a record is written) before the hanging one
    # starts, where lockstep would open both in one pair
    host = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "accelbench",
            "run",
            "--backend",
            "sleepy:fixed-time",
            "--backend",
            "misbehaving:hangs",
            "--schedule",
            "interleaved",
            "--warmup-steps",
            "1",
            "--timed-steps",
            "3",
            "--timeout",
            "120",
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
    deadline, workers = time.monotonic() + 60, set()
    while time.monotonic() < deadline and not (out.exists() and workers):
        workers = worker_pids(host.pid) if out.exists() else set()
        time.sleep(0.1)
    assert workers, "the hanging backend's worker never started"
    return host, out, workers
