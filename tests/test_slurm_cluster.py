"""A real Slurm cluster, started by the test: Debian's slurm-wlm (``slurmctld`` and two
``slurmd``), munge for authentication, each node in a network namespace of its own with its own
address and hostname (as ``test_two_hosts.py`` makes them). Through it: ``srun accelbench worker``
with no rank flags for PyTorch DDP (two nodes x two tasks) and TensorFlow multi-worker (two
nodes); ``accelbench run --slurm``; a cancelled job; the script ``accelbench slurm-script`` prints,
submitted by hand. Where a package is missing or the kernel refuses a namespace, the tests skip
and say why; the daemons' logs are kept in the test's folder and shown when a step fails.

``.ci/run`` installs the packages (``apt-get install slurmctld slurmd slurm-client munge``).
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

NETWORK = "10.78.0.{}"
NODES = ("host-a", "host-b")
SMALL = [
    "--model", "resnet_small", "--image-size", "16", "--num-classes", "10", "--per-device-batch", "2",
    "--warmup-steps", "1", "--timed-steps", "3", "--threads", "1", "--timeout", "240",
]  # fmt: skip
DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo", "scancel")
PACKAGES = "apt-get install slurmctld slurmd slurm-client munge"

pytestmark = [pytest.mark.slow]


def _missing() -> list[str]:
    return [tool for tool in DAEMONS if shutil.which(tool) is None]


needs_slurm = pytest.mark.skipif(bool(_missing()), reason=f"Slurm and munge are not installed ({PACKAGES})")


def torch_on_slurm(test):
    """A test of PyTorch workers on the cluster."""
    no_torch = importlib.util.find_spec("torch") is None
    return needs_slurm(pytest.mark.torch(pytest.mark.skipif(no_torch, reason="PyTorch not installed")(test)))


@dataclass
class Cluster:
    folder: Path
    conf: Path
    namespace: str
    processes: list[subprocess.Popen]

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, timeout: float = 400, check: bool = True) -> subprocess.CompletedProcess:
        """A command on host-a, the cluster's login node, where srun and sbatch are run from."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.namespace, *args],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.folder,
            timeout=timeout,
        )
        if check:
            assert done.returncode == 0, f"{' '.join(args[:3])}: {done.stdout[-2000:]}{done.stderr[-3000:]}\n{self.logs()}"
        return done

    def logs(self) -> str:
        """The daemons' logs (kept in the test's folder), for a failed step's message."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.folder.glob("*.log")))


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def _conf(folder: Path, namespaces: list[str]) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeAddr={NETWORK.format(i + 1)} CPUs={os.cpu_count()} State=UNKNOWN" for i, name in enumerate(NODES)
    )
    return f"""ClusterName=accelbench
