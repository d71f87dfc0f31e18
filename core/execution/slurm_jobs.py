"""A multi-host run as one Slurm job, through Slurm's own commands (``sbatch``, ``scontrol``,
``scancel``): the batch script ``accelbench slurm-script`` prints and ``accelbench run --slurm``
submits, follows and collects.

The script runs ``srun accelbench worker`` (each task reads its rank from Slurm's environment:
``accelbench.planning.launchers``) writing one results file per rank into a folder every node
sees, then ``accelbench merge``. ``run --slurm`` merges the rank files itself, so a job that
failed or was cancelled still gives a record: failed, with Slurm's state and reason.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from accelbench.errors import UsageError
from accelbench.planning.config import RunConfig
from accelbench.records.results import Record
from accelbench.registry import BackendRef

#: Slurm's job states after which a job runs no more (``scontrol show job``'s JobState)
ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
}
POLL_S = 1.0


@dataclass(frozen=True)
class JobSpec:
    """What the batch script asks of Slurm, and what its tasks run."""

    backend: str
    nodes: int
    tasks_per_node: int
    #: the shared folder: the run config, the rank files, Slurm's output
    folder: Path
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    job_name: str = "accelbench"

    def rank_files(self) -> list[Path]:
        return sorted(self.folder.glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))


def require_slurm(flag: str) -> None:
    missing = [tool for tool in ("sbatch", "scontrol", "scancel") if shutil.which(tool) is None]
    if missing:
        raise UsageError(f"{flag} needs Slurm's {', '.join(missing)} on PATH (a login node of the cluster)")


def write_config(spec: JobSpec, config: RunConfig) -> Path:
    """The run config every task reads (``accelbench worker --config``): what was resolved here."""
    spec.folder.mkdir(parents=True, exist_ok=True)
    path = spec.folder / "config.json"
    # the launcher decides the job's size; batch_source is the planner's note, not a config key
    skipped = ("workers", "scaling_baseline", "batch_source")
    fields = {k: v for k, v in config.to_dict().items() if v is not None and k not in skipped}
    path.write_text(json.dumps(fields, indent=1) + "\n")
    return path


def script(spec: JobSpec, python: str = sys.executable) -> str:
    """The sbatch script: every task an ``accelbench worker`` with no rank flags, then the merge."""
    folder = spec.folder.absolute()
    directives = [
        f"--job-name={spec.job_name}",
        f"--nodes={spec.nodes}",
        f"--ntasks-per-node={spec.tasks_per_node}",
        f"--output={folder}/slurm-%j.out",
    ]
    directives += [f"--partition={spec.partition}"] * bool(spec.partition)
    directives += [f"--account={spec.account}"] * bool(spec.account)
    directives += [f"--time={spec.time_limit}"] * bool(spec.time_limit)
    accelbench = f"{shlex.quote(python)} -m accelbench"
    worker = (
        f"{accelbench} worker --backend {shlex.quote(spec.backend)} --config {shlex.quote(str(folder / 'config.json'))} "
        f"-o {shlex.quote(str(folder / 'rank-{rank}.json'))}"
    )
    return "\n".join(
        [
            "#!/bin/bash",
            *(f"#SBATCH {d}" for d in directives),
            "# written by accelbench: each task reads its rank, the job's size and the coordinator from Slurm",
            "set -euo pipefail",
            f"srun {worker}",
            f"{accelbench} merge {shlex.quote(str(folder))}/rank-*.json -o {shlex.quote(str(folder / 'job.json'))}",
            "",
        ]
    )


@dataclass(frozen=True)
class JobEnd:
    job_id: str
    state: str
    reason: str
    exit_code: str

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"

    def describe(self) -> str:
        why = "" if self.reason in ("", "None") else f", reason {self.reason}"
        return f"Slurm job {self.job_id} {self.state} (exit code {self.exit_code}{why})"


def submit(spec: JobSpec) -> str:
    """``sbatch --parsable``: the job id, or RuntimeError with what sbatch said."""
    path = spec.folder / "job.sbatch"
    path.write_text(script(spec))
    done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sbatch refused the job: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip().split(";")[0]


def state(job_id: str) -> JobEnd | None:
    """The job's state as ``scontrol show job`` gives it (None while it has not ended)."""
    done = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        return JobEnd(job_id, "UNKNOWN", f"scontrol: {done.stderr.strip()}", "?")
    fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
    current = fields.get("JobState", "UNKNOWN")
    if current not in ENDED:
        return None
    return JobEnd(job_id, current, fields.get("Reason", ""), fields.get("ExitCode", "?"))


def follow(job_id: str, timeout_s: float) -> JobEnd:
    """Wait for the job to end (``scancel`` it past ``timeout_s``, or on Ctrl-C)."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            ended = state(job_id)
            if ended:
                return ended
            if time.monotonic() > deadline:
                cancel(job_id)
                return JobEnd(job_id, "TIMEOUT", f"accelbench cancelled it after {timeout_s:.0f} s", "?")
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        cancel(job_id)
        raise


def cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=60, check=False)


def collect(spec: JobSpec, end: JobEnd, ref: BackendRef, config: RunConfig) -> Record:
    """The job's record: its ranks' files merged; failed, with Slurm's state and reason, when the
    job did not complete (the ranks' figures kept where they wrote any)."""
    from accelbench.environments import machine
    from accelbench.records import results as records
    from accelbench.records import validation

    merged, missing = None, ""
    files = spec.rank_files()
    try:
        merged = records.merge_ranks([r for path in files for r in records.read_results(path)]) if files else None
    except UsageError as exc:
        missing = f"; its rank files: {exc}"
    if merged and end.ok:
        return merged
    reason = end.describe() + (f"; {merged.reason}" if merged and merged.reason else missing)
    if merged:
        merged.status, merged.reason, merged.throughput, merged.step_time = "failed", reason, None, None
        if not validation.errors("result", merged.to_json()):
            return merged  # the ranks' own figures kept beside Slurm's reason
    if not files:
        reason += "; no rank wrote its results"
    outcome = records.TrialOutcome("failed", reason)
    return records.build(records.RunContext(ref, config, machine.collect(ref.backend.describe().requires), [outcome]))
