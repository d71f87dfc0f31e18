"""Multi-worker runs on the frameworks' own engines, on loopback: merged records, identical
weights across workers, scaling efficiency, and a killed worker ending the run cleanly."""

import importlib.util
import ipaddress
import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from conftest import executed

from accelbench import launch
from accelbench.execution import multiworker, netns, runner
from accelbench.execution.processes import Worker, WorkerFailure
from accelbench.planning.config import RunConfig
from accelbench.records.results import TrialOutcome
from accelbench.registry import PluginHost

HAS = {
    "tf_benchmarks": importlib.util.find_spec("tensorflow") is not None,
    "mxnet_ngc": importlib.util.find_spec("mxnet") is not None,
    "torch_ref": importlib.util.find_spec("torch") is not None,
}
BACKENDS = [pytest.param(name, marks=pytest.mark.skipif(not HAS[name], reason=f"{name}'s framework missing")) for name in HAS]
#: the thumbnail ResNet: merging, weights in sync, loopback and a killed rank do not depend on the
#: model, and it builds in a fraction of ResNet-50's time
TINY = dict(model="resnet_small", image_size=16, num_classes=10, warmup_steps=2, timed_steps=6, timeout_s=240)


def test_a_plan_never_gets_one_port_twice():
    # closed at once, a port can come back from the next bind: CI once planned two workers on one
    with launch.distinct_free_ports() as free_port:
        ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_local_plans_use_loopback_and_free_ports(tmp_path):
    # the engines are the plugins' (core names none); neither module imports its framework
    from accelbench.plugins.mxnet_ngc.engine import DmlcPsEngine
    from accelbench.plugins.shared.tf_common import TfConfigEngine
    from accelbench.plugins.torch_ref import TorchDistributedEngine

    tf = launch.plan_local(TfConfigEngine(), 2, str(tmp_path))
    configs = [json.loads(env["TF_CONFIG"]) for env in tf.worker_envs]
    assert [c["task"]["index"] for c in configs] == [0, 1]
    addresses = configs[0]["cluster"]["worker"]
    assert len(set(addresses)) == 2 and all(a.startswith("127.0.0.1:") for a in addresses)
    torch = launch.plan_local(TorchDistributedEngine(), 2, str(tmp_path))
    ranks = [(env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) for env in torch.worker_envs]
    assert ranks == [("0", "2", "0"), ("1", "2", "1")]
    for env in torch.worker_envs:  # nothing beyond loopback: gloo on lo, rendezvous through a file
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["GLOO_SOCKET_IFNAME"] == "lo"
        assert env["ACCELBENCH_TORCH_INIT_METHOD"] == torch.worker_envs[0]["ACCELBENCH_TORCH_INIT_METHOD"]
        assert env["ACCELBENCH_TORCH_INIT_METHOD"].startswith(f"file://{tmp_path}/")  # removed with the trial
    mx = launch.plan_local(DmlcPsEngine(), 2, str(tmp_path))
    assert [role for role, _ in mx.services] == ["scheduler", "server"]
    for env in mx.worker_envs + [env for _, env in mx.services]:
        assert env["DMLC_PS_ROOT_URI"] == env["DMLC_NODE_HOST"] == "127.0.0.1" and env["DMLC_INTERFACE"] == "lo"
        assert env["DMLC_NUM_WORKER"] == "2" and env["DMLC_NUM_SERVER"] == "1"


