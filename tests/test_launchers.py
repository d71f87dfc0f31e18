"""Every launcher's environment, as its documentation says it sets it, read into a rank's place
in the job (accelbench.planning.launchers); the flags over it; the refusals."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelbench.errors import UsageError
from accelbench.planning import launchers

# srun -N2 --ntasks-per-node=2 (Slurm's "OUTPUT ENVIRONMENT VARIABLES" of srun): the 4th task
SLURM_TASK = {
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NODELIST": "node[01-02]",
    "SLURM_STEP_NODELIST": "node[01-02]",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "4",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURMD_NODENAME": "node02",
    "SLURM_DISTRIBUTION": "block",
}
# torchrun --nnodes 2 --nproc-per-node 4 (torch.distributed.elastic's documented variables)
TORCHRUN = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "bench",
}
# Kubeflow's PyTorchJob, a worker replica (no torchrun inside: no LOCAL_* variables)
PYTORCHJOB = {"MASTER_ADDR": "bench-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
# mpirun -np 4 --npernode 2 (Open MPI's documented OMPI_COMM_WORLD_* variables)
OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
}
# a pod of an Indexed Job "bench" with subdomain "svc": hostname bench-2
INDEXED_JOB = {"JOB_COMPLETION_INDEX": "2", "HOSTNAME": "bench-2"}


def test_a_slurm_task_reads_its_place_and_every_peer_from_the_compressed_node_list():
    placed = launchers.resolve(SLURM_TASK, None, None, None)
    assert (placed.rank, placed.workers, placed.local_rank, placed.local_world_size) == (3, 4, 1, 2)
    port = launchers.DEFAULT_PORT + 234  # the job id modulo 1000: two jobs on a node do not collide
    assert placed.coordinator == f"node01:{port}"
    assert placed.peers() == (f"node01:{port + 1}", f"node01:{port + 2}", f"node02:{port + 1}", f"node02:{port + 2}")
    assert placed.launcher.name == "slurm" and placed.launcher.job_id == "1234"
    assert placed.launcher.nodes == ["node01", "node02"]


def test_slurm_node_lists_expand_as_slurm_expands_them():
    env = {**SLURM_TASK, "SLURM_STEP_NODELIST": "node[01-04,07]", "SLURM_STEP_TASKS_PER_NODE": "1(x5)", "SLURM_NTASKS": "5"}
    env.update(SLURM_PROCID="4", SLURM_NODEID="4", SLURM_LOCALID="0")
    placed = launchers.resolve(env, None, None, None)
    assert placed.launcher.nodes == ["node01", "node02", "node03", "node04", "node07"]
    assert [p.rpartition(":")[0] for p in placed.peers()] == placed.launcher.nodes
    assert launchers.slurm({**env, "SLURM_STEP_NODELIST": "rack[1-2]-n[01-02]"}).launcher.nodes == [
        "rack1-n01",
        "rack1-n02",
        "rack2-n01",
        "rack2-n02",
    ]


def test_a_heterogeneous_tasks_per_node_places_every_rank_on_its_node():
    env = {**SLURM_TASK, "SLURM_STEP_NODELIST": "gpu[7,9]", "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_NTASKS": "3"}
    env.update(SLURM_PROCID="2", SLURM_NODEID="1", SLURM_LOCALID="0", SLURMD_NODENAME="gpu9")
    placed = launchers.resolve(env, None, None, None)
    assert placed.local_world_size == 1
    assert [p.rpartition(":")[0] for p in placed.peers()] == ["gpu7", "gpu7", "gpu9"]
    assert len(set(placed.peers())) == 3


def test_one_slurm_task_per_node_driving_several_devices_scales_its_ranks():
    env = {**SLURM_TASK, "SLURM_NTASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}
    placed = launchers.resolve(env, None, None, None, local_workers=8)
    assert (placed.rank, placed.workers, placed.local_rank, placed.local_world_size) == (8, 16, 0, 8)
    assert len(placed.peers(8)) == 16 and len(set(placed.peers(8))) == 16


def test_a_batch_script_outside_srun_is_no_task():
    batch = {k: v for k, v in SLURM_TASK.items() if k not in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")}
    with pytest.raises(UsageError, match="the environment names none"):
        launchers.resolve(batch, None, None, None)


def test_torchrun_and_pytorchjob_give_the_master_as_coordinator():
    placed = launchers.resolve(TORCHRUN, None, None, None)
    assert (placed.rank, placed.workers, placed.local_rank, placed.local_world_size) == (5, 8, 1, 4)
    assert placed.coordinator == "10.0.0.1:29500" and placed.launcher.name == "torchrun"
    assert placed.peers() == ()  # torchrun names the master only: TensorFlow's peers are the user's to give
    job = launchers.resolve(PYTORCHJOB, None, None, None)
    assert (job.launcher.name, job.rank, job.workers, job.local_rank, job.coordinator) == (
        "pytorchjob",
        2,
        3,
        0,
        "bench-master-0:23456",
    )


def test_torchrun_inside_a_slurm_task_is_torchruns_ranks():
    placed = launchers.resolve({**SLURM_TASK, **TORCHRUN}, None, None, None)
    assert placed.launcher.name == "torchrun" and placed.rank == 5


def test_open_mpi_needs_a_coordinator_it_does_not_name():
    with pytest.raises(UsageError, match="--coordinator"):
        launchers.resolve(OPEN_MPI, None, None, None)
    placed = launchers.resolve(OPEN_MPI, None, None, "head:29500")
    assert (placed.launcher.name, placed.rank, placed.workers, placed.local_rank, placed.local_world_size) == (
        "openmpi",
        3,
        4,
        1,
        2,
    )


def test_a_kubernetes_indexed_job_names_its_pods_through_the_service():
    with pytest.raises(UsageError, match="--service"):
        launchers.resolve(INDEXED_JOB, None, 4, None)
    with pytest.raises(UsageError, match="--workers"):
        launchers.resolve(INDEXED_JOB, None, None, None, service="svc")
    placed = launchers.resolve(INDEXED_JOB, None, 4, None, service="svc")
    port = launchers.DEFAULT_PORT
    assert (placed.rank, placed.workers, placed.coordinator) == (2, 4, f"bench-0.svc:{port}")
    assert placed.peers() == tuple(f"bench-{i}.svc:{port + 1}" for i in range(4))


@pytest.mark.parametrize(
    "env, rank, workers, said",
    [
        (SLURM_TASK, 0, None, "--rank 0 contradicts SLURM_PROCID"),
        (SLURM_TASK, None, 8, "--workers 8 contradicts SLURM_NTASKS"),
        (TORCHRUN, 1, None, "--rank 1 contradicts RANK"),
        ({**SLURM_TASK, "SLURM_PROCID": "x"}, None, None, "SLURM_PROCID='x'"),
        ({**SLURM_TASK, "SLURM_PROCID": "9"}, None, None, "outside the job's 4 workers"),
        ({}, None, 2, "the environment names none"),
    ],
)
def test_a_contradiction_or_no_launcher_is_one_line(env, rank, workers, said):
    with pytest.raises(UsageError, match=said.replace("(", r"\(")):
        launchers.resolve(env, rank, workers, None)


def test_flags_that_agree_with_the_launcher_are_taken_and_flags_alone_still_work():
    placed = launchers.resolve(SLURM_TASK, 3, 4, "other:1234")
    assert placed.coordinator == "other:1234"  # a flag wins where it does not contradict
    alone = launchers.resolve({}, 1, 2, "head:29500")
    assert (alone.launcher.name, alone.rank, alone.workers, alone.coordinator) == ("flags", 1, 2, "head:29500")


@pytest.mark.parametrize(
    "extra, named",
    [({}, "the environment names none"), ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "--rank 1 contradicts SLURM_PROCID")],
)
def test_the_worker_command_refuses_in_one_line_before_any_framework(tmp_path, extra, named):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "JOB_COMPLETION")) and k != "RANK"}
    args = ["--plugin", "torch_ref", "-o", str(tmp_path / "r.json")] + (["--rank", "1"] if extra else [])
    done = subprocess.run(
        [sys.executable, "-m", "accelbench", "worker", *args],
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and named in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch not installed")
def test_torchrun_starts_the_ranks_with_no_rank_flags(tmp_path):
    """The docs' one-liner, on one node: torchrun's two processes, each an `accelbench worker`
    reading RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT from torchrun."""
    import shutil

    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    small = ["--model", "resnet_small", "--image-size", "16", "--num-classes", "10", "--per-device-batch", "2"]
    steps = ["--warmup-steps", "1", "--timed-steps", "3", "--threads", "1", "--timeout", "240"]
    done = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "-m", "accelbench", "worker", "--plugin", "torch_ref", *small, *steps,
         "-o", str(tmp_path / "rank-{rank}.json")],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    merged = subprocess.run(
        [sys.executable, "-m", "accelbench", "merge", str(tmp_path / "rank-0.json"), str(tmp_path / "rank-1.json"),
         "-o", str(tmp_path / "job.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    [record] = json.loads((tmp_path / "job.json").read_text())["records"]
    assert record["status"] == "ok", record["reason"]
    distributed = record["distributed"]
    assert distributed["launcher"]["name"] == "torchrun" and distributed["launcher"]["job_id"]
    assert [(w["rank"], w["local_rank"]) for w in distributed["per_worker"]] == [(0, 0), (1, 1)]
    assert len({w["final"]["weights_checksum"] for w in distributed["per_worker"]}) == 1
