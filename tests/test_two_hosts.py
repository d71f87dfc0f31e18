"""A real two-host run on one machine: two network namespaces joined by a veth pair, each with an
address of its own (10.77.0.0/24, which exists only inside them) and a hostname of its own,
``accelbench worker`` started in each exactly as a cluster launcher starts one per host, then
``accelbench merge``. PyTorch DDP runs two workers per host (``--local-workers 2``), TensorFlow's
MultiWorkerMirroredStrategy one. Where the kernel or the user refuses namespaces, the tests skip
with the reason.

The recipe by hand (as root)::

    ip netns add host-a; ip netns add host-b
    ip link add veth-a type veth peer name veth-b
    ip link set veth-a netns host-a; ip link set veth-b netns host-b
    ip -n host-a addr add 10.77.0.1/24 dev veth-a; ip -n host-b addr add 10.77.0.2/24 dev veth-b
    ip -n host-a link set veth-a up; ip -n host-b link set veth-b up  # and lo in each
    ip netns exec host-a accelbench worker --rank 0 --local-workers 2 --workers 4 \\
        --coordinator 10.77.0.1:29500 --host 10.77.0.1 --plugin torch_ref ... -o a.json
    ip netns exec host-b accelbench worker --rank 2 --local-workers 2 --workers 4 \\
        --coordinator 10.77.0.1:29500 --host 10.77.0.2 --plugin torch_ref ... -o b.json
    accelbench merge a.json b.json -o job.json
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

NETWORK = "10.77.0.{}"
COORDINATOR_PORT = 29531
SMALL = [
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
    "3",
    "--threads",
    "1",
    "--timeout",
    "240",
]


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    """[(namespace, address, hostname)] of two hosts joined by a veth pair; removed after."""
    if not sys.platform.startswith("linux") or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("two hosts on one machine need Linux, iproute2's ip and util-linux's unshare")
    tag = f"{os.getpid() % 100000}"
    hosts = [
        (f"ab-a{tag}", NETWORK.format(1), f"host-a{tag}", f"veth-a{tag}"),
        (f"ab-b{tag}", NETWORK.format(2), f"host-b{tag}", f"veth-b{tag}"),
    ]
    steps = [
        ("netns", "add", hosts[0][0]),
        ("netns", "add", hosts[1][0]),
        ("link", "add", hosts[0][3], "type", "veth", "peer", "name", hosts[1][3]),
    ]
    for namespace, address, _, veth in hosts:
        steps += [
            ("link", "set", veth, "netns", namespace),
            ("-n", namespace, "addr", "add", f"{address}/24", "dev", veth),
            ("-n", namespace, "link", "set", veth, "up"),
            ("-n", namespace, "link", "set", "lo", "up"),
        ]
    try:
        for step in steps:
            done = ip(*step)
            if done.returncode != 0:
                pytest.skip(f"the kernel refused a network namespace setup (ip {' '.join(step)}): {done.stderr.strip()}")
        yield [(namespace, address, hostname) for namespace, address, hostname, _ in hosts]
    finally:
        for namespace, *_ in hosts:
            ip("netns", "del", namespace)


def on_host(host, *args: str, cwd) -> subprocess.Popen:
    """``accelbench worker`` inside a host's namespace, under its own hostname (a UTS namespace)."""
    namespace, _, hostname = host
    command = [
        "ip",
        "netns",
        "exec",
        namespace,
        "unshare",
        "--uts",
        "sh",
        "-c",
        'hostname "$0" && exec "$@"',
        hostname,
        sys.executable,
        "-m",
        "accelbench",
        "worker",
        *args,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)


def finished(processes):
    outputs = [p.communicate(timeout=400) for p in processes]
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0, out + err[-3000:]


def merged(accelbench_cli, tmp_path, files):
    out = tmp_path / "job.json"
    done = accelbench_cli("merge", *map(str, files), "-o", str(out))
    assert done.returncode == 0, done.stderr
    [record] = json.loads(out.read_text())["records"]
    return record