@pytest.mark.framework
@pytest.mark.parametrize("plugin", BACKENDS)
def test_two_workers_merge_into_one_record_with_identical_weights(plugin, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the host makes the job's scratch directory
    refs = PluginHost().select([plugin])
    baseline, merged = executed(runner.plan(refs, RunConfig(workers=2, per_device_batch=4, **TINY)))
    assert baseline["status"] == merged["status"] == "ok", merged["reason"]
    assert baseline["config"]["workers"] == 1 and baseline["batch"]["global"] == 4
    dist = merged["distributed"]
    assert dist["workers"] == 2 and dist["per_worker_batch"] == 4
    assert dist["network"] == netns.ISOLATED or dist["network"].startswith("the host's network (no private")
    if plugin == "tf_benchmarks":  # the coordination service waits for heartbeats as long as the run
        assert merged["settings"]["coordination_heartbeat_timeout_s"] == TINY["timeout_s"]
    assert merged["batch"]["global"] == 2 * dist["per_worker_batch"] == 8
    checksums = [w["final"]["weights_checksum"] for w in dist["per_worker"]]
    assert checksums[0] == checksums[1]
    slowest = max(w["wall_time_s"] for w in dist["per_worker"])
    assert merged["throughput"]["images"] == sum(w["images"] for w in dist["per_worker"]) == 8 * 6
    assert merged["throughput"]["images_per_sec"] == pytest.approx(48 / slowest)
    assert dist["baseline_images_per_sec"] == baseline["throughput"]["images_per_sec"]
    assert dist["scaling_efficiency"] == pytest.approx(
        merged["throughput"]["images_per_sec"] / (2 * baseline["throughput"]["images_per_sec"])
    )
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []  # no directory of the job's left behind


@pytest.mark.framework
@pytest.mark.parametrize("plugin", [p for p in BACKENDS if p.values[0] == "torch_ref"])
def test_a_jobs_scratch_directory_goes_with_its_trial_even_a_failed_one(plugin, tmp_path, monkeypatch):
    # a killed PyTorch worker leaves its rendezvous file behind; the host removes the directory anyway
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = []

    def killed_trial(ref, config, plan, *args, **kwargs):
        store = Path(plan.worker_envs[0]["ACCELBENCH_TORCH_INIT_METHOD"].removeprefix("file://"))
        store.write_text("a store nobody removed")
        left.append(store)
        return [TrialOutcome("failed", "worker rank 1: killed by SIGKILL") for _ in plan.worker_envs]

    monkeypatch.setattr(multiworker, "run_trial", killed_trial)
    refs = PluginHost().select([plugin])
    _, merged = executed(runner.plan(refs, RunConfig(workers=2, per_device_batch=4, **TINY)))
    assert merged["status"] == "failed" and "killed by SIGKILL" in merged["reason"]
    assert left and left[0].parent.parent == tmp_path and not left[0].parent.exists()


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket listening in the process's network namespace."""
    found = set()
    for name in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{name}") as fh:
            for line in fh.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A":  # LISTEN
                    address, port = local.split(":")
                    raw = bytes.fromhex(address)
                    # /proc shows each 32-bit word in host (little-endian) order
                    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                    found.add((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def _interfaces(pid: int) -> set[str]:
    with open(f"/proc/{pid}/net/dev") as fh:
        return {line.split(":")[0].strip() for line in fh.readlines()[2:]}


@pytest.mark.framework
@pytest.mark.parametrize("plugin", BACKENDS)
def test_nothing_a_local_run_opens_is_reachable_beyond_loopback(plugin, tmp_path):
    """TensorFlow's gRPC server binds 0.0.0.0 whatever TF_CONFIG says; in the run's private
    namespace the only interface is loopback, so no engine is reachable from another machine."""
    from accelbench.execution import netns

    namespace, network = netns.start()
    if namespace is None:
        pytest.skip(network)
    [ref] = PluginHost().select([plugin])
    [item] = runner.plan([ref], RunConfig(workers=2, per_device_batch=2, scaling_baseline=False, **{**TINY, "timed_steps": 12}))
    started, seen = [], {}

    def look(phase, done, total):
        for process in started[0]:
            if process.process.poll() is None and process.process.pid not in seen:
                pid = process.process.pid
                seen[pid] = (_listening(pid), _interfaces(pid), os.readlink(f"/proc/{pid}/ns/net"))

    try:
        outcomes = multiworker.run_trial(
            ref,
            item.config,
            launch.plan_local(ref.backend.engine, 2, str(tmp_path)),
            on_progress=look,
            on_started=started.append,
            launcher=namespace.launcher(),
        )
    finally:
        namespace.close()
    assert all(o.status == "ok" for o in outcomes), outcomes[0].reason
    assert len(seen) == len(started[0])  # every worker and service looked at while it ran
    for listening, interfaces, namespace_id in seen.values():
        assert namespace_id != os.readlink("/proc/self/ns/net")
        exposed = {(a, port) for a, port in listening if not ipaddress.ip_address(a).is_loopback}
        assert not exposed or interfaces == {"lo"}, (exposed, interfaces)


@pytest.mark.framework
@pytest.mark.skipif(not HAS["tf_benchmarks"], reason="TensorFlow missing")
def test_tensorflow_two_workers_survive_a_cpu_hog():
    """Both workers saturating the cores beside a busy loop once missed TensorFlow's 10 s
    coordination heartbeat ("heartbeat timeout" UNAVAILABLE): ResNet-50, whose steps hold the
    cores as that run's did."""
    import subprocess
    import sys

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        refs = PluginHost().select(["tf_benchmarks"])
        [record] = executed(
            runner.plan(
                refs,
                RunConfig(
                    workers=2,
                    per_device_batch=2,
                    scaling_baseline=False,
                    **{**TINY, "model": "resnet50", "image_size": 32, "timed_steps": 4},
                ),
            )
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert record["status"] == "ok", record["reason"]
    assert record["settings"]["coordination_heartbeat_timeout_s"] == TINY["timeout_s"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie has exited; only its parent's wait is missing
        return fh.read().split()[2] != "Z"


@pytest.mark.framework
@pytest.mark.parametrize("plugin", BACKENDS)
def test_a_killed_worker_fails_the_run_fast_and_leaves_no_process(plugin, tmp_path):
    [ref] = PluginHost().select([plugin])
    [item] = runner.plan([ref], RunConfig(workers=2, per_device_batch=2, scaling_baseline=False, **{**TINY, "timed_steps": 200}))
    started: list = []

    killed: list[float] = []

    def kill_rank_1(phase, done, total):
        if started and started[0][1].process.poll() is None:
            started[0][1].process.kill()
            killed.append(time.monotonic())

    outcomes = multiworker.run_trial(
        ref,
        item.config,
        launch.plan_local(ref.backend.engine, 2, str(tmp_path)),
        on_progress=kill_rank_1,
        on_started=started.append,
    )
    # fast: the peer blocked in its collective is killed, and so are MXNet's parameter server and
    # scheduler, which would wait for the dead worker (not given the grace a completed job's get)
    assert killed and time.monotonic() - killed[0] < multiworker.SERVICE_EXIT_GRACE_S / 2
    assert all(o.status == "failed" for o in outcomes)
    assert "worker rank 1" in outcomes[0].reason and "killed by SIGKILL" in outcomes[0].reason
    assert not any(_alive(w.process.pid) for w in started[0])


def test_a_workers_error_names_the_peer_whose_death_it_noticed(testplugins_path, monkeypatch):
    """A collective reading from a killed peer fails at once, sometimes before the host has read
    that peer's end (CI once named the surviving rank 0's gloo read error as the cause)."""
    monkeypatch.syspath_prepend(str(testplugins_path))
    [ref] = PluginHost().select(backends=["sleepy:fixed-time"])
    [item] = runner.plan([ref], RunConfig(scaling_baseline=False))
    workers = [Worker(ref, item.config, label=f"rank{rank}") for rank in range(2)]
    try:
        noticed = WorkerFailure("failed", "worker rank 0: RuntimeError: Read error [127.0.0.1]")
        began = time.monotonic()
        assert multiworker._root_cause(noticed, workers[0], list(enumerate(workers))) is noticed  # no peer died
        assert time.monotonic() - began >= multiworker.PEER_DEATH_WAIT_S
        workers[1].process.kill()
        cause = multiworker._root_cause(noticed, workers[0], list(enumerate(workers))).reason
        assert cause.startswith("worker rank 1: process died during") and "killed by SIGKILL" in cause
        assert cause.endswith("; then worker rank 0: RuntimeError: Read error [127.0.0.1]")
    finally:
        for worker in workers:
            worker.close()


def test_a_backend_without_an_engine_is_unavailable_for_several_workers(testplugins_path, monkeypatch):
    monkeypatch.syspath_prepend(str(testplugins_path))
    refs = PluginHost().select(backends=["sleepy:fixed-time"])
    [record] = executed(runner.plan(refs, RunConfig(workers=2, scaling_baseline=False)))
    assert record["status"] == "unavailable" and "no multi-worker engine" in record["reason"]


@pytest.mark.framework
@pytest.mark.parametrize("plugin", BACKENDS)
def test_cluster_ranks_started_separately_then_merged(plugin, accelbench_cli, tmp_path):
    """What a cluster scheduler does, on loopback: one `accelbench worker` per rank, then merge."""
    import subprocess
    import sys

    with launch.distinct_free_ports() as free_port:
        ports = [free_port() for _ in range(2)]
    common = [
        "worker",
        "--plugin",
        plugin,
        "--workers",
        "2",
        "--coordinator",
        f"127.0.0.1:{ports[0]}",
        "--peers",
        ",".join(f"127.0.0.1:{p}" for p in ports),
        "--host",
        "127.0.0.1",
        "--model",
        "resnet_small",
        "--image-size",
        "16",
        "--num-classes",
        "10",
        "--per-device-batch",
        "2",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "4",
        "--threads",
        "1",
        "--timeout",
        "240",
    ]
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "accelbench", *common, "--rank", str(r), "-o", str(tmp_path / f"rank{r}.json")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for r in range(2)
    ]
    for proc in ranks:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out + err
    merged = tmp_path / "merged.json"
    result = accelbench_cli("merge", str(tmp_path / "rank0.json"), str(tmp_path / "rank1.json"), "-o", str(merged))
    assert result.returncode == 0, result.stderr
    [record] = json.loads(merged.read_text())["records"]
    rows = record["distributed"]["per_worker"]
    assert [w["rank"] for w in rows] == [0, 1]
    assert rows[0]["final"]["weights_checksum"] == rows[1]["final"]["weights_checksum"]
    assert record["throughput"]["images"] == 2 * 2 * 4
    assert record["throughput"]["wall_time_s"] == max(w["wall_time_s"] for w in rows)
    missing = accelbench_cli("merge", str(tmp_path / "rank0.json"), "-o", str(tmp_path / "bad.json"))
    assert missing.returncode == 2 and "one record per rank 0..1" in missing.stderr


def test_a_host_with_several_workers_runs_consecutive_ranks_each_with_its_local_rank():
    """``accelbench worker --rank 2 --local-workers 2 --workers 4``: ranks 2 and 3 on this host, as
    torchrun numbers them; only the host of rank 0 starts the engine's services."""
    from accelbench.plugins.mxnet_ngc.engine import DmlcPsEngine
    from accelbench.plugins.torch_ref import TorchDistributedEngine

    second = launch.ClusterRank(2, 4, "10.0.0.1:29500", node_host="10.0.0.2", local_workers=2)
    plan = launch.plan_host(TorchDistributedEngine(), second)
    assert plan.workers == 4 and plan.services == []
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["WORLD_SIZE"]) for e in plan.worker_envs] == [
        ("2", "0", "2", "4"),
        ("3", "1", "2", "4"),
    ]
    first = launch.ClusterRank(0, 4, "10.0.0.1:9091", node_host="10.0.0.1", local_workers=2)
    assert [role for role, _ in launch.plan_host(DmlcPsEngine(), first).services] == ["scheduler", "server"]
    assert (
        launch.plan_host(
            DmlcPsEngine(), launch.ClusterRank(2, 4, "10.0.0.1:9091", node_host="10.0.0.2", local_workers=2)
        ).services
        == []
    )


def test_the_per_worker_rows_name_each_ranks_host_and_local_rank():
    from accelbench.records.results import TrialOutcome

    rows = multiworker.per_worker([TrialOutcome("failed", "x"), TrialOutcome("failed", "y")], 2, first_rank=4)
    import socket

    assert [(r.rank, r.local_rank, r.host) for r in rows] == [(4, 0, socket.gethostname()), (5, 1, socket.gethostname())]


def test_a_worker_of_a_backend_without_an_engine_is_refused_in_one_line(accelbench_cli, tmp_path):
    """Planning refuses --workers > 1 for such a backend; a job of one worker reached the engine's
    plan and died of an AttributeError (found by the type checker, 2026-12-06)."""
    out = tmp_path / "rank0.json"
    done = accelbench_cli(
        "worker",
        "--backend",
        "sleepy:fixed-time",
        "--rank",
        "0",
        "--workers",
        "1",
        "--coordinator",
        "127.0.0.1:29500",
        "-o",
        str(out),
    )
    assert done.returncode == 2 and "sleepy:fixed-time has no multi-worker engine" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