SlurmctldHost={NODES[0]}({NETWORK.format(1)})
AuthType=auth/munge
AuthInfo=socket={folder}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
MinJobAge=600
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _in_node(namespace: str, hostname: str, command: list[str], log: Path) -> subprocess.Popen:
    """A daemon on a node: its network namespace, and a hostname of its own (a UTS namespace)."""
    return subprocess.Popen(
        ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *command],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = _missing()
    if missing:
        pytest.skip(f"Slurm and munge are not installed (missing {', '.join(missing)}: {PACKAGES})")
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        pytest.skip("a cluster on one machine needs Linux namespaces (iproute2's ip, util-linux's unshare)")
    folder = tmp_path_factory.mktemp("slurm")
    folder.chmod(0o755)  # munge's socket must be reachable by every daemon
    tag = f"{os.getpid() % 100000}"
    namespaces = [f"sl-{name[-1]}{tag}" for name in NODES]
    veths = [f"vs{name[-1]}{tag}" for name in NODES]
    processes: list[subprocess.Popen] = []
    etc = [Path("/etc/netns") / ns for ns in namespaces]
    try:
        _network(namespaces, veths, etc)
        processes.append(_munged(folder))
        conf = folder / "slurm.conf"
        conf.write_text(_conf(folder, namespaces))
        # cgroup v1's hierarchy is what this machine mounts; the test's tasks need no cgroup limits
        (folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        (folder / "state").mkdir()
        for name in NODES:
            (folder / f"spool-{name}").mkdir()
        processes.append(_in_node(namespaces[0], NODES[0], ["slurmctld", "-D", "-f", str(conf)], folder / "slurmctld.out.log"))
        for namespace, name in zip(namespaces, NODES):
            slurmd = ["slurmd", "-D", "-N", name, "-f", str(conf)]
            processes.append(_in_node(namespace, name, slurmd, folder / f"slurmd-{name}.out.log"))
        started = Cluster(folder, conf, namespaces[0], processes)
        _wait_idle(started)
        yield started
    finally:
        for process in reversed(processes):
            _stop(process)
        for namespace in namespaces:
            _ip("netns", "del", namespace)
        for path in etc:
            shutil.rmtree(path, ignore_errors=True)


def _network(namespaces: list[str], veths: list[str], etc: list[Path]) -> None:
    steps = [("netns", "add", ns) for ns in namespaces] + [("link", "add", veths[0], "type", "veth", "peer", "name", veths[1])]
    for i, (namespace, veth) in enumerate(zip(namespaces, veths)):
        steps += [
            ("link", "set", veth, "netns", namespace),
            ("-n", namespace, "addr", "add", f"{NETWORK.format(i + 1)}/24", "dev", veth),
            ("-n", namespace, "link", "set", veth, "up"),
            ("-n", namespace, "link", "set", "lo", "up"),
        ]
    for step in steps:
        done = _ip(*step)
        if done.returncode != 0:
            pytest.skip(f"the kernel refused a network namespace setup (ip {' '.join(step)}): {done.stderr.strip()}")
    # what the cluster's DNS would say: `ip netns exec` puts /etc/netns/<ns>/hosts over /etc/hosts
    hosts = "127.0.0.1 localhost\n" + "".join(f"{NETWORK.format(i + 1)} {name}\n" for i, name in enumerate(NODES))
    for path in etc:
        path.mkdir(parents=True, exist_ok=True)
        (path / "hosts").write_text(hosts)


def _munged(folder: Path) -> subprocess.Popen:
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    command = [
        "munged", "-F", "--force", f"--key-file={key}", f"--socket={folder}/munge.sock", f"--pid-file={folder}/munged.pid",
        f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=(folder / "munged.out.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 20
    while not (folder / "munge.sock").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.skip(f"munged did not start: {(folder / 'munged.out.log').read_text()[-500:]}")
        time.sleep(0.1)
    return process


def _wait_idle(cluster: Cluster, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        states = cluster.command("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split()
        if states.count("idle") == len(NODES):
            return
        if any(p.poll() is not None for p in cluster.processes):
            break
        time.sleep(0.5)
    pytest.skip(f"the Slurm daemons did not come up on this kernel:\n{cluster.logs()}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


def _merged(cluster: Cluster, folder: Path) -> dict:
    files = sorted(str(p) for p in folder.glob("rank-*.json"))
    cluster.command(sys.executable, "-m", "accelbench", "merge", *files, "-o", str(folder / "job.json"))
    [record] = json.loads((folder / "job.json").read_text())["records"]
    return record


def _srun_workers(cluster: Cluster, folder: Path, tasks_per_node: int, *args: str) -> dict:
    folder.mkdir()
    # the docs' one-liner: no rank flags, and no shell to spell each rank's file
    worker = [sys.executable, "-m", "accelbench", "worker", *args, "-o", f"{folder}/rank-{{rank}}.json"]
    cluster.command("srun", f"--nodes={len(NODES)}", f"--ntasks-per-node={tasks_per_node}", *worker)
    return _merged(cluster, folder)


def _check_slurm_launcher(record: dict) -> str:
    launcher = record["distributed"]["launcher"]
    assert launcher["name"] == "slurm" and launcher["nodes"] == list(NODES) and launcher["job_id"].isdigit()
    return launcher["job_id"]


@torch_on_slurm
def test_srun_runs_pytorch_ddp_on_two_nodes_of_two_tasks_with_no_rank_flags(cluster, tmp_path):
    record = _srun_workers(cluster, tmp_path / "ddp", 2, "--plugin", "torch_ref", *SMALL)
    assert record["status"] == "ok", record["reason"]
    distributed = record["distributed"]
    assert distributed["engine"] == "torch_distributed" and distributed["workers"] == 4
    assert distributed["hosts"] == list(NODES)
    rows = distributed["per_worker"]
    assert [(w["rank"], w["host"], w["local_rank"]) for w in rows] == [
        (0, "host-a", 0),
        (1, "host-a", 1),
        (2, "host-b", 0),
        (3, "host-b", 1),
    ]
    assert len({w["final"]["weights_checksum"] for w in rows}) == 1  # one model, all-reduced across the nodes
    _check_slurm_launcher(record)


@needs_slurm
@pytest.mark.tf
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")
def test_srun_runs_tensorflow_multi_worker_on_two_nodes_with_no_peer_list(cluster, tmp_path):
    record = _srun_workers(cluster, tmp_path / "tf", 1, "--plugin", "tf_benchmarks", *SMALL)
    assert record["status"] == "ok", record["reason"]
    distributed = record["distributed"]
    assert distributed["engine"] == "tf_config" and distributed["hosts"] == list(NODES)
    rows = distributed["per_worker"]
    assert [(w["rank"], w["host"]) for w in rows] == [(0, "host-a"), (1, "host-b")]
    assert rows[0]["final"]["weights_checksum"] == rows[1]["final"]["weights_checksum"]
    _check_slurm_launcher(record)


@torch_on_slurm
def test_run_slurm_submits_follows_and_writes_the_merged_record_with_the_job_id(cluster, tmp_path):
    out = tmp_path / "job.json"
    done = cluster.command(
        sys.executable, "-m", "accelbench", "run", "--slurm", "--nodes", "2", "--tasks-per-node", "1",
        "--plugin", "torch_ref", *SMALL, "--job-dir", str(tmp_path / "shared"), "-o", str(out),
    )  # fmt: skip
    [record] = json.loads(out.read_text())["records"]
    assert record["status"] == "ok", record["reason"]
    job_id = _check_slurm_launcher(record)
    assert f"Slurm job {job_id} COMPLETED" in done.stdout
    assert record["distributed"]["workers"] == 2 and record["distributed"]["hosts"] == list(NODES)
    assert (tmp_path / "shared" / f"slurm-{job_id}.out").exists()


@torch_on_slurm
def test_a_cancelled_job_is_a_failed_record_with_slurms_state(cluster, tmp_path):
    out = tmp_path / "job.json"
    long = [a for a in SMALL if a not in ("--timed-steps", "3")] + ["--time", "5m"]  # still running when cancelled
    command = [
        "ip", "netns", "exec", cluster.namespace, sys.executable, "-m", "accelbench", "run", "--slurm", "--nodes", "2",
        "--plugin", "torch_ref", *long, "--job-dir", str(tmp_path / "shared"), "-o", str(out),
    ]  # fmt: skip
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env())
    deadline = time.monotonic() + 120
    while not list((tmp_path / "shared").glob("slurm-*.out")) and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.5)
    assert run.poll() is None, run.communicate()
    [log] = list((tmp_path / "shared").glob("slurm-*.out"))
    job_id = log.stem.split("-")[1]
    cluster.command("scancel", job_id)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 1 and out.exists(), stdout + stderr
    [record] = json.loads(out.read_text())["records"]
    assert record["status"] == "failed" and f"Slurm job {job_id} CANCELLED" in record["reason"], record["reason"]


@torch_on_slurm
def test_the_printed_script_submitted_by_hand_merges_the_job(cluster, tmp_path):
    shared = tmp_path / "shared"
    printed = cluster.command(
        sys.executable, "-m", "accelbench", "slurm-script", "--nodes", "2", "--plugin", "torch_ref", *SMALL,
        "--job-dir", str(shared),
    )  # fmt: skip
    script = tmp_path / "job.sbatch"
    script.write_text(printed.stdout)
    assert "#SBATCH --nodes=2" in printed.stdout and "srun " in printed.stdout
    cluster.command("sbatch", "--wait", str(script))
    [record] = json.loads((shared / "job.json").read_text())["records"]
    assert record["status"] == "ok", record["reason"]
    _check_slurm_launcher(record)


@needs_slurm
@pytest.mark.parametrize("nodelist", ["node[01-04,07]", "gpu[7,9]", "rack[1-2]-n[01-02]", "a,b[1-3],c", "n[001-003]"])
def test_node_lists_expand_as_slurms_own_scontrol_expands_them(cluster, nodelist):
    from accelbench.planning import launchers

    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": "1"}
    theirs = cluster.command("scontrol", "show", "hostnames", nodelist).stdout.split()
    placed = launchers.slurm(env)
    assert placed and placed.launcher.nodes == theirs