def listening(port: int, namespace: str | None = None) -> bool:
    """Whether a TCP socket listens on ``port`` in a namespace (this test's own when None)."""
    read = ["ip", "netns", "exec", namespace, "cat"] if namespace else ["cat"]
    tables = subprocess.run([*read, "/proc/net/tcp", "/proc/net/tcp6"], capture_output=True, text=True).stdout
    rows = (line.split() for line in tables.splitlines()[1:])
    return any(len(row) > 3 and row[1].endswith(f":{port:04X}") and row[3] == "0A" for row in rows)


def sockets_stay_inside(namespace: str, port: int, within_s: float = 60) -> bool:
    """Once the job's coordinator listens inside its host's namespace, nothing listens on that
    port in this test's (the machine's) namespace."""
    deadline = time.monotonic() + within_s
    while not listening(port, namespace):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return not listening(port)


@pytest.mark.framework
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch not installed")
def test_pytorch_ddp_over_two_hosts_with_two_workers_each(two_hosts, accelbench_cli, tmp_path):
    a, b = two_hosts
    common = [
        "--plugin",
        "torch_ref",
        "--workers",
        "4",
        "--local-workers",
        "2",
        "--coordinator",
        f"{a[1]}:{COORDINATOR_PORT}",
        *SMALL,
    ]
    ranks = [
        on_host(a, *common, "--rank", "0", "--host", a[1], "-o", str(tmp_path / "a.json"), cwd=tmp_path),
        on_host(b, *common, "--rank", "2", "--host", b[1], "-o", str(tmp_path / "b.json"), cwd=tmp_path),
    ]
    assert sockets_stay_inside(a[0], COORDINATOR_PORT)
    finished(ranks)
    record = merged(accelbench_cli, tmp_path, [tmp_path / "a.json", tmp_path / "b.json"])
    assert record["status"] == "ok", record["reason"]
    distributed = record["distributed"]
    assert distributed["engine"] == "torch_distributed" and distributed["workers"] == 4
    assert distributed["hosts"] == [a[2], b[2]]
    rows = distributed["per_worker"]
    assert [(w["rank"], w["host"], w["local_rank"]) for w in rows] == [(0, a[2], 0), (1, a[2], 1), (2, b[2], 0), (3, b[2], 1)]
    assert len({w["final"]["weights_checksum"] for w in rows}) == 1  # one model, all-reduced across hosts
    assert record["throughput"]["images"] == 4 * 2 * 3
    assert distributed["network"].startswith("the host's network (a multi-host job")


@pytest.mark.framework
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")
def test_tensorflow_multi_worker_over_two_hosts(two_hosts, accelbench_cli, tmp_path):
    a, b = two_hosts
    peers = f"{a[1]}:{COORDINATOR_PORT},{b[1]}:{COORDINATOR_PORT}"
    common = [
        "--plugin",
        "tf_benchmarks",
        "--workers",
        "2",
        "--coordinator",
        f"{a[1]}:{COORDINATOR_PORT}",
        "--peers",
        peers,
        *SMALL,
    ]
    ranks = [
        on_host(a, *common, "--rank", "0", "--host", a[1], "-o", str(tmp_path / "a.json"), cwd=tmp_path),
        on_host(b, *common, "--rank", "1", "--host", b[1], "-o", str(tmp_path / "b.json"), cwd=tmp_path),
    ]
    finished(ranks)
    record = merged(accelbench_cli, tmp_path, [tmp_path / "a.json", tmp_path / "b.json"])
    assert record["status"] == "ok", record["reason"]
    distributed = record["distributed"]
    assert distributed["hosts"] == [a[2], b[2]] and distributed["workers"] == 2
    rows = distributed["per_worker"]
    assert rows[0]["final"]["weights_checksum"] == rows[1]["final"]["weights_checksum"]
